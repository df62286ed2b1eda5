"""A user's model for serving: FILE.py:FACTORY with example inputs from FILE.py:FN(batch), loaded the
way `tune` loads them, its inputs checked (a tensor or a tuple of tensors, batch first, only the batch
and the axes named by --dynamic varying) and its answers checked independent of their batch
neighbours, before anything is exported or timed."""

from __future__ import annotations

import inspect

import torch
from torch import nn

from overdrive.serve.errors import ExportError, first_line
from overdrive.serve.identity import model_identity
from overdrive.serve.neighbours import check_batch_independent
from overdrive.serve.served_model import ServedModel, load_weights

__all__ = ["user_model", "user_served_model", "parse_dynamic"]

_TRITON_TYPES = {"float32": "TYPE_FP32", "float16": "TYPE_FP16", "bfloat16": "TYPE_BF16", "float64": "TYPE_FP64",
                 "int64": "TYPE_INT64", "int32": "TYPE_INT32", "int16": "TYPE_INT16", "int8": "TYPE_INT8",
                 "uint8": "TYPE_UINT8", "bool": "TYPE_BOOL"}


def _triton_type(t: torch.Tensor, what: str) -> str:
    name = str(t.dtype).removeprefix("torch.")
    if name not in _TRITON_TYPES:
        raise ExportError(f"{what} has dtype {name}, which Triton has no type for: return one of "
                          f"{', '.join(_TRITON_TYPES)}")
    return _TRITON_TYPES[name]


def parse_dynamic(items: list[str] | None, names: list[str]) -> dict[str, dict[int, str]]:
    """["ids:2", "1:2"] -> {input name: {axis: label}}; the batch axis 0 is always dynamic."""
    out: dict[str, dict[int, str]] = {n: {0: "batch"} for n in names}
    for item in items or []:
        who, sep, ax = item.rpartition(":")
        if not sep or not ax.isdigit() or int(ax) < 1:
            raise ExportError(f"--dynamic {item!r} is not INPUT:AXIS with AXIS >= 1 (e.g. ids:2; axis 0, the batch, is "
                              "always dynamic)")
        name = names[int(who)] if who.isdigit() and int(who) < len(names) else who
        if name not in out:
            raise ExportError(f"--dynamic {item!r}: the model has no input {who!r} (its inputs: {', '.join(names)})")
        out[name][int(ax)] = f"{name}_{ax}"
    return out


def _load(factory: str, inputs: str | None, weights: str | None):
    """(the factory's nn.Module with `weights` loaded, FN): the user's two functions, each failure one line."""
    from overdrive.errors import UserError
    from overdrive.tuning.workload import load_file_fn

    if not inputs:
        raise ExportError(f"exporting {factory} needs example inputs: pass --inputs FILE.py:FN, FN(batch) returning a "
                          "tensor or a tuple of tensors whose first dimension is the batch")
    try:
        make, inputs_fn = load_file_fn(factory, "model factory"), load_file_fn(inputs, "--inputs")
    except UserError as e:
        raise ExportError(str(e)) from None
    try:
        model = make()
    except Exception as e:  # noqa: BLE001 — the user's code: one line, not a traceback
        raise ExportError(f"model factory {factory} raised {first_line(e)} (it must take no arguments and return an "
                          "nn.Module)") from None
    if not isinstance(model, nn.Module):
        raise ExportError(f"model factory {factory} returned {type(model).__name__}, not an nn.Module")
    if weights:
        load_weights(model, weights, f"the model of {factory}")
    return model, inputs_fn


def _checked_inputs(inputs_fn, inputs: str):
    """fn(batch, variant=0) -> FN(batch) as a tuple of tensors, batch first, or one line saying what is wrong."""
    def fn(b, v=0):
        try:
            x = inputs_fn(b)
        except Exception as e:  # noqa: BLE001
            raise ExportError(f"--inputs {inputs}({b}) raised {first_line(e)} (FN(batch) returns example inputs, batch "
                              "first)") from None
        if isinstance(x, dict):
            raise ExportError(f"--inputs {inputs} returned a dict: a served model takes positional tensors; return a "
                              "tuple in the order of the model's forward arguments")
        x = (x,) if isinstance(x, torch.Tensor) else tuple(x) if isinstance(x, (tuple, list)) else None
        if not x or not all(isinstance(t, torch.Tensor) for t in x):
            raise ExportError(f"--inputs {inputs} must return a tensor or a tuple of tensors for FN(batch)")
        if any(t.dim() == 0 or t.shape[0] != b for t in x):
            raise ExportError(f"--inputs {inputs}({b}) returned shapes {[tuple(t.shape) for t in x]}: the first "
                              f"dimension of every input must be the batch ({b})")
        return x
    return fn


