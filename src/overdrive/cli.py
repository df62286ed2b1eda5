"""The `overdrive` command line: thin. It parses, calls the library, prints.

Errors a user can fix (bad flags, files, configs) print one line `overdrive: error: ...` and
exit 2; nothing already written is lost.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from overdrive import __version__


class UserError(Exception):
    """A problem with the user's input, with its fix in the message; exit code 2."""


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

    for register in _REGISTRARS:
        register(sub)
    return p


def _cmd_bench(args: argparse.Namespace) -> int:
    import dataclasses

    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from overdrive.bench import default_suite_name, get_suite, run_bench
    from overdrive.bench.data import DataError, file_tokens
    from overdrive.env import get_env
    from overdrive.report.doctor import wide_console
    from overdrive.report.tables import render_bench

    if args.data and args.workload == "recsys":
        raise UserError("--data is for the transformer workload; the recsys bench uses its synthetic click logs "
                        "(read Criteo TSV files with overdrive.recsys.read_criteo_tsv)")
    if args.data:
        try:
            file_tokens(args.data)  # fail now, in one line, not inside six worker processes
        except DataError as e:
            raise UserError(str(e)) from None
    if args.out and os.path.exists(args.out) and not os.path.isdir(args.out):
        raise UserError(f"--out {args.out} is a file: pass a folder (it is created if missing)")
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

    from overdrive.bench.results import write_atomic
    from overdrive.report.doctor import wide_console
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


def _cmd_report(args: argparse.Namespace) -> int:
    from overdrive.bench import load_results
    from overdrive.report.doctor import wide_console
    from overdrive.report.tables import render_bench, render_compare

    console = wide_console()
    try:
        loaded = [load_results(d) for d in args.dirs]
    except (FileNotFoundError, ValueError) as e:
        raise UserError(str(e)) from None
    if any(d["schema"] == "overdrive.latency/1" for d in loaded):
        from overdrive.report.latency_view import render_latency, write_latency_report

        if len(loaded) != 1:
            raise UserError("comparing two inference results is not supported yet: pass one folder")
        render_latency(loaded[0], console)
        out = args.dirs[0] if os.path.isdir(args.dirs[0]) else os.path.dirname(os.path.abspath(args.dirs[0]))
        console.print(f"re-rendered {write_latency_report(loaded[0], out)[-1]}")
        return 0
    if len(loaded) == 1:
        render_bench(loaded[0], console)
        out = args.dirs[0] if os.path.isdir(args.dirs[0]) else os.path.dirname(os.path.abspath(args.dirs[0]))
        from overdrive.report.html import write_html
        from overdrive.report.plots import write_plots

        page = write_html(loaded[0], out, write_plots(loaded[0], out))
        console.print(f"re-rendered {page}")
    else:
        render_compare(loaded[0], loaded[1], console)
    return 0


def _register_bench(sub) -> None:
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
    b.add_argument("--suite", help="suite name: cpu-quick, cpu, gpu (default: by device)")
    b.add_argument("--out", help="folder for results.json, results.csv, PNG plots and report.html")
    b.add_argument("--data", help="a text file to train on (bytes as tokens) instead of the built-in stream")
    b.add_argument("--configs", help="comma-separated candidate names to run (the baseline always runs)")
    b.add_argument("--steps", type=int, help="number of timed rounds (overrides the suite)")
    b.add_argument("--seed", type=int, default=0, help="seed for model init and data order (default 0)")
    b.add_argument("--no-micro", action="store_true", help="skip the micro-benchmarks")
    b.set_defaults(func=_cmd_bench)
    r = sub.add_parser("report", help="re-render a bench result folder, or compare two",
                       description="overdrive report DIR re-renders the table, plots and report.html from "
                                   "DIR/results.json; overdrive report DIR_A DIR_B compares two runs.")
    r.add_argument("dirs", nargs="+", metavar="DIR", help="one or two result folders (or results.json files)")
    r.set_defaults(func=_cmd_report)


