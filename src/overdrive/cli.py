"""The `overdrive` command line: thin. It parses, calls the library, prints.

Errors a user can fix (bad flags, files, configs) print one line `overdrive: error: ...` and
exit 2; nothing already written is lost. Parsing imports no torch: the subcommands import the
library when they run. Known third-party noise is filtered while a command runs (`-v` shows it).
"""

from __future__ import annotations

import argparse
import importlib
import sys

from overdrive import __version__
from overdrive.commands import COMMANDS, HelpFormatter
from overdrive.errors import UserError

__all__ = ["build_parser", "main"]

_VERBOSE_HELP = "show third-party warnings and log lines that overdrive filters as known noise"


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad flag is refused like every other input error: one line `overdrive: error: ...` and
    exit 2 (argparse's own prints the whole usage block first, 13 lines for `plan`, burying the message)."""

    def error(self, message: str):
        where = self.prog.removeprefix("overdrive").strip()
        sys.stderr.write(f"overdrive: error: {where + ': ' if where else ''}{message} (see {self.prog} --help)\n")
        sys.exit(2)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="overdrive", formatter_class=HelpFormatter,
                                description="Fast, verified PyTorch Transformer training: see what this machine "
                                            "can run, pick the best recipe, measure it.")
    p.add_argument("--version", action="version", version=f"overdrive {__version__}")
    p.add_argument("-v", "--verbose", action="store_true", help=_VERBOSE_HELP)
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMANDS:
        importlib.import_module(f"overdrive.commands.{name}").register(sub)
    for sp in sub.choices.values():
        sp.formatter_class = HelpFormatter
        # also after the subcommand (`overdrive bench -v`); SUPPRESS keeps it from undoing `overdrive -v bench`
        sp.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help=_VERBOSE_HELP)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv:  # a first-time user typing `overdrive`: what it can do, not an error
        parser.print_help()
        return 0
    args, extra = parser.parse_known_args(argv)
    if extra:  # named against the subcommand that was given, whose help lists its flags
        sp = parser._subparsers._group_actions[0].choices[args.command]  # noqa: SLF001 (argparse has no API)
        sp.error(f"unrecognized arguments: {' '.join(extra)}")
    from overdrive.quiet import at_boundary

    try:
        with at_boundary(verbose=args.verbose):
            return int(args.func(args) or 0)
    except UserError as e:
        print(f"overdrive: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("overdrive: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
