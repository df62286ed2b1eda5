"""`overdrive export` — argument parsing and printing only; the work is in overdrive.serve.export."""

from __future__ import annotations

import argparse

from overdrive.errors import UserError


def _cmd_export(args: argparse.Namespace) -> int:
    _model_or_factory(args)  # before the heavy imports: a wrong --model is a one-line error at once
    from overdrive.io import check_writable
    from overdrive.serve.export import ExportError, batching_from, export_for_serving, user_served_model

    from overdrive.serve.export import MAX_BATCH

    if args.max_batch is not None and not 1 <= args.max_batch <= MAX_BATCH:
        raise UserError(f"--max-batch must be 1..{MAX_BATCH}, got {args.max_batch}")
    if args.factory and ".py:" not in args.factory:
        raise UserError(f"{args.factory!r} is not FILE.py:FACTORY (e.g. models.py:make_model)")
    if args.factory and not args.inputs:
        raise UserError(f"exporting {args.factory} needs example inputs: pass --inputs FILE.py:FN, FN(batch) returning "
                        "a tensor or a tuple of tensors whose first dimension is the batch")
    if (args.inputs or args.dynamic) and not args.factory:
        raise UserError("--inputs/--dynamic are for your own model: pass FILE.py:FACTORY too (the built-in models "
                        "know their inputs; --bag-len sets the click model's)")
    check_writable(args.out, flag="--out")  # before the export, not after it
    from overdrive.measure.procs import parent_ends_on_sigterm

    # SIGTERM: the check's tritonserver and its stubs are stopped, the staging folder removed, the lock released
    with parent_ends_on_sigterm():
        rep = _export(args, batching_from, export_for_serving, user_served_model, ExportError)
    _print(rep)
    return 0


def _export(args, batching_from, export_for_serving, user_served_model, ExportError) -> dict:
    try:
        batching = served = None
        if args.slo_from:
            if args.factory:  # the bench must have measured this very model (`bench --model FILE.py:FACTORY`)
                served = user_served_model(args.factory, args.inputs, dynamic=args.dynamic, weights=args.weights)
                batching = batching_from(args.slo_from, "serving", model=served.identity)
            else:
                batching = batching_from(args.slo_from, "recsys" if args.model == "recsys" else "gpt_prefill")
        rep = export_for_serving(args.factory or args.model, args.out, size=args.size, weights=args.weights,
                                 max_batch=args.max_batch, batching=batching, onnx=False if args.no_onnx else None,
                                 inputs=args.inputs, dynamic=args.dynamic, bag_len=args.bag_len, served=served)
    except (ExportError, ValueError, FileNotFoundError) as e:
        raise UserError(str(e).splitlines()[0] if str(e) else type(e).__name__) from None
    return rep


def _print(rep: dict) -> None:
    b = {k: _printable(v) if isinstance(v, str) else v for k, v in rep["batching"].items()}
    print(f"exported {rep['name']} (max_batch_size {b['max_batch_size']}, preferred "
          f"{b.get('preferred_batch_size') or 'none'}, delay {b.get('max_queue_delay_us', 0)} µs — "
          f"{b.get('source', 'given')}): " + ", ".join(rep["files"]))
    if b.get("note"):
        print(f"note: {b['note']}")
    for line in rep.get("shapes") or []:
        print(line)
    print("round-trip max abs error vs eager: " + ", ".join(f"{k} {v:.2g}" for k, v in rep["checks"].items()))
    for m in rep.get("triton_check") or []:
        print(f"Triton repository read as Triton reads it: {m['name']}/ (name = folder, version "
              f"{', '.join(map(str, m['versions']))}, config parsed, I/O against the model"
              + (f", ran in onnxruntime at batch 1 and {m['max_batch_size']})" if m["ran"] else ")"))
    sc = rep.get("triton_server_check")
    if sc:
        print(f"loaded by a real tritonserver: {', '.join(sc['models'])} (triton_local/)" if sc.get("ready") else
              f"not loaded by a real tritonserver: {sc.get('why')}")
    if rep.get("onnx"):
        print(f"ONNX {rep['onnx']}")


def _model_or_factory(args: argparse.Namespace) -> None:
    """--model takes what bench's --model takes (recsys, gpt or FILE.py:FACTORY); the positional
    FILE.py:FACTORY is the older spelling of --model FILE.py:FACTORY."""
    m = args.model or "recsys"
    if ".py:" in m:
        if args.factory and args.factory != m:
            raise UserError(f"two models: {args.factory} and --model {m}: pass one, as --model FILE.py:FACTORY")
        args.factory, m = m, "recsys"
    elif m not in ("recsys", "gpt"):
        raise UserError(f"--model {m!r}: use recsys, gpt or FILE.py:FACTORY (a function returning your nn.Module)")
    elif args.model and args.factory:
        raise UserError(f"two models: {args.factory} and --model {m}: pass one")
    args.model = m


def _printable(s: str) -> str:
    """Text from a results file (untrusted) as the terminal should show it: escapes, never control codes."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in s)


def register(sub) -> None:
    e = sub.add_parser("export", help="export a model for serving: torch.export, ONNX, a Triton model repository",
                       description="Write model.pt2 (torch.export, dynamic batch), model.onnx when onnx/onnxruntime "
                                   "are installed, and triton/<name>/ (model + config.pbtxt with dynamic batching up "
                                   "to the SLO batch). Each artefact is reloaded and checked against the eager model.")
    e.add_argument("factory", nargs="?", metavar="FILE.py:FACTORY",
                   help="deprecated spelling of --model FILE.py:FACTORY")
    e.add_argument("--inputs", metavar="FILE.py:FN", help="FN(batch) returns example inputs (a tensor or a tuple, "
                   "batch first) for FILE.py:FACTORY")
    e.add_argument("--dynamic", action="append", metavar="INPUT:AXIS",
                   help="a further variable dimension of your model's input, by name or position (e.g. ids:1; "
                        "repeatable); the batch is always dynamic")
    e.add_argument("--bag-len", type=int, default=5, help="the click model's example bag length (the dimension "
                   "stays dynamic: -1 in config.pbtxt; default 5)")
    e.add_argument("--model", metavar="recsys|gpt|FILE.py:FACTORY",
                   help="recsys (default): the DLRM-style click model; gpt: a reference GPT of --size (with "
                        "--weights, the size it was trained at); FILE.py:FACTORY: your own model, a function "
                        "returning an nn.Module (with --inputs)")
    e.add_argument("--size", default="cpu-student", help="reference GPT size (for --model gpt)")
    e.add_argument("--weights", help="a state_dict .pt to load (weights_only); default: fresh random weights")
    e.add_argument("--out", default="out/export", help="output folder (default out/export)")
    e.add_argument("--max-batch", type=int, help="Triton max_batch_size (default 1024, or the measured one with "
                   "--slo-from; given with --slo-from, it overrides the measured size)")
    e.add_argument("--slo-from", metavar="DIR", help="take max_batch_size, preferred sizes, queue delay and instances "
                   "from `overdrive bench --workload inference` results (ONNX Runtime's best setting); for your own "
                   "model, a bench of that model (`bench --workload inference --model FILE.py:FACTORY --inputs ...`)")
    e.add_argument("--no-onnx", action="store_true", help="skip ONNX (Triton then gets TorchScript on libtorch)")
    e.set_defaults(func=_cmd_export)