def _cmd_plan(args: argparse.Namespace) -> int:
    from overdrive.plan import DEFAULT_EFFICIENCY, ModelSpec, calibrate_from_bench, get_model, plan, sweep
    from overdrive.report.doctor import wide_console
    from overdrive.report.plan_view import render_plan, render_sweep, write_breakdown_png

    console = wide_console()
    if args.sweep:
        rows = sweep()
        print(json.dumps({"sweep": rows}, indent=1)) if args.json else render_sweep(rows, console)
        return 0
    try:
        if args.layers:
            if not (args.hidden and args.heads):
                raise ValueError("custom dims need --layers, --hidden and --heads (and optionally --kv-heads, --ffn, "
                                 "--vocab, --tied)")
            model = ModelSpec(name="custom", n_layer=args.layers, hidden=args.hidden, n_head=args.heads,
                              n_kv_head=args.kv_heads or args.heads, ffn=args.ffn or 4 * args.hidden,
                              vocab=args.vocab, tied=args.tied, gated_mlp=not args.gelu_mlp)
        else:
            model = get_model(args.model)
        eff = calibrate_from_bench(args.calibrate) if args.calibrate else (args.efficiency or DEFAULT_EFFICIENCY)
        gb = args.global_batch
        if args.global_batch_tokens:
            if args.global_batch_tokens % args.seq:
                raise ValueError(f"--global-batch-tokens {args.global_batch_tokens} is not a multiple of --seq "
                                 f"{args.seq}")
            gb = args.global_batch_tokens // args.seq
        r = plan(model, args.gpu, gpus_per_node=args.gpus, nodes=args.nodes, seq=args.seq, global_batch=gb,
                 precisions=args.precision.split(",") if args.precision else None,
                 shardings=args.sharding.split(",") if args.sharding else None,
                 checkpointing=args.checkpointing.split(",") if args.checkpointing else None,
                 optimizer_dtype=args.optimizer_dtype, fp8_all_gather=args.fp8_all_gather, efficiency=eff,
                 intra_gbs=args.intra_gbs, inter_gbs=args.inter_gbs)
    except ValueError as e:
        raise UserError(str(e)) from None
    if args.json:
        print(json.dumps(r, indent=1))
    else:
        render_plan(r, console)
    if args.png:
        write_breakdown_png(r, args.png)
        if not args.json:
            console.print(f"wrote {args.png}")
    return 0


def _register_plan(sub) -> None:
    p = sub.add_parser("plan", help="what fits and how fast: memory per GPU and tokens/s for 1B-405B models",
                       description="Estimate memory per GPU and step time for every precision x sharding x "
                                   "checkpointing x micro-batch, rank what fits, and say what would make the rest "
                                   "fit. Example: overdrive plan --model llama3-8b --gpu h100-sxm --gpus 8 --seq 8192")
    p.add_argument("--model", default="llama3-8b", help="llama3-1b/3b/8b/70b/405b, gpt-64b, a reference GPT size, "
                                                        "or a Hugging Face config.json path")
    p.add_argument("--gpu", default="h100-sxm", help="a100-40, a100-80, h100-sxm, h100-pcie, h200, b200, b300, l40s, "
                                                    "l4, rtx4090")
    p.add_argument("--gpus", type=int, default=8, help="GPUs per node (default 8)")
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--seq", type=int, default=4096, help="sequence length")
    p.add_argument("--global-batch", type=int, help="global batch in sequences")
    p.add_argument("--global-batch-tokens", type=int, help="global batch in tokens")
    p.add_argument("--precision", help="comma list of fp32,bf16,fp8,fp8-rowwise,mxfp8 (default: all but fp32)")
    p.add_argument("--sharding", help="comma list of none,fsdp,hsdp")
    p.add_argument("--checkpointing", help="comma list of none,selective,full")
    p.add_argument("--optimizer-dtype", default="fp32", choices=["fp32", "bf16", "8bit"])
    p.add_argument("--fp8-all-gather", action="store_true", help="all-gather FP8 weights under FSDP")
    p.add_argument("--efficiency", type=float, help="achievable fraction of peak (default 0.39, calibrated)")
    p.add_argument("--calibrate", metavar="RESULTS.json", help="take the efficiency from an overdrive bench result")
    p.add_argument("--intra-gbs", type=float, help="per-GPU intra-node bandwidth GB/s (default: NVLink of the GPU)")
    p.add_argument("--inter-gbs", type=float, default=50.0, help="per-GPU inter-node bandwidth GB/s (default 50)")
    p.add_argument("--layers", type=int, help="custom model: layers")
    p.add_argument("--hidden", type=int, help="custom model: hidden size")
    p.add_argument("--heads", type=int, help="custom model: attention heads")
    p.add_argument("--kv-heads", type=int, help="custom model: KV heads (default: heads)")
    p.add_argument("--ffn", type=int, help="custom model: FFN size (default 4 x hidden)")
    p.add_argument("--vocab", type=int, default=128256, help="custom model: vocabulary")
    p.add_argument("--tied", action="store_true", help="custom model: tied embeddings")
    p.add_argument("--gelu-mlp", action="store_true", help="custom model: 2-matrix GELU MLP instead of SwiGLU")
    p.add_argument("--json", action="store_true", help="print JSON (candidates with fits, memory_gib, "
                                                       "tokens_per_s_per_gpu, breakdown)")
    p.add_argument("--png", help="write the memory breakdown of the top pick to this PNG")
    p.add_argument("--sweep", action="store_true", help="1B/8B/64B/70B on 8xB200 and 8xB300, bf16 vs fp8: longest "
                                                        "sequence that fits at micro-batch 1")
    p.set_defaults(func=_cmd_plan)


