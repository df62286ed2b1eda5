"""`overdrive emit` — argument parsing and printing only; the work is in overdrive.emit."""

from __future__ import annotations

import argparse
import os


def print_emitted(emitted) -> None:
    """Each file written, and what its stack cannot express, one line each."""
    for e in emitted:
        print(f"wrote {e.path} ({e.stack})")
        for c in e.cannot:
            print(f"  not in {e.stack}: {c}")


def _cmd_emit(args: argparse.Namespace) -> int:
    from overdrive.emit import emit

    src = args.source
    out = args.out or (src if os.path.isdir(src) else os.path.dirname(os.path.abspath(src)))
    print_emitted(emit(src, stacks=args.stacks, out=out))
    return 0


STACKS = ("accelerate", "trainer", "torchtitan", "lightning")  # overdrive.emit.STACKS, without importing it here


def register(sub) -> None:
    p = sub.add_parser("emit", help="write a tuned recipe as Accelerate / Trainer / torchtitan / Lightning config",
                       description="The winner of `overdrive tune` (its folder or results.json: the recipe as it "
                                   "ran there, with the measured per-layer FP8 filter) or a recipe.json (resolved "
                                   "on this machine), written as each stack's own configuration. What a stack "
                                   "cannot express is printed one line each and kept in each file's header and in "
                                   "emit.json.")
    p.add_argument("source", metavar="RECIPE_OR_TUNE_DIR", help="a tune --out folder, its results.json, or a "
                   "recipe.json")
    p.add_argument("--for", dest="stacks", action="append", required=True, metavar="STACK",
                   help=f"one of {', '.join(STACKS)} (repeat it, or comma-separate)")
    p.add_argument("--out", metavar="DIR", help="where to write (default: the tune folder, or the recipe's folder)")
    p.set_defaults(func=_cmd_emit)
