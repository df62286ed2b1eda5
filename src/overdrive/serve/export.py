"""`overdrive export`: a model for serving — torch.export (.pt2), ONNX when onnx/onnxruntime are
installed, and a Triton Inference Server model repository whose dynamic batching is sized from the
measured SLO batch. Every artefact is reloaded and checked against the eager model before the
export is called done.
"""

from __future__ import annotations

import json
import os

import torch
from torch import nn

from overdrive.io import write_atomic

__all__ = ["export_for_serving", "ExportError", "triton_config", "slo_batch_from"]


class ExportError(RuntimeError):
    """An export that failed its round trip, or bad input to the export; the message says which."""


class GPTServing(nn.Module):
    """Next-token logits of the last position: input_ids (B, T) int64 -> logits (B, V)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids)[0][:, -1]


class ClickServing(nn.Module):
    """DLRMServing with a (B, 1) output, as Triton expects of a batched model with one value per example."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        from overdrive.recsys import DLRMServing

        self.model = DLRMServing(model)

    def forward(self, dense: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        return self.model(dense, ids).unsqueeze(1)


def _gpt_sizes_that_fit(sd: dict) -> list[str]:
    """The named GPT sizes whose parameter shapes are those of `sd` (built on the meta device: no memory)."""
    from overdrive.models import GPT, GPT_SIZES

    shapes = {k: tuple(v.shape) for k, v in sd.items() if hasattr(v, "shape")}
    out = []
    for name, cfg in GPT_SIZES.items():
        with torch.device("meta"):
            ref = {k: tuple(v.shape) for k, v in GPT(cfg).state_dict().items()}
        if ref == shapes:
            out.append(name)
    return out


def _load_weights(model: nn.Module, weights: str, what: str, fits=None) -> None:
    """Load a state_dict file, or say in one line why it does not fit (never a 30-line traceback)."""
    if not os.path.isfile(weights):
        raise ExportError(f"--weights {weights} is not a file: pass a state_dict .pt (e.g. from `overdrive train "
                          "CONFIG --export model.pt`)")
    try:
        from overdrive.checkpoint import load_tensors

        sd = load_tensors(weights)  # weights_only: no code runs from the file
    except Exception as e:  # not a torch file, or not a plain state_dict
        raise ExportError(f"--weights {weights} does not fit: it is not a plain state_dict ({type(e).__name__}); write one with "
                          f"`overdrive train CONFIG --export {weights}`") from None
    if not isinstance(sd, dict):
        raise ExportError(f"--weights {weights} does not fit: it holds a {type(sd).__name__}, not a state_dict; write one with "
                          f"`overdrive train CONFIG --export {weights}`")
    try:
        model.load_state_dict(sd)
    except (RuntimeError, TypeError, AttributeError, KeyError):
        sizes = fits(sd) if fits and isinstance(sd, dict) else []
        hint = f": it holds a {' / '.join(sizes)} GPT, pass --size {sizes[0]}" if sizes else \
            ": pass the --model/--size it was trained as"
        raise ExportError(f"--weights {weights} does not fit {what}{hint}") from None


def _build(kind: str, size: str, weights: str | None):
    """(serving module, example inputs, input names/dims/types, output name/dims, dynamic dims)."""
    if kind == "recsys":
        from overdrive.recsys import DLRM, padded_ids, synthetic_clicks

        model = DLRM()
        if weights:
            _load_weights(model, weights, "the click model")
        b = synthetic_clicks(8, seed=1)
        inputs = (b.dense, padded_ids(b, 5))
        spec = {"inputs": [("dense", [13], "TYPE_FP32"), ("ids", [26, 5], "TYPE_INT64")],
                "output": ("prob", [1], "TYPE_FP32")}
        return ClickServing(model).eval(), inputs, spec, {"dense": {0: "batch"}, "ids": {0: "batch"}}
    if kind == "gpt":
        from overdrive.models import GPT, gpt_config

        cfg = gpt_config(size)
        model = GPT(cfg)
        if weights:
            _load_weights(model, weights, f"a {size!r} GPT", fits=_gpt_sizes_that_fit)
        inputs = (torch.randint(0, cfg.vocab_size, (2, 16)),)
        spec = {"inputs": [("input_ids", [-1], "TYPE_INT64")], "output": ("logits", [cfg.vocab_size], "TYPE_FP32")}
        return GPTServing(model).eval(), inputs, spec, {"input_ids": {0: "batch", 1: "seq"}}
    raise ExportError(f"unknown model kind {kind!r}: use recsys or gpt")


def _dims(dynamic: dict, max_batch: int, block: int) -> dict:
    out = {}
    for name, axes in dynamic.items():
        out[name] = {ax: torch.export.Dim(f"{label}", min=1 if label == "batch" else 2,
                                          max=max_batch if label == "batch" else block)
                     for ax, label in axes.items()}
    return out


def _check(fn, eager: nn.Module, fresh_inputs: tuple, what: str) -> float:
    with torch.no_grad():
        ref = eager(*fresh_inputs)
        got = torch.as_tensor(fn(*fresh_inputs))
    err = float((got.float() - ref.float()).abs().max())
    if not torch.allclose(got.float(), ref.float(), atol=1e-4, rtol=1e-4):
        raise ExportError(f"{what} differs from the eager model (max abs error {err:.3g})")
    return err


def triton_config(name: str, platform: str, spec: dict, max_batch: int) -> str:
    """config.pbtxt with dynamic batching up to the SLO batch."""
    def dims(d):
        return "[ " + ", ".join(str(x) for x in d) + " ]"

    ins = "\n".join(f'  {{ name: "{n}" data_type: {t} dims: {dims(d)} }}' for n, d, t in spec["inputs"])
    on, od, ot = spec["output"]
    pref = sorted({max(1, max_batch // 4), max(1, max_batch // 2), max_batch})
    return (f'name: "{name}"\nplatform: "{platform}"\nmax_batch_size: {max_batch}\n'
            f"input [\n{ins}\n]\noutput [\n  {{ name: \"{on}\" data_type: {ot} dims: {dims(od)} }}\n]\n"
            f"dynamic_batching {{\n  preferred_batch_size: [ {', '.join(map(str, pref))} ]\n"
            f"  max_queue_delay_microseconds: 500\n}}\ninstance_group [ {{ count: 1 }} ]\n")


def slo_batch_from(path: str, workload: str) -> int:
    """The best SLO batch of a workload in an `overdrive bench --workload inference` results.json."""
    p = os.path.join(path, "results.json") if os.path.isdir(path) else path
    try:
        with open(p) as f:
            res = json.load(f)
        b = res["workloads"][workload]["best"]["batch"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ExportError(f"--slo-from {path}: not an inference bench result with workload {workload} ({e})") \
            from None
    if not b:
        raise ExportError(f"--slo-from {path}: no batch met the SLO for {workload}; pass --max-batch")
    return int(b)


def _external_data(onnx_path: str) -> list[str]:
    """The files next to an ONNX model that hold its weights (the dynamo exporter writes model.onnx.data)."""
    import onnx

    m = onnx.load(onnx_path, load_external_data=False)
    names = {e.value for t in m.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL
             for e in t.external_data if e.key == "location"}
    return sorted(names)


def _ort_runner(path: str):
    """Run an ONNX file with onnxruntime, loaded from where it was written."""
    import onnxruntime as ort

    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    return lambda *xs: sess.run(None, {n: x.numpy() for n, x in zip(names, xs)})[0]


def export_for_serving(kind: str, out_dir: str, *, size: str = "cpu-student", weights: str | None = None,
                       max_batch: int = 1024, onnx: bool | None = None) -> dict:
    """Write model.pt2 (+ model.onnx) and a Triton repository under out_dir; returns what was written.

    onnx=None: export ONNX when onnx, onnxscript and onnxruntime import; True: require it.
    """
    if max_batch < 1:
        raise ExportError(f"max batch (--max-batch) must be >= 1, got {max_batch}")
    module, inputs, spec, dynamic = _build(kind, size, weights)
    block = module.model.config.block_size if kind == "gpt" else 1 << 16
    os.makedirs(out_dir, exist_ok=True)
    name = "click_model" if kind == "recsys" else f"gpt_{size.replace('-', '_')}"
    report: dict = {"kind": kind, "name": name, "max_batch": max_batch, "files": [], "checks": {}}
    # A different batch size (and sequence length) than the example, to prove the dims are dynamic.
    if kind == "recsys":
        from overdrive.recsys import padded_ids, synthetic_clicks

        b = synthetic_clicks(min(max_batch, 13), seed=7)
        fresh = (b.dense, padded_ids(b, 5))
    else:
        fresh = (torch.randint(0, module.model.config.vocab_size, (3, 11)),)

    ep = torch.export.export(module, inputs, dynamic_shapes=_dims(dynamic, max_batch, block))
    pt2 = os.path.join(out_dir, "model.pt2")
    torch.export.save(ep, pt2)
    report["files"].append(pt2)
    report["checks"]["torch.export"] = _check(torch.export.load(pt2).module(), module, fresh, "model.pt2")

    from overdrive.env import get_env

    st = get_env().engine("onnx")
    have_onnx = onnx is not False and st.ok
    if onnx and not st.ok:
        raise ExportError(f"ONNX export needs onnx, onnxscript and onnxruntime ({st.status}: {st.reason}): {st.fix}")
    if onnx is None and not st.ok:
        report["onnx"] = f"skipped: {st.reason} ({st.fix})"
    if have_onnx:
        path = os.path.join(out_dir, "model.onnx")
        torch.onnx.export(module, inputs, path, input_names=[n for n, _, _ in spec["inputs"]],
                          output_names=[spec["output"][0]], dynamic_shapes=_dims(dynamic, max_batch, block),
                          dynamo=True)
        report["checks"]["onnxruntime"] = _check(_ort_runner(path), module, fresh, "model.onnx under onnxruntime")
        report["files"] += [path] + [os.path.join(out_dir, n) for n in _external_data(path)]

    # Triton: the ONNX model on onnxruntime when we have it, else TorchScript on libtorch.
    repo = os.path.join(out_dir, "triton", name)
    os.makedirs(os.path.join(repo, "1"), exist_ok=True)
    if have_onnx:
        platform, model_file = "onnxruntime_onnx", os.path.join(repo, "1", "model.onnx")
        # The model and every external-data file it names (model.onnx.data): Triton loads the folder alone.
        for name in ["model.onnx", *_external_data(os.path.join(out_dir, "model.onnx"))]:
            with open(os.path.join(out_dir, name), "rb") as f:
                write_atomic(os.path.join(repo, "1", name), f.read())
            if name != "model.onnx":
                report["files"].append(os.path.join(repo, "1", name))
        report["checks"]["triton onnxruntime"] = _check(_ort_runner(model_file), module, fresh,
                                                        "the Triton copy of model.onnx under onnxruntime")
    else:
        platform, model_file = "pytorch_libtorch", os.path.join(repo, "1", "model.pt")
        traced = torch.jit.trace(module, inputs, check_trace=False)
        traced.save(model_file)
        report["checks"]["torchscript"] = _check(torch.jit.load(model_file), module, fresh, "TorchScript model.pt")
    cfg_path = os.path.join(repo, "config.pbtxt")
    write_atomic(cfg_path, triton_config(name, platform, spec, max_batch))
    report["files"] += [model_file, cfg_path]
    report["triton_platform"] = platform
    write_atomic(os.path.join(out_dir, "export.json"), json.dumps(report, indent=1))
    return report
