"""The console every command prints to."""

from __future__ import annotations

import os

from rich.console import Console

__all__ = ["wide_console"]


def wide_console(*, stderr: bool = False) -> Console:
    """A console that keeps tables readable when piped (rich defaults to 80 columns then): 150
    columns, or a wider $COLUMNS (never narrower: test runners and CI export COLUMNS=80 to children)."""
    c = Console(stderr=stderr)
    if c.is_terminal:
        return c
    cols = os.environ.get("COLUMNS", "")
    return Console(width=max(150, int(cols) if cols.isdigit() else 0), stderr=stderr)
