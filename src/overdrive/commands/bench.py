"""`overdrive bench` — argument parsing and printing only; the work is in overdrive.bench (its
workloads registry) and overdrive.report."""

from __future__ import annotations

import argparse
import os

from overdrive.commands import late_help
from overdrive.commands.vocabulary import deprecated
from overdrive.errors import UserError


def _serving_workloads() -> str:
    from overdrive.bench.workloads import WORKLOADS

    return " or ".join(f"--workload {k}" for k, w in WORKLOADS.items() if w.serves_models)


def _refuse_ignored_flags(args: argparse.Namespace, workload) -> None:
    """A flag that would be ignored is refused in one line, never silently dropped."""
    if args.quick and args.suite:
        raise UserError(f"--quick and --suite {args.suite} together: --quick picks the short suite, --suite names one; "
                        "pass only one of them")
    if (args.model or args.inputs or args.dynamic) and not workload.serves_models:
        raise UserError(f"--model/--inputs/--dynamic serve your model under a request stream: they apply to "
                        f"{_serving_workloads()}, not {workload.name} (to tune your model's training: overdrive tune "
                        "--model FILE.py:FACTORY)")
    if (args.inputs or args.dynamic) and not args.model:
        raise UserError("--inputs/--dynamic are for your own model: pass --model FILE.py:FACTORY too")
    if args.model and ".py:" not in args.model:
        raise UserError(f"--model {args.model!r} is not FILE.py:FACTORY (e.g. models.py:make_model)")
    if args.model and not args.inputs:
        raise UserError(f"--model {args.model} needs example inputs: pass --inputs FILE.py:FN, FN(batch) returning a "
                        "tensor or a tuple of tensors whose first dimension is the batch")
    if args.threads is not None and not workload.threads_apply:
        raise UserError(f"--threads applies to the training workloads: the {workload.name} bench sets each engine's "
                        "threads from the host's load (half the free cores, recorded in the results); drop --threads")
    if args.server != "simulated" and not workload.serves_models:
        raise UserError(f"--server {args.server} serves the inference bench's model: add {_serving_workloads()}")
    if args.configs and not workload.configs_apply:
        raise UserError(f"--configs does not apply to --workload {workload.name}: it measures every mode; drop "
                        "--configs")
    if args.report_to and workload.kind != "bench":
        raise UserError(f"--report-to logs training benches; the {workload.name} bench writes its results with --out")


def _refuse_gpu_suite_without_gpu(args: argparse.Namespace, env) -> None:
    if args.suite and args.suite.endswith("gpu") and not env.has_gpu:
        raise UserError(f"--suite {args.suite} needs a CUDA GPU and none is visible here: use --quick or the default "
                        "suite for this machine (omit --suite)")


def _cmd_bench(args: argparse.Namespace) -> int:
    from overdrive.measure.procs import parent_ends_on_sigterm

    held: list = []
    try:
        with parent_ends_on_sigterm():  # SIGTERM: the workers end with us and the lock is released
            return _bench(args, held)
    finally:
        for lock in held:
            lock.release()


def _claim(args: argparse.Namespace, held: list) -> None:
    """Lock the results folder for the whole run (a second bench on it fails now, in one line) and
    refuse a folder that holds files not ours."""
    from overdrive.measure.lock import claim_results_dir

    held.append(claim_results_dir(args.out, what="overdrive bench"))


