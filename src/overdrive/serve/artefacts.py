"""The exported files of a served model and how each is proved: torch.export's dynamic dims, the ONNX
export (dynamo) with its external data, ONNX Runtime sessions, and the check of an exported artefact
against the eager model on inputs it was not exported with."""

from __future__ import annotations

import os

import torch
from torch import nn

from overdrive.serve.errors import ExportError, first_line

__all__ = ["export_onnx", "external_data", "ort_session", "ort_runner", "export_dims", "check_against_eager"]


def export_dims(dynamic: dict, max_batch: int, limits: dict | None = None) -> tuple:
    """torch.export Dims: the batch up to max_batch (at least 2: the example batch), others up to their
    limit if the model has one (a GPT's sequence: its block size). torch.export wants one dynamic-shape
    entry per parameter of forward (the served modules take their inputs as named parameters, one per
    input)."""
    limits = limits or {}
    # A tuple in input order, not a dict by name: a wrapper's forward(*xs) has no such names.
    return tuple({ax: torch.export.Dim(label, min=1, max=max(2, max_batch)) if label == "batch"
                  else torch.export.Dim(label, min=1, **({"max": limits[label]} if label in limits else {}))
                  for ax, label in axes.items()}
                 for axes in dynamic.values())


def external_data(onnx_path: str) -> list[str]:
    """The files next to an ONNX model that hold its weights (the dynamo exporter writes model.onnx.data)."""
    import onnx

    m = onnx.load(onnx_path, load_external_data=False)
    names = {e.value for t in m.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL
             for e in t.external_data if e.key == "location"}
    return sorted(names)


def ort_session(path: str, providers: list[str] | None = None, *, threads: int | None = None):
    """An onnxruntime session of an ONNX file loaded from where it lies (external data beside it);
    `threads`: its intra-op threads (the same as torch's when engines are compared)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    if threads:
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
    return ort.InferenceSession(path, sess_options=so, providers=providers or ["CPUExecutionProvider"])


def ort_runner(path: str):
    """fn(*tensors) -> the ONNX model's outputs as tensors, run by onnxruntime on the CPU."""
    sess = ort_session(path)
    names = [i.name for i in sess.get_inputs()]
    return lambda *xs: tuple(torch.from_numpy(o) for o in sess.run(None, {n: x.numpy() for n, x in zip(names, xs)}))


def export_onnx(module: nn.Module, inputs: tuple, path: str, spec: dict, dynamic: dict, max_batch: int,
                limits: dict | None = None) -> list[str]:
    """torch.onnx (dynamo) with the dynamic dims named; returns the files written (model + external data)."""
    torch.onnx.export(module, inputs, path, input_names=[n for n, _, _ in spec["inputs"]],
                      output_names=[n for n, _, _ in spec["outputs"]],
                      dynamic_shapes=export_dims(dynamic, max_batch, limits), dynamo=True)
    return [path] + [os.path.join(os.path.dirname(path), n) for n in external_data(path)]


def _as_tuple(x) -> tuple:
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def check_against_eager(fn, eager: nn.Module, fresh_inputs: tuple, what: str) -> float:
    """Max abs error of `fn` against the eager model on inputs it was not exported with (fp32: 1e-4)."""
    b = fresh_inputs[0].shape[0] if fresh_inputs and hasattr(fresh_inputs[0], "shape") else "?"
    try:
        with torch.no_grad():
            ref = _as_tuple(eager(*fresh_inputs))
    except Exception as e:  # noqa: BLE001 — the user's model raised on a later call: one line, nothing written
        raise ExportError(f"the model raised {first_line(e)} when called again (a batch of {b}, to check {what}): it "
                          "must answer every call") from None
    try:
        with torch.no_grad():
            got = _as_tuple(fn(*fresh_inputs))
    except Exception as e:  # noqa: BLE001
        raise ExportError(f"{what} fails on a batch of {b}: {first_line(e)}") from None
    err = 0.0
    for r, g in zip(ref, got):
        g = torch.as_tensor(g)
        if g.shape != r.shape:
            raise ExportError(f"{what} returns shape {tuple(g.shape)}, the eager model {tuple(r.shape)}")
        err = max(err, float((g.float() - r.float()).abs().max()))
        if not torch.allclose(g.float(), r.float(), atol=1e-4, rtol=1e-4):
            raise ExportError(f"{what} differs from the eager model (max abs error {err:.3g})")
    return err
