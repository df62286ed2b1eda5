"""`overdrive tune` — argument parsing and printing only; the work is in overdrive.tuning."""

from __future__ import annotations

import argparse
import json
import sys

from overdrive.commands.vocabulary import deprecated
from overdrive.errors import UserError


def _model(args: argparse.Namespace) -> None:
    """--model FILE.py:FACTORY or --model CONFIG (a transformers config folder or .json, as plan --model takes
    it) into factory/hf; the positional FILE.py:FACTORY and --hf CONFIG are the older spellings."""
    import os

    m = args.model
    if m is not None and args.factory is not None:
        raise UserError(f"two models: {args.factory} and --model {m}: pass one, as --model")
    if m is None:
        args.hf = None
        return
    if ".py:" in m:
        args.factory, args.hf = m, None
    elif os.path.isdir(m) or m.endswith(".json"):
        args.factory, args.hf = None, m
    else:
        raise UserError(f"--model {m!r}: pass FILE.py:FACTORY (a function returning a fresh nn.Module) or a "
                        "transformers config folder or .json")


def _cmd_tune(args: argparse.Namespace) -> int:
    _model(args)
    if not args.factory and not args.hf:
        raise UserError("pass the model as --model FILE.py:FACTORY (a function returning a fresh nn.Module), or "
                        "--model CONFIG (a transformers config folder or .json)")
    import math

    if not (args.budget_s > 0 and math.isfinite(args.budget_s)):  # nan and inf too
        raise UserError(f"--budget-s must be a positive number of seconds, got {args.budget_s:g}")
    if not (args.lr > 0 and math.isfinite(args.lr)):
        raise UserError(f"--lr must be a positive learning rate, got {args.lr:g}")
    if args.emit:
        from overdrive.emit import parse_stacks

        parse_stacks(args.emit)  # a bad stack name: one line, before the run
        if not args.out:
            raise UserError("--emit writes into the results folder: add --out DIR")
    from overdrive.track import parse_report_to

    args.report_to = parse_report_to(args.report_to)  # a missing tracker package: one line, before the run
    from overdrive.measure.procs import parent_ends_on_sigterm

    with parent_ends_on_sigterm():  # SIGTERM: the workers end with us, the --out lock is released
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    from overdrive.tuning import tune

    kw = dict(loss_fn=args.loss_fn, hf=args.hf, budget_s=args.budget_s, candidates=args.configs, out=args.out,
              seed=args.seed, lr=args.lr, threads=args.threads)
    if args.json:
        res = tune(args.factory, args.batch, progress=lambda s: print(f"tune: {s}", file=sys.stderr), **kw)
        _after(res, args, quiet=True)
        d = res.to_dict()
        d["candidates"] = [{k: v for k, v in r.items() if k != "losses"} for r in d["candidates"]]
        print(json.dumps(d, indent=2))
        return 0
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("[bold]tune[/]"), BarColumn(), TextColumn("{task.completed:.0f}/{task.total:.0f} s"),
                  TimeElapsedColumn(), TextColumn("{task.description}", markup=False), transient=True,
                  console=Console(stderr=True)) as prog:
        import time

        t0 = time.perf_counter()
        task = prog.add_task("probing this machine", total=args.budget_s)

        def say(s: str) -> None:
            prog.update(task, completed=min(args.budget_s, time.perf_counter() - t0), description=s[:90])

        res = tune(args.factory, args.batch, progress=say, **kw)
    _print(res)
    if args.out:
        print(f"wrote {args.out}/results.json, report.html and recipe.json "
              f"(apply it: accelerate(model, recipe=Recipe.load('{args.out}/recipe.json')))")
    _after(res, args, quiet=False)
    return 0


def _after(res, args, *, quiet: bool) -> None:
    """--emit: the winner as each stack's config in --out; --report-to: the results to the trackers."""
    if args.emit:
        from overdrive.commands.emit import print_emitted
        from overdrive.emit import emit

        emitted = emit(args.out, stacks=args.emit, out=args.out)
        if quiet:
            for e in emitted:
                print(f"tune: wrote {e.path} ({e.stack}; {len(e.cannot)} line(s) it cannot express)", file=sys.stderr)
        else:
            print_emitted(emitted)
    if args.report_to:
        from overdrive.track import report_results

        for where in report_results(res.to_dict(), args.report_to, out=args.out or ".", kind="tune"):
            print(f"tune: logged to {where}", file=sys.stderr)


def _print(res) -> None:
    from overdrive.report.tune_view import render_tune

    render_tune(res.to_dict())


def register(sub) -> None:
    p = sub.add_parser("tune", help="measure the recipes on your own model and pick the fastest safe one",
                       description="Each candidate recipe (every preset distinct on this machine, then compile, "
                                   "optimizer and, where memory is the limit, checkpointing; FP8 with a measured "
                                   "per-layer filter on FP8 GPUs) trains your model in its own process. Interleaved "
                                   "timed rounds with an A/A twin of the baseline, successive halving, paired per-round "
                                   "intervals; every loss curve checked against the fp32 baseline. A winner needs "
                                   "its interval above 1.0 and beyond the A/A noise floor.")
    p.add_argument("--model", metavar="FILE.py:FACTORY|CONFIG", help="FILE.py:FACTORY, a function returning a fresh "
                   "nn.Module (same weights each call); or a transformers config folder or .json: a causal LM with "
                   "random token batches (no download)")
    p.add_argument("factory", nargs="?", metavar="FILE.py:FACTORY", help="older spelling of --model FILE.py:FACTORY")
    p.add_argument("--batch", metavar="FILE.py:FN", help="FN(step) returns a training batch: a tensor, tuple or dict")
    p.add_argument("--loss-fn", metavar="FILE.py:FN", help="FN(model, batch) returns the scalar loss (default: the "
                   "model's output if a scalar, else its .loss)")
    deprecated(p, "--loss", new="--loss-fn", dest="loss_fn", metavar="FILE.py:FN")
    deprecated(p, "--hf", new="--model CONFIG", dest="model", metavar="CONFIG")
    p.add_argument("--budget-s", type=float, default=120.0, help="wall-clock budget for the whole run, probing and "
                   "compilation included (default 120)")
    p.add_argument("--configs", help="comma-separated recipe names to try (default: all distinct presets + knobs)")
    deprecated(p, "--candidates", new="--configs", dest="configs")
    p.add_argument("--out", metavar="DIR", help="write results.json, report.html and recipe.json (the winner)")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout (progress goes to stderr)")
    p.add_argument("--lr", type=float, default=3e-4, help="AdamW learning rate for the measured steps")
    p.add_argument("--seed", type=int, default=0, help="torch seed for the initial weights, batches and dropout "
                   "(the same in every candidate)")
    p.add_argument("--threads", type=int, default=None, help="torch threads per worker (default: from the cores, the "
                   "workers stepping at once and the host's load; recorded in the results)")
    p.add_argument("--emit", action="append", metavar="STACK", help="also write the winner as accelerate, trainer, "
                   "torchtitan or lightning config into --out (repeatable; see `overdrive emit`)")
    p.add_argument("--report-to", metavar="TRACKERS", help="log the results to tensorboard, mlflow and/or wandb "
                   "(comma-separated): the winner and the machine as params, each candidate's figures as metrics")
    p.set_defaults(func=_cmd_tune)
