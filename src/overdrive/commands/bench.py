"""`overdrive bench` — argument parsing and printing only; the work is in overdrive.bench, overdrive.serve.latency and overdrive.report."""

from __future__ import annotations

import argparse
import json
import os

from overdrive.commands import late_help
from overdrive.errors import UserError


def _cmd_bench(args: argparse.Namespace) -> int:
    import dataclasses

    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from overdrive.bench import default_suite_name, get_suite, run_bench
    from overdrive.data import DataError, file_tokens
    from overdrive.env import get_env
    from overdrive.report.console import wide_console
    from overdrive.report.tables import render_bench

    if args.data and args.workload == "recsys":
        raise UserError("--data is for the transformer workload; the recsys bench uses its synthetic click logs "
                        "(read Criteo TSV files with overdrive.recsys.read_criteo_tsv)")
    if args.data:
        try:
            file_tokens(args.data)  # fail now, in one line, not inside six worker processes
        except DataError as e:
            raise UserError(str(e)) from None
    if args.steps is not None and args.steps < 1:
        raise UserError(f"--steps must be >= 1 timed round, got {args.steps}")
    if args.out:
        from overdrive.io import check_writable

        check_writable(args.out, flag="--out")  # now, not after the whole bench has run
    env = get_env()
    if args.workload == "inference":
        return _bench_inference(args, env)
    try:
        suite = get_suite(args.suite or default_suite_name(env.has_gpu, args.quick, args.workload))
    except ValueError as e:
        raise UserError(str(e)) from None
    if args.configs:
        wanted = [c.strip() for c in args.configs.split(",") if c.strip()]
        known = {c.name: c for c in suite.candidates}
        bad = [w for w in wanted if w not in known]
        if bad:
            raise UserError(f"unknown config(s) {', '.join(bad)} in suite {suite.name}: choose from {', '.join(known)}")
        keep = [c for c in suite.candidates if c.baseline or c.name in wanted]
        suite = suite.with_candidates(tuple(keep))
    if args.steps:
        suite = dataclasses.replace(suite, rounds=args.steps)
    console = wide_console()
    console.print(f"overdrive bench: suite [bold]{suite.name}[/] ({suite.task}) on "
                  f"{env.gpus[0].name if env.gpus else 'CPU'} — "
                  f"{len(suite.candidates)} configurations, each in its own process, interleaved rounds")
    with Progress(TextColumn("{task.description:<28}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                  TimeElapsedColumn(), console=console, transient=not console.is_terminal) as progress:
        results = run_bench(suite, env=env, data=args.data, seed=args.seed, micro=not args.no_micro,
                            progress=progress)
    render_bench(results, console)
    if args.out:
        _write_report(results, args.out, console)
    return 0


def _bench_inference(args: argparse.Namespace, env) -> int:
    from rich.progress import Progress

    from overdrive.io import write_atomic
    from overdrive.report.console import wide_console
    from overdrive.report.latency_view import render_latency, write_latency_report
    from overdrive.serve.latency import LATENCY_SUITES, run_latency

    if args.slo_ms <= 0:
        raise UserError(f"--slo-ms must be positive, got {args.slo_ms}")
    name = args.suite or ("inference-gpu" if env.has_gpu else ("inference-quick" if args.quick else "inference"))
    if name not in LATENCY_SUITES:
        raise UserError(f"unknown inference suite '{name}': suites are {', '.join(LATENCY_SUITES)}")
    console = wide_console()
    console.print(f"overdrive bench: inference latency, suite [bold]{name}[/], SLO p99 <= {args.slo_ms:g} ms")
    with Progress(console=console, transient=not console.is_terminal) as progress:
        r = run_latency(LATENCY_SUITES[name], env, slo_ms=args.slo_ms, seed=args.seed, progress=progress)
    render_latency(r, console)
    if args.out:
        write_atomic(os.path.join(args.out, "results.json"), json.dumps(r, indent=1) + "\n")
        files = write_latency_report(r, args.out)
        console.print(f"wrote {args.out}/results.json and " + ", ".join(os.path.basename(f) for f in files))
    return 0


def _write_report(results: dict, out: str, console) -> None:
    from overdrive.bench import save_results
    from overdrive.report.html import write_html
    from overdrive.report.plots import write_plots

    save_results(results, out)
    plots = write_plots(results, out)
    page = write_html(results, out, plots)
    console.print(f"wrote {out}/results.json, results.csv, {len(plots)} plots and {page}")


def _suite_names() -> str:
    """Every suite name, read from the registries (only when help is shown)."""
    from overdrive.bench.suites import SUITES
    from overdrive.recsys.bench import RECSYS_SUITES
    from overdrive.serve.latency import LATENCY_SUITES

    return ", ".join([*SUITES, *RECSYS_SUITES, *LATENCY_SUITES])


def register(sub) -> None:
    b = sub.add_parser("bench", help="baseline PyTorch vs the optimized recipes here: speed, memory, loss parity",
                       description="Train a teacher and a distilled student reference GPT under the baseline "
                                   "(fp32, eager, for-loop AdamW) and each candidate recipe that resolves here, "
                                   "each in its own process, in interleaved rounds. Prints the table and the "
                                   "recommendation; --out writes results.json/csv, plots and report.html.")
    b.add_argument("--quick", action="store_true", help="the short suite (CPU: under a minute)")
    b.add_argument("--workload", choices=["transformer", "recsys", "inference"], default="transformer",
                   help="transformer: teacher + distilled student GPT (default); recsys: a DLRM-style click model "
                        "(embedding lookups x optimizers x AMP); inference: latency p50/p95/p99 per batch size")
    b.add_argument("--slo-ms", type=float, default=10.0, help="inference: the p99 latency budget (default 10 ms)")
    late_help(b.add_argument("--suite", help="a named suite (default: by device, workload and --quick):"),
              _suite_names)
    b.add_argument("--out", help="folder for results.json, results.csv, PNG plots and report.html")
    b.add_argument("--data", help="a text file to train on (bytes as tokens) instead of the built-in stream")
    b.add_argument("--configs", help="comma-separated candidate names to run (the baseline always runs)")
    b.add_argument("--steps", type=int, help="sets the number of timed rounds, not optimizer steps: each round "
                                              "runs every configuration for the suite's steps per round "
                                              "(default: the suite's rounds)")
    b.add_argument("--seed", type=int, default=0, help="seed for model init and data order (default 0)")
    b.add_argument("--no-micro", action="store_true", help="skip the micro-benchmarks")
    b.set_defaults(func=_cmd_bench)
