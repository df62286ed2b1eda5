"""The error of the export path (a model that cannot be served as asked, or bad input to the export),
and how it quotes another exception: in one line, never a traceback."""

from __future__ import annotations

__all__ = ["ExportError", "first_line"]


class ExportError(RuntimeError):
    """An export that failed its round trip, or bad input to the export; the message says which."""


def first_line(e: BaseException) -> str:
    """'TypeError: the first line of its message': what a one-line error quotes of an exception."""
    return f"{type(e).__name__}: {str(e).strip().splitlines()[0][:200] if str(e).strip() else ''}"