def _checked_args(args: argparse.Namespace, workload) -> tuple[str | None, list]:
    """Everything about the arguments that can fail before the run, in one line each: (the data
    file's summary, the trackers to report to)."""
    from overdrive.data import DataError
    from overdrive.track import parse_report_to

    _refuse_ignored_flags(args, workload)
    if args.out and os.path.exists(args.out) and not os.path.isdir(args.out):
        raise UserError(f"--out {args.out} is a file: pass a folder (it is created if missing)")
    data_note = None
    if args.data:
        try:
            data_note = workload.check_data(args.data)  # fail now, in one line, not inside six workers
        except DataError as e:
            raise UserError(str(e)) from None
    if args.rounds is not None and args.rounds < 1:
        raise UserError(f"--rounds must be >= 1 timed round, got {args.rounds}")
    if args.threads is not None and args.threads < 1:
        raise UserError(f"--threads must be >= 1, got {args.threads}")
    if workload.serves_models and (not args.slo_ms > 0 or args.slo_ms == float("inf")):  # nan and inf too
        raise UserError(f"--slo-ms must be positive (a number of milliseconds), got {args.slo_ms}")
    return data_note, parse_report_to(args.report_to)  # a missing tracker package: one line, before the run


def _suite_of(args: argparse.Namespace, workload, env):
    from overdrive.bench.workloads import WORKLOADS

    name = args.suite or workload.default_suite(has_gpu=env.has_gpu, quick=args.quick)
    if name not in workload.suites:
        owner = next((k for k, w in WORKLOADS.items() if name in w.suites), None)
        if owner:
            raise UserError(f"--suite {name} is a suite of --workload {owner}: add --workload {owner}")
        raise UserError(f"unknown {workload.name} suite '{name}': suites are {', '.join(workload.suites)}")
    return workload.suites[name]


def _bench(args: argparse.Namespace, held: list) -> int:
    from overdrive.bench.workloads import get_workload
    from overdrive.env import get_env

    workload = get_workload(args.workload)
    data_note, report_to = _checked_args(args, workload)
    if args.out:
        from overdrive.io import check_writable

        check_writable(args.out, flag="--out")  # now, not after the whole bench has run
        _claim(args, held)
    env = get_env()
    _refuse_gpu_suite_without_gpu(args, env)
    suite = _suite_of(args, workload, env)
    if workload.kind == "latency":
        return _bench_latency(args, env, workload, suite)
    return _bench_training(args, env, workload, suite, data_note, report_to)


def _bench_training(args: argparse.Namespace, env, workload, suite, data_note: str | None, report_to) -> int:
    import dataclasses

    from rich.markup import escape

    from overdrive.bench import candidates_from_names, run_bench
    from overdrive.report.console import wide_console
    from overdrive.report.tables import render_bench

    if args.configs:
        try:
            suite = suite.with_candidates(candidates_from_names(
                suite, [c.strip() for c in args.configs.split(",") if c.strip()]))
        except ValueError as e:
            raise UserError(str(e)) from None
    if args.rounds:
        suite = dataclasses.replace(suite, rounds=args.rounds)
    console = wide_console()
    console.print(f"overdrive bench: suite [bold]{escape(suite.name)}[/] ({workload.name}) on "
                  f"{escape(env.gpus[0].name) if env.gpus else 'CPU'} — "
                  f"{len(suite.candidates)} configurations, each in its own process, interleaved rounds; quality "
                  f"judged after {suite.parity_steps} steps")
    if data_note:
        console.print(f"data: {escape(data_note)}")
    with _progress(console) as progress:
        results = run_bench(suite, env=env, data=args.data, seed=args.seed, micro=not args.no_micro,
                            progress=progress, threads=args.threads, on_partial=_partial_writer(args.out))
    render_bench(results, console)
    from overdrive.bench.findings import save_findings

    save_findings(results, env)  # for `overdrive doctor`: what the bench measured, beside what the probes expect
    if args.out:
        _write_report(results, args.out, console)
    if report_to:
        from overdrive.track import report_results

        for where in report_results(results, report_to, out=args.out or ".", kind="bench", env=env):
            console.print(escape(f"logged to {where}"))
    return 0


def _progress(console):
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("{task.description:<28}", markup=False), BarColumn(),
                    TextColumn("{task.percentage:>3.0f}%"), TimeElapsedColumn(), console=console,
                    transient=not console.is_terminal)