def _input_names(model: nn.Module, ex: tuple) -> list[str]:
    """The names of forward's positional parameters the inputs fill, else input0, input1, ..."""
    params = [p for p in inspect.signature(model.forward).parameters.values()
              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return [p.name for p in params[:len(ex)]] if len(params) >= len(ex) else [f"input{i}" for i in range(len(ex))]


def _check_axes(names: list[str], dyn: dict, ex: tuple) -> None:
    for n, t in zip(names, ex):
        bad = [ax for ax in dyn[n] if ax >= t.dim()]
        if bad:
            raise ExportError(f"--dynamic {n}:{bad[0]}: input {n!r} has {t.dim()} dimensions (shape "
                              f"{tuple(t.shape)} at batch 2), so its axes are 1..{t.dim() - 1}")


def _check_fixed(names: list[str], dyn: dict, ex: tuple, ex3: tuple, inputs: str) -> None:
    """Only the batch and the --dynamic axes may differ between the inputs at batch 2 and at batch 3."""
    for n, t2, t3 in zip(names, ex, ex3):
        moved = t3.dim() != t2.dim() or any(a not in dyn[n] and t3.shape[a] != t2.shape[a] for a in range(1, t2.dim()))
        if moved:
            raise ExportError(f"--inputs {inputs}: input {n!r} is {tuple(t2.shape)} at batch 2 and {tuple(t3.shape)} "
                              f"at batch 3: only the batch may change with the batch (pass --dynamic {n}:AXIS for an "
                              "axis that varies per request, or return the same width at every batch)")


def _spec(names: list[str], dyn: dict, ex: tuple, outs: tuple) -> dict:
    """The I/O as config.pbtxt names it: dims without the batch, -1 for a --dynamic axis."""
    return {"inputs": [(n, [-1 if a + 1 in dyn[n] else d for a, d in enumerate(t.shape[1:])],
                        _triton_type(t, f"input {n}")) for n, t in zip(names, ex)],
            # a (B,) output keeps its shape: [] here is dims [ 1 ] with reshape [ ] in config.pbtxt
            "outputs": [(f"output{i}" if len(outs) > 1 else "output", [d for d in t.shape[1:]],
                         _triton_type(t, f"output {i}")) for i, t in enumerate(outs)]}


def user_model(factory: str, inputs: str | None, weights: str | None, dynamic: list[str] | None):
    """(module, inputs_fn(batch, variant), spec, dynamic dims) of a user's FILE.py:FACTORY, with example
    inputs from FILE.py:FN(batch), loaded the way `tune` loads them."""
    model, inputs_fn = _load(factory, inputs, weights)
    fn = _checked_inputs(inputs_fn, inputs)
    model = model.eval()
    ex = fn(2)
    names = _input_names(model, ex)
    dyn = parse_dynamic(dynamic, names)
    _check_axes(names, dyn, ex)
    ex3 = fn(3)
    _check_fixed(names, dyn, ex, ex3, inputs)
    outs = check_batch_independent(model, [ex, ex3], what=f"the model of {factory}", on=f"--inputs {inputs}")
    return model, fn, _spec(names, dyn, ex, outs), dyn


def user_served_model(factory: str, inputs: str | None, *, dynamic: list[str] | None = None,
                      weights: str | None = None) -> ServedModel:
    """A user's FILE.py:FACTORY with FILE.py:FN(batch) example inputs, as `export` loads it."""
    module, fn, spec, dyn = user_model(factory, inputs, weights, dynamic)
    n = sum(p.numel() for p in module.parameters())
    shapes = ", ".join(f"{name} {list(d)}" for name, d, _ in spec["inputs"])
    return ServedModel(module, fn, spec, dyn, f"{factory} ({n:,} parameters; inputs per request: {shapes})",
                       model_identity(factory, inputs, dynamic, resolved=dyn))
