"""The `overdrive` command line: thin. It parses, calls the library, prints.

Errors a user can fix (bad flags, files, configs) print one line `overdrive: error: ...` and
exit 2; nothing already written is lost.
"""

from __future__ import annotations

import argparse
import json
import sys

from overdrive import __version__
from overdrive.errors import UserError


def _cmd_doctor(args: argparse.Namespace) -> int:
    from overdrive.env import get_env

    rep = get_env(refresh=True)  # the doctor always looks afresh (and refreshes the cache others use)
    if args.json:
        print(json.dumps(rep.to_dict(), indent=2))
    else:
        from overdrive.report.doctor import render_doctor

        render_doctor(rep)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="overdrive", description="Fast, verified PyTorch Transformer training: "
                                "see what this machine can run, pick the best recipe, measure it.")
    p.add_argument("--version", action="version", version=f"overdrive {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    d = sub.add_parser("doctor", help="what this machine is and which engines really work here",
                       description="Probe the platform, GPUs and optional engines (Transformer Engine, Apex, "
                                   "torchao, Liger, Triton, torch.compile, fused AdamW, SDPA). Exit code 0 even when "
                                   "engines are missing.")
    d.add_argument("--json", action="store_true", help="print the report as JSON (schema overdrive.env/1)")
    d.set_defaults(func=_cmd_doctor)

    for register in _registrars():
        register(sub)
    return p


def _registrars() -> list:
    from overdrive.commands import bench, export, plan, train

    return [bench.register, plan.register, train.register, export.register]


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except UserError as e:
        print(f"overdrive: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("overdrive: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