def _served_model(args: argparse.Namespace):
    """The user's model for the request stream (--model/--inputs), or None for the built-in one."""
    from overdrive.serve.export import ExportError, user_served_model

    if not args.model:
        return None
    try:
        return user_served_model(args.model, args.inputs, dynamic=args.dynamic)
    except ExportError as e:
        raise UserError(str(e).splitlines()[0]) from None


def _bench_latency(args: argparse.Namespace, env, workload, suite) -> int:
    import dataclasses

    from rich.markup import escape
    from rich.progress import Progress

    from overdrive.report.console import wide_console
    from overdrive.report.latency_view import render_latency
    from overdrive.serve.engines import ServingError
    from overdrive.serve.export import ExportError

    if args.rounds:  # the fixed-batch tables' rounds and the request stream's
        suite = dataclasses.replace(suite, rounds=args.rounds, serve_rounds=args.rounds)
    if args.server == "triton":  # before any work: the extra, and a machine the server binary runs on
        from overdrive.serve.triton_bench import triton_unavailable

        why = triton_unavailable()
        if why:
            raise UserError(f"--server triton: {why}")
    model = _served_model(args)
    console = wide_console()
    console.print(f"overdrive bench: inference latency, suite [bold]{escape(suite.name)}[/], SLO p99 <= "
                  f"{args.slo_ms:g} ms" + (f"; {escape(model.description)}, under a request stream only (the "
                                           "fixed-batch tables are for the built-in models)" if model else ""))
    try:
        with Progress(console=console, transient=not console.is_terminal) as progress:
            r = workload.run(suite, env, slo_ms=args.slo_ms, seed=args.seed, progress=progress, model=model)
    except (ServingError, ExportError) as e:  # your model or its inputs, at a batch size the example did not try
        raise UserError(str(e).splitlines()[0]) from None
    render_latency(r, console)
    if args.server == "triton":
        _triton(args, r, model, suite, console)
    if args.out:
        _write_latency(r, args.out, console)
    return 0


def _triton(args: argparse.Namespace, r: dict, model, suite, console) -> None:
    """--server triton: the setting the simulation chose, served by a real tritonserver and measured."""
    from rich.markup import escape

    from overdrive.report.triton_view import triton_lines
    from overdrive.serve.export import ExportError
    from overdrive.serve.serving import click_served_model
    from overdrive.serve.triton_bench import run_triton_bench

    try:
        r["triton"] = run_triton_bench(r.get("serving") or {}, model or click_served_model(suite, args.seed),
                                       slo_ms=args.slo_ms, seed=args.seed, say=lambda m: console.print(escape(m)))
    except (ExportError, RuntimeError) as e:  # the server did not start or load: its own error line
        raise UserError(f"--server triton: {str(e).splitlines()[0]}") from None
    for line in triton_lines(r["triton"]):
        console.print(escape(line))


def _write_latency(r: dict, out: str, console) -> None:
    from rich.markup import escape

    from overdrive.bench import save_results
    from overdrive.report.latency_view import write_latency_report

    save_results(r, out)
    files = write_latency_report(r, out)
    if r.get("triton"):
        from overdrive.report.triton_view import write_triton_plot

        files += [f for f in [write_triton_plot(r, out)] if f]
    console.print(escape(f"wrote {os.path.join(os.path.normpath(out), 'results.json')}, results.csv and " + ", ".join(os.path.basename(f) for f in files)))


def _partial_writer(out: str | None):
    """results.json and .csv at every look, so a bench killed later (a time limit, a lost machine)
    still leaves what it measured; the finished bench overwrites them and adds the report."""
    if not out:
        return None
    from overdrive.bench import save_results

    return lambda results: save_results(results, out)


def _write_report(results: dict, out: str, console) -> None:
    from rich.markup import escape

    from overdrive.bench import save_results
    from overdrive.report.html import write_html
    from overdrive.report.plots import write_plots

    save_results(results, out)
    plots = write_plots(results, out)
    page = write_html(results, out, plots)
    console.print(escape(f"wrote {os.path.join(os.path.normpath(out), 'results.json')}, results.csv, {len(plots)} plots and {page}"))


