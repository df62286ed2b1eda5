"""`overdrive export` — argument parsing and printing only; the work is in overdrive.serve.export."""

from __future__ import annotations

import argparse

from overdrive.errors import UserError


def _cmd_export(args: argparse.Namespace) -> int:
    from overdrive.io import check_writable
    from overdrive.serve.export import ExportError, export_for_serving, slo_batch_from

    check_writable(args.out, flag="--out")  # before the export, not after it
    try:
        max_batch = args.max_batch
        if args.slo_from:
            max_batch = slo_batch_from(args.slo_from, "recsys" if args.model == "recsys" else "gpt_prefill")
        rep = export_for_serving(args.model, args.out, size=args.size, weights=args.weights,
                                 max_batch=1024 if max_batch is None else max_batch,
                                 onnx=False if args.no_onnx else None)
    except (ExportError, ValueError, FileNotFoundError) as e:
        raise UserError(str(e)) from None
    print(f"exported {rep['name']} (max batch {rep['max_batch']}): " + ", ".join(rep["files"]))
    print("round-trip max abs error vs eager: " + ", ".join(f"{k} {v:.2g}" for k, v in rep["checks"].items()))
    if rep.get("onnx"):
        print(f"ONNX {rep['onnx']}")
    return 0


def register(sub) -> None:
    e = sub.add_parser("export", help="export a model for serving: torch.export, ONNX, a Triton model repository",
                       description="Write model.pt2 (torch.export, dynamic batch), model.onnx when onnx/onnxruntime "
                                   "are installed, and triton/<name>/ (model + config.pbtxt with dynamic batching up "
                                   "to the SLO batch). Each artefact is reloaded and checked against the eager model.")
    e.add_argument("--model", choices=["recsys", "gpt"], default="recsys",
                   help="recsys: the DLRM-style click model; gpt: a reference GPT of --size (with --weights, "
                        "the size it was trained at)")
    e.add_argument("--size", default="cpu-student", help="reference GPT size (for --model gpt)")
    e.add_argument("--weights", help="a state_dict .pt to load (weights_only); default: fresh random weights")
    e.add_argument("--out", default="out/export", help="output folder (default out/export)")
    e.add_argument("--max-batch", type=int, help="Triton max_batch_size (default 1024)")
    e.add_argument("--slo-from", metavar="DIR", help="take the batch from `overdrive bench --workload inference` results")
    e.add_argument("--no-onnx", action="store_true", help="skip ONNX (Triton then gets TorchScript on libtorch)")
    e.set_defaults(func=_cmd_export)
