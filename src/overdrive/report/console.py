"""The console every command prints to."""

from __future__ import annotations

import os

from rich.console import Console

__all__ = ["wide_console"]


def wide_console(*, stderr: bool = False) -> Console:
    """A console that keeps tables readable when piped (rich defaults to 80 columns then): 150
    columns, or what $COLUMNS says."""
    c = Console(stderr=stderr)
    return c if c.is_terminal or os.environ.get("COLUMNS", "").isdigit() else Console(width=150, stderr=stderr)