def _suite_names() -> str:
    """Every suite name per workload, read from the registry (only when help is shown)."""
    from overdrive.bench.workloads import WORKLOADS

    return "; ".join(f"{k}: {', '.join(w.suites)}" for k, w in WORKLOADS.items())


def register(sub) -> None:
    b = sub.add_parser("bench", help="baseline PyTorch vs the optimized recipes here: speed, memory, loss parity",
                       description="Train a teacher and a distilled student reference GPT under the baseline "
                                   "(fp32, eager, for-loop AdamW) and each candidate recipe that resolves here, "
                                   "each in its own process, in interleaved rounds. Prints the table and the "
                                   "recommendation; --out writes results.json/csv, plots and report.html.")
    b.add_argument("--quick", action="store_true", help="the short suite (CPU: about a minute on a quiet 2-core host; on a noisy one it measures on, up to 2 min of rounds, until the verdicts settle)")
    from overdrive.bench.workloads import WORKLOADS  # a light import (no torch): parsing stays instant

    b.add_argument("--workload", choices=list(WORKLOADS), default="transformer",
                   help="; ".join(f"{k}: {w.help}" for k, w in WORKLOADS.items()))
    b.add_argument("--slo-ms", type=float, default=10.0, help="inference: the p99 latency budget (default 10 ms)")
    late_help(b.add_argument("--suite", help="a named suite (default: by device, workload and --quick):"),
              _suite_names)
    b.add_argument("--out", help="folder for results.json, results.csv, PNG plots and report.html")
    b.add_argument("--data", metavar="FILE", help="your data instead of the built-in stream: " + "; ".join(
        f"{k}: {w.data_help}" for k, w in WORKLOADS.items() if w.data_help))
    b.add_argument("--model", metavar="FILE.py:FACTORY", help="inference: your own model (a function returning an "
                   "nn.Module) served under the request stream in eager, compiled and ONNX Runtime, instead of the "
                   "built-in click model; with --inputs")
    b.add_argument("--inputs", metavar="FILE.py:FN", help="inference: FN(batch) returns example inputs for --model (a "
                   "tensor or a tuple, batch first)")
    b.add_argument("--dynamic", action="append", metavar="INPUT:AXIS", help="inference: a further variable dimension "
                   "of --model's input (e.g. ids:1; repeatable), as `overdrive export` takes it")
    b.add_argument("--server", choices=["simulated", "triton"], default="simulated",
                   help="inference: simulated (Triton's dynamic batcher simulated from measured service times) or "
                        "triton (also a real tritonserver on 127.0.0.1 serving the exported model with the simulated "
                        "setting, driven by an open-loop Poisson client: needs pip install 'tritonclient[http,grpc]', the overdrive[triton] extra)")
    b.add_argument("--configs", help="comma-separated candidates to run (the baseline always runs): the suite's, or "
                                     "any recipe name (e.g. fp8-rowwise, bf16+compile)")
    b.add_argument("--rounds", type=int, help="timed rounds: each round runs every configuration for the suite's "
                                               "steps per round (default: the suite's rounds; inference: the rounds "
                                               "of every table and of the request stream); quality is always judged "
                                               "after the suite's fixed parity steps")
    deprecated(b, "--steps", new="--rounds", dest="rounds", type=int)
    b.add_argument("--threads", type=int, default=None, help="torch threads per measuring process (default: from the "
                   "cores, the processes stepping at once and the host's load; recorded in the results)")
    b.add_argument("--seed", type=int, default=0, help="seed for model init and data order (default 0)")
    b.add_argument("--no-micro", action="store_true", help="skip the micro-benchmarks")
    b.add_argument("--report-to", metavar="TRACKERS", help="log the results to tensorboard, mlflow and/or wandb "
                   "(comma-separated): the suite and the machine as params, each configuration's figures as metrics")
    b.set_defaults(func=_cmd_bench)
