"""One module per subcommand: each `register(sub)` adds its parser; the work is in the library.

Nothing here imports torch at module level: `overdrive --help` and argument errors must answer
at once (importing torch takes 2 s on a quiet host, 10-30 s on a busy one).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

__all__ = ["HelpFormatter", "late_help", "COMMANDS"]

# Subcommand modules, in the order `overdrive --help` lists them.
COMMANDS = ("doctor", "bench", "report", "plan", "train", "export", "serve", "tune", "emit")


class HelpFormatter(argparse.HelpFormatter):
    """Every command's help: shows an option's default unless it is unset/False or the text already
    gives it, and appends help that is computed only when help is shown (see `late_help`)."""

    def __init__(self, prog: str):
        super().__init__(prog, max_help_position=32, width=110)

    def _split_lines(self, text: str, width: int) -> list[str]:
        # Never wrap inside a hyphenated name (cpu-quick, fp8-rowwise): users copy them.
        import textwrap

        return textwrap.wrap(self._whitespace_matcher.sub(" ", text).strip(), width, break_on_hyphens=False)

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        late = getattr(action, "_late_help", None)
        if late is not None:
            text = f"{text} {late()}".strip().replace("%", "%%")
        shown = action.default not in (None, False, argparse.SUPPRESS) and not isinstance(action.default, list)
        if action.option_strings and shown and "default" not in text:
            text += " (default: %(default)s)"
        return text


def late_help(action: argparse.Action, fn: Callable[[], str]) -> argparse.Action:
    """Append `fn()` to the action's help when help is shown (e.g. a registry listing whose import
    would cost parsing time for every command)."""
    action._late_help = fn  # type: ignore[attr-defined]
    return action