def _cmd_train(args: argparse.Namespace) -> int:
    from overdrive.bench.data import DataError
    from overdrive.train import (CheckpointError, ConfigError, TrainingDiverged, export_weights, load_config,
                                 train)

    try:
        cfg = load_config(args.config, args.set or [])
        if args.export:
            path = export_weights(args.from_dir or cfg.train.out_dir, cfg, args.export)
            print(f"exported {path}")
            return 0
        res = train(cfg, resume=args.resume)
    except (ConfigError, DataError, CheckpointError, ValueError) as e:
        raise UserError(str(e)) from None
    except TrainingDiverged as e:
        print(f"overdrive: training stopped: {e}", file=sys.stderr)
        return 3
    if int(os.environ.get("RANK", "0")) == 0:
        v = f", final val loss {res.final_val_loss:.4f}" if res.final_val_loss is not None else ""
        print(f"done: {len(res.losses)} steps, last loss {res.losses[-1]:.4f}{v}; run in {res.run_dir}"
              if res.losses else f"nothing to do: {res.run_dir} already finished")
    return 0


def _register_train(sub) -> None:
    t = sub.add_parser("train", help="train a reference GPT (distillation, checkpointing, FSDP2 under torchrun)",
                       description="Train per a TOML config (see examples/tiny.toml). Under torchrun "
                                   "(torchrun --nproc_per_node=N -m overdrive train CONFIG) the model is sharded "
                                   "with FSDP2. Checkpoints are sharded (torch.distributed.checkpoint) and "
                                   "crash-safe; --resume continues from the newest. Exit codes: 2 bad input, "
                                   "3 training diverged.")
    t.add_argument("config", help="TOML config file")
    t.add_argument("--set", action="append", metavar="KEY=VALUE", help="override, e.g. --set train.steps=200")
    t.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in train.out_dir")
    t.add_argument("--export", metavar="PATH", help="write the newest checkpoint as one plain state_dict and exit")
    t.add_argument("--from", dest="from_dir", metavar="DIR", help="with --export: a run folder or checkpoint "
                                                                  "(default train.out_dir)")
    t.set_defaults(func=_cmd_train)


def _cmd_export(args: argparse.Namespace) -> int:
    from overdrive.serve.export import ExportError, export_for_serving, slo_batch_from

    try:
        max_batch = args.max_batch
        if args.slo_from:
            max_batch = slo_batch_from(args.slo_from, "recsys" if args.model == "recsys" else "gpt_prefill")
        rep = export_for_serving(args.model, args.out, size=args.size, weights=args.weights,
                                 max_batch=max_batch or 1024, onnx=False if args.no_onnx else None)
    except (ExportError, ValueError, FileNotFoundError) as e:
        raise UserError(str(e)) from None
    print(f"exported {rep['name']} (max batch {rep['max_batch']}): " + ", ".join(rep["files"]))
    print("round-trip max abs error vs eager: " + ", ".join(f"{k} {v:.2g}" for k, v in rep["checks"].items()))
    if rep.get("onnx"):
        print(f"ONNX {rep['onnx']}")
    return 0


def _register_export(sub) -> None:
    e = sub.add_parser("export", help="export a model for serving: torch.export, ONNX, a Triton model repository",
                       description="Write model.pt2 (torch.export, dynamic batch), model.onnx when onnx/onnxruntime "
                                   "are installed, and triton/<name>/ (model + config.pbtxt with dynamic batching up "
                                   "to the SLO batch). Each artefact is reloaded and checked against the eager model.")
    e.add_argument("--model", choices=["recsys", "gpt"], default="recsys")
    e.add_argument("--size", default="cpu-student", help="reference GPT size (for --model gpt)")
    e.add_argument("--weights", help="a state_dict .pt to load (weights_only); default: fresh random weights")
    e.add_argument("--out", default="out/export", help="output folder (default out/export)")
    e.add_argument("--max-batch", type=int, help="Triton max_batch_size (default 1024)")
    e.add_argument("--slo-from", metavar="DIR", help="take the batch from `overdrive bench --workload inference` results")
    e.add_argument("--no-onnx", action="store_true", help="skip ONNX (Triton then gets TorchScript on libtorch)")
    e.set_defaults(func=_cmd_export)


# Subcommands register themselves here, keeping this file thin.
_REGISTRARS: list = [_register_bench, _register_plan, _register_train, _register_export]


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
