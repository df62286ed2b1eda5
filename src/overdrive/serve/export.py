"""`overdrive export`: a model for serving — torch.export (.pt2), ONNX when onnx/onnxruntime are
installed, and a Triton Inference Server model repository whose dynamic batching is sized from the
measured SLO batch. Every artefact is reloaded and checked against the eager model before the
export is called done.
"""

from __future__ import annotations

import io
import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from overdrive.io import write_atomic
from overdrive.serve.triton_config import triton_config

__all__ = ["export_for_serving", "ExportError", "triton_config", "slo_batch_from", "batching_from", "export_onnx",
           "click_inputs", "default_batching", "ort_session"]


class ExportError(RuntimeError):
    """An export that failed its round trip, or bad input to the export; the message says which."""


def _first(e: BaseException) -> str:
    """'TypeError: the first line of its message': what a one-line error quotes of an exception."""
    return f"{type(e).__name__}: {str(e).strip().splitlines()[0][:200] if str(e).strip() else ''}"


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


_TRITON_TYPES = {"float32": "TYPE_FP32", "float16": "TYPE_FP16", "bfloat16": "TYPE_BF16", "float64": "TYPE_FP64",
                 "int64": "TYPE_INT64", "int32": "TYPE_INT32", "int16": "TYPE_INT16", "int8": "TYPE_INT8",
                 "uint8": "TYPE_UINT8", "bool": "TYPE_BOOL"}


def _triton_type(t: torch.Tensor, what: str) -> str:
    name = str(t.dtype).removeprefix("torch.")
    if name not in _TRITON_TYPES:
        raise ExportError(f"{what} has dtype {name}, which Triton has no type for: return one of "
                          f"{', '.join(_TRITON_TYPES)}")
    return _TRITON_TYPES[name]


CLICK_SPEC = {"inputs": [("dense", [13], "TYPE_FP32"), ("ids", [26, -1], "TYPE_INT64")],
              "outputs": [("prob", [1], "TYPE_FP32")]}
"""The click model's inputs and outputs as config.pbtxt names them (-1: the bag length is dynamic)."""
CLICK_DYNAMIC = {"dense": {0: "batch"}, "ids": {0: "batch", 2: "bag"}}


def click_inputs(batch: int, bag: int, *, seed: int = 1, spec=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(dense (B, 13) fp32, ids (B, 26, bag) int64 padded with -1): what the click model is served."""
    from overdrive.recsys import CriteoSpec, padded_ids, synthetic_clicks

    b = synthetic_clicks(batch, spec or CriteoSpec(), seed=seed)
    return b.dense, padded_ids(b, bag)


def _builtin(kind: str, size: str, weights: str | None, bag_len: int):
    """(serving module, inputs_fn(batch, variant), spec, dynamic dims) of a built-in model."""
    if kind == "recsys":
        from overdrive.recsys import DLRM

        model = DLRM()
        if weights:
            _load_weights(model, weights, "the click model")
        # variant 1: another bag length than the example, to prove that dimension is dynamic too.
        fn = lambda b, v=0: click_inputs(b, bag_len + 3 * v, seed=1 + 6 * v)  # noqa: E731
        return ClickServing(model).eval(), fn, CLICK_SPEC, CLICK_DYNAMIC
    if kind == "gpt":
        from overdrive.models import GPT, gpt_config

        cfg = gpt_config(size)
        model = GPT(cfg)
        if weights:
            _load_weights(model, weights, f"a {size!r} GPT", fits=_gpt_sizes_that_fit)
        gen = torch.Generator().manual_seed(0)
        fn = lambda b, v=0: (torch.randint(0, cfg.vocab_size, (b, 16 - 5 * v), generator=gen),)  # noqa: E731
        spec = {"inputs": [("input_ids", [-1], "TYPE_INT64")], "outputs": [("logits", [cfg.vocab_size], "TYPE_FP32")]}
        return GPTServing(model).eval(), fn, spec, {"input_ids": {0: "batch", 1: "seq"}}
    raise ExportError(f"unknown model kind {kind!r}: use recsys or gpt, or FILE.py:FACTORY for your own model")


def _parse_dynamic(items: list[str] | None, names: list[str]) -> dict[str, dict[int, str]]:
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


def _user(factory: str, inputs: str | None, weights: str | None, dynamic: list[str] | None):
    """A user's FILE.py:FACTORY, with example inputs from FILE.py:FN(batch), loaded the way `tune` loads them."""
    import inspect

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
        raise ExportError(f"model factory {factory} raised {_first(e)} (it must take no arguments and return an "
                          "nn.Module)") from None
    if not isinstance(model, nn.Module):
        raise ExportError(f"model factory {factory} returned {type(model).__name__}, not an nn.Module")
    if weights:
        _load_weights(model, weights, f"the model of {factory}")

    def fn(b, v=0):
        try:
            x = inputs_fn(b)
        except Exception as e:  # noqa: BLE001
            raise ExportError(f"--inputs {inputs}({b}) raised {_first(e)} (FN(batch) returns example inputs, batch "
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

    model = model.eval()
    ex = fn(2)
    params = [p for p in inspect.signature(model.forward).parameters.values()
              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    names = [p.name for p in params[:len(ex)]] if len(params) >= len(ex) else [f"input{i}" for i in range(len(ex))]
    dyn = _parse_dynamic(dynamic, names)
    for n, t in zip(names, ex):
        bad = [ax for ax in dyn[n] if ax >= t.dim()]
        if bad:
            raise ExportError(f"--dynamic {n}:{bad[0]}: input {n!r} has {t.dim()} dimensions (shape "
                              f"{tuple(t.shape)} at batch 2), so its axes are 1..{t.dim() - 1}")
    ex3 = fn(3)
    for n, t2, t3 in zip(names, ex, ex3):
        moved = t3.dim() != t2.dim() or any(a not in dyn[n] and t3.shape[a] != t2.shape[a] for a in range(1, t2.dim()))
        if moved:
            raise ExportError(f"--inputs {inputs}: input {n!r} is {tuple(t2.shape)} at batch 2 and {tuple(t3.shape)} "
                              f"at batch 3: only the batch may change with the batch (pass --dynamic {n}:AXIS for an "
                              "axis that varies per request, or return the same width at every batch)")
    from overdrive.serve.neighbours import check_batch_independent

    outs = check_batch_independent(model, [ex, ex3], what=f"the model of {factory}", on=f"--inputs {inputs}")
    spec = {"inputs": [(n, [-1 if a + 1 in dyn[n] else d for a, d in enumerate(t.shape[1:])],
                        _triton_type(t, f"input {n}")) for n, t in zip(names, ex)],
            # a (B,) output keeps its shape: [] here is dims [ 1 ] with reshape [ ] in config.pbtxt
            "outputs": [(f"output{i}" if len(outs) > 1 else "output", [d for d in t.shape[1:]],
                         _triton_type(t, f"output {i}")) for i, t in enumerate(outs)]}
    return model, fn, spec, dyn


@dataclass
class ServedModel:
    """A model as a server runs it: the module, example inputs per batch, its I/O as config.pbtxt names
    them, the variable axes, and what identifies it (a bench's results and an export must be of one model)."""

    module: nn.Module
    inputs: Callable[..., tuple]
    """inputs(batch) -> a tuple of host tensors, batch first (a user's model: inputs(batch, 1) is the variant
    with other sizes of its dynamic axes that export checks with)."""
    spec: dict
    dynamic: dict
    description: str
    identity: dict


def _sha256(path: str) -> str:
    import hashlib

    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def model_identity(factory: str, inputs: str | None, dynamic: list[str] | None = None, *,
                   resolved: dict | None = None) -> dict:
    """{"factory": "FILE.py:FN", "inputs": ..., "sha256": {file name: digest}, "given": the arguments as
    typed}: the functions by file name (a relative or absolute path to the same file is the same model)
    and the files' contents (an edited model file is another model). Modules the file imports are not
    hashed. `same_model` compares two."""
    files = {}
    for ref in (factory, inputs):
        if ref:
            path = ref.rpartition(":")[0]
            try:
                files[os.path.basename(path)] = _sha256(path)
            except OSError as e:
                raise ExportError(f"cannot read {path}: {e.strerror}") from None

    def name(ref):
        return f"{os.path.basename(ref.rpartition(':')[0])}:{ref.rpartition(':')[2]}" if ref else None

    out = {"factory": name(factory), "inputs": name(inputs), "sha256": files,
           "given": {"factory": factory, "inputs": inputs, "dynamic": list(dynamic or [])}}
    if resolved is not None:  # the variable axes by input name (--dynamic 0:1 and ids:1 are one axis)
        out["axes"] = sorted(f"{n}:{ax}" for n, axes in resolved.items() for ax in axes if ax)
    return out


CLICK_IDENTITY = {"builtin": "click"}
"""The built-in click model's identity (results written before identities were recorded measured it too)."""


def same_model(measured: dict | None, exporting: dict) -> str | None:
    """None when a bench's serving results (`measured`: their model_identity) are of the model being
    exported, else what differs, in words."""
    measured = measured or CLICK_IDENTITY

    def what(i):
        return "the built-in click model" if i.get("builtin") else f"{i['factory']} with inputs {i.get('inputs')}"

    if bool(measured.get("builtin")) != bool(exporting.get("builtin")) or \
            measured.get("factory") != exporting.get("factory") or measured.get("inputs") != exporting.get("inputs"):
        return f"it measured {what(measured)}, not {what(exporting)}"
    if "axes" in measured and "axes" in exporting:
        dyn = [measured["axes"], exporting["axes"]]
    else:
        dyn = [sorted((i.get("given") or {}).get("dynamic") or []) for i in (measured, exporting)]
    if dyn[0] != dyn[1]:  # another set of dynamic axes is another ONNX graph than the one timed
        return (f"it measured {what(measured)} with --dynamic {' '.join(dyn[0]) or '(none)'}, not "
                f"{' '.join(dyn[1]) or '(none)'}")
    changed = [f for f, h in (exporting.get("sha256") or {}).items() if (measured.get("sha256") or {}).get(f) != h]
    if changed:
        return f"{', '.join(changed)} changed since it was measured (sha256 differs)"
    return None


def user_served_model(factory: str, inputs: str | None, *, dynamic: list[str] | None = None,
                      weights: str | None = None) -> ServedModel:
    """A user's FILE.py:FACTORY with FILE.py:FN(batch) example inputs, as `export` loads it."""
    module, fn, spec, dyn = _user(factory, inputs, weights, dynamic)
    n = sum(p.numel() for p in module.parameters())
    shapes = ", ".join(f"{name} {list(d)}" for name, d, _ in spec["inputs"])
    return ServedModel(module, fn, spec, dyn, f"{factory} ({n:,} parameters; inputs per request: {shapes})",
                       model_identity(factory, inputs, dynamic, resolved=dyn))


def _dims(dynamic: dict, max_batch: int, limits: dict | None = None) -> tuple:
    """torch.export Dims: the batch up to max_batch (at least 2: the example batch), others up to their
    limit if the model has one (a GPT's sequence: its block size)."""
    limits = limits or {}
    # A tuple in input order, not a dict by name: a wrapper's forward(*xs) has no such names.
    return tuple({ax: torch.export.Dim(label, min=1, max=max(2, max_batch)) if label == "batch"
                  else torch.export.Dim(label, min=1, **({"max": limits[label]} if label in limits else {}))
                  for ax, label in axes.items()}
                 for axes in dynamic.values())


def _shapes_for(module: nn.Module, dims: tuple) -> tuple:
    """torch.export wants one dynamic-shape entry per parameter of forward (the served modules take their
    inputs as named parameters, one per input)."""
    return dims


def _as_tuple(x) -> tuple:
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def _check(fn, eager: nn.Module, fresh_inputs: tuple, what: str) -> float:
    """Max abs error of `fn` against the eager model on inputs it was not exported with (fp32: 1e-4)."""
    b = fresh_inputs[0].shape[0] if fresh_inputs and hasattr(fresh_inputs[0], "shape") else "?"
    try:
        with torch.no_grad():
            ref = _as_tuple(eager(*fresh_inputs))
    except Exception as e:  # noqa: BLE001 — the user's model raised on a later call: one line, nothing written
        raise ExportError(f"the model raised {_first(e)} when called again (a batch of {b}, to check {what}): it "
                          "must answer every call") from None
    try:
        with torch.no_grad():
            got = _as_tuple(fn(*fresh_inputs))
    except Exception as e:  # noqa: BLE001
        raise ExportError(f"{what} fails on a batch of {b}: {_first(e)}") from None
    err = 0.0
    for r, g in zip(ref, got):
        g = torch.as_tensor(g)
        if g.shape != r.shape:
            raise ExportError(f"{what} returns shape {tuple(g.shape)}, the eager model {tuple(r.shape)}")
        err = max(err, float((g.float() - r.float()).abs().max()))
        if not torch.allclose(g.float(), r.float(), atol=1e-4, rtol=1e-4):
            raise ExportError(f"{what} differs from the eager model (max abs error {err:.3g})")
    return err


def default_batching(max_batch: int) -> dict:
    """Triton's own defaults (no preferred sizes, no delay): what `export` writes when nothing was measured."""
    return {"max_batch_size": max_batch, "preferred_batch_size": [], "max_queue_delay_us": 0, "instances": 1,
            "source": "Triton's defaults (not measured): pass --slo-from DIR of `overdrive bench --workload inference`"}


def batching_from(path: str, workload: str, engine: str = "onnxruntime", *, model: dict | None = None) -> dict:
    """The batcher settings measured by `overdrive bench --workload inference` (results.json or its folder):
    for the click model or a user's model (`model`: its `model_identity`; the results must be of that
    model), the serving search of `engine` (what Triton runs: ONNX Runtime); for the GPT, the largest
    fixed batch under the SLO."""
    p = os.path.join(path, "results.json") if os.path.isdir(path) else path
    try:
        with open(p) as f:
            res = json.load(f)
        slo = res["slo_ms"]
        if not (isinstance(slo, (int, float)) and not isinstance(slo, bool) and math.isfinite(slo) and slo > 0):
            raise ExportError(f"--slo-from {path}: slo_ms {slo!r} is not a positive number of milliseconds; re-run "
                              "the bench")
        serving = (res.get("serving") or {}).get("engines") or {}
        if model is not None and not serving:
            raise ExportError(f"--slo-from {path}: no serving results in it (run `overdrive bench --workload "
                              f"inference --model {model['given']['factory']} --inputs {model['given']['inputs']} "
                              "--slo-ms MS --out DIR` first)")
        if (workload == "recsys" or model is not None) and serving:
            sv = res["serving"]
            differs = same_model(sv.get("model_identity"), model or CLICK_IDENTITY)
            if differs:
                raise ExportError(f"--slo-from {path}: {differs}; bench the model you export, or export the one "
                                  "it measured")
            ort = [serving[n] for n in serving if n.startswith(engine) and (serving[n] or {}).get("status") == "ok"]
            if sv.get("withheld") or (ort and all(r.get("withheld") for r in ort)):
                why = sv.get("withheld") or ort[0]["withheld"]
                raise ExportError(f"--slo-from {path}: the bench withheld its verdict ({why}); re-run the bench on a "
                                  "quieter host, or drop --slo-from and pass --max-batch")
            # ONNX Runtime under any execution provider measured (CPU, CUDA, TensorRT): the fastest one.
            ok = [serving[n] for n in serving if n.startswith(engine) and (serving[n] or {}).get("best")]
            for r in ok:
                rate = r["best"].get("rate")
                if not (isinstance(rate, (int, float)) and not isinstance(rate, bool) and math.isfinite(rate)
                        and rate > 0):
                    raise ExportError(f"--slo-from {path}: a measured rate of {rate!r} req/s is no rate; re-run the "
                                      "bench (nothing was written)")
            got = max(ok, key=lambda r: r["best"]["rate"]) if ok else None
            if got is None:
                raise ExportError(f"--slo-from {path}: no setting of {engine} met p99 <= {slo:g} ms; drop --slo-from and "
                                  "pass --max-batch, or bench with a larger --slo-ms")
            c = _valid_setting(got["best"].get("config"), path)
            threads = sv.get("threads")
            if threads is not None and not (_is_int(threads) and 1 <= threads <= MAX_THREADS):
                raise ExportError(f"--slo-from {path}: threads {threads!r} is not a thread count (1..{MAX_THREADS}); "
                                  "re-run the bench (nothing was written)")
            c["threads"] = threads  # the intra-op threads every engine was measured with
            ci = got["best"].get("ci")
            c["source"] = (f"measured: {got['label']} on {res.get('device')}, highest rate {got['best']['rate']:,.0f} "
                           + (f"[{ci[0]:,.0f}-{ci[1]:,.0f}] " if ci else "")
                           + (f"(holds {got['best']['held']:,.0f} in 90% of resamples) "
                              if got["best"].get("held") is not None else "")
                           + f"req/s at p99 <= {slo:g} ms (overdrive bench, {res.get('created')})")
            real = _real_server_source(res, slo, path)
            if real:  # a real tritonserver ran this setting: its measured rate is the evidence, not the simulation's
                c = {**_valid_setting(res["triton"].get("setting"), path), "threads": c["threads"], "source": real}
            # Another engine surely faster (its interval's lower end above ONNX Runtime's upper end): say so,
            # the repository still serves what was asked for (the ONNX model on onnxruntime).
            faster = [(n, r) for n, r in serving.items() if not n.startswith(engine) and isinstance(r, dict)
                      and isinstance(r.get("best"), dict) and r["best"].get("ci") and ci and ci[1] is not None
                      and r["best"]["ci"][0] > ci[1]]
            if faster:
                n, r = max(faster, key=lambda nr: nr[1]["best"]["rate"])
                c["note"] = (f"{r.get('label', n)} served this model faster in the same bench: "
                             f"{r['best']['rate']:,.0f} [{r['best']['ci'][0]:,.0f}-{r['best']['ci'][1]:,.0f}] req/s "
                             f"against {got['best']['rate']:,.0f}; the ONNX graph may be slower here than the model "
                             "(--no-onnx serves TorchScript on libtorch instead)")
            return c
        b = res["workloads"][workload]["best"]["batch"]
    except RecursionError:
        raise ExportError(f"--slo-from {path}: nested too deeply to be bench results; re-run the bench") from None
    except (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError) as e:
        raise ExportError(f"--slo-from {path}: not an inference bench result with workload {workload} "
                          f"({type(e).__name__}: {e}); re-run the bench") from None
    if not b:
        raise ExportError(f"--slo-from {path}: no batch met the SLO for {workload}; pass --max-batch")
    return {**default_batching(int(b)), "source": f"measured: the largest fixed batch with p99 <= {slo:g} ms"}


MAX_THREADS = 4096
"""The most intra-op threads a measured setting may carry (a results file is untrusted: 10^9 was accepted)."""


def _real_server_source(res: dict, slo: float, path: str) -> str | None:
    """Where a bench also ran a real tritonserver (`--server triton`): what it measured, in words."""
    t = res.get("triton")
    if not isinstance(t, dict) or t.get("status") != "ok":
        return None

    def num(x):
        return isinstance(x, (int, float)) and not isinstance(x, bool) and x == x and x >= 0

    got, sim = t.get("measured_rate"), t.get("simulated_rate")
    if not num(sim) or not (got is None or num(got)):
        raise ExportError(f"--slo-from {path}: its real-server result is not one a bench writes (rates "
                          f"{got!r}, {sim!r}); re-run the bench")
    met = f"highest rate {got:,.0f} req/s" if got is not None else "no rate tried"
    return (f"measured on a real tritonserver (python backend, ONNX Runtime): {met} at p99 <= {slo:g} ms with every "
            f"request answered, simulated {sim:,.0f} (overdrive bench --server triton, {res.get('created')})")


MAX_BATCH = 65536
"""The largest max_batch_size export writes: the checks run the model at it, and a batch above this many
requests is no latency setting."""


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _valid_setting(c, path: str) -> dict:
    """A measured batcher setting read from a results file (untrusted): every field in range, or one line."""
    if not isinstance(c, dict):
        raise ExportError(f"--slo-from {path}: its best setting is {type(c).__name__}, not an object; re-run the bench")
    mb, pref = c.get("max_batch_size"), c.get("preferred_batch_size") or []
    delay, inst = c.get("max_queue_delay_us", 0), c.get("instances", 1)
    problems = [] if _is_int(mb) and 1 <= mb <= MAX_BATCH else [f"max_batch_size {mb!r} (an integer 1..{MAX_BATCH})"]
    if not problems and not (isinstance(pref, list) and all(_is_int(p) and 1 <= p <= mb for p in pref)):
        problems.append(f"preferred_batch_size {pref!r} (integers 1..{mb})")
    if not (_is_int(delay) and 0 <= delay <= 10_000_000):
        problems.append(f"max_queue_delay_us {delay!r} (an integer 0..10,000,000)")
    if not (_is_int(inst) and 1 <= inst <= 256):
        problems.append(f"instances {inst!r} (an integer 1..256)")
    if c.get("kind") not in (None, "KIND_CPU", "KIND_GPU"):
        problems.append(f"kind {c.get('kind')!r} (KIND_CPU or KIND_GPU)")
    if problems:
        raise ExportError(f"--slo-from {path}: its best setting is not a batcher setting: {'; '.join(problems)}; "
                          "re-run the bench (nothing was written)")
    return {**c, "preferred_batch_size": list(pref), "max_queue_delay_us": delay, "instances": inst}


def slo_batch_from(path: str, workload: str) -> int:
    """The max batch size of `batching_from` (kept for callers that want the number only)."""
    return int(batching_from(path, workload)["max_batch_size"])


def _external_data(onnx_path: str) -> list[str]:
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


def _ort_runner(path: str):
    sess = ort_session(path)
    names = [i.name for i in sess.get_inputs()]
    return lambda *xs: tuple(torch.from_numpy(o) for o in sess.run(None, {n: x.numpy() for n, x in zip(names, xs)}))


def export_onnx(module: nn.Module, inputs: tuple, path: str, spec: dict, dynamic: dict, max_batch: int,
                limits: dict | None = None) -> list[str]:
    """torch.onnx (dynamo) with the dynamic dims named; returns the files written (model + external data)."""
    torch.onnx.export(module, inputs, path, input_names=[n for n, _, _ in spec["inputs"]],
                      output_names=[n for n, _, _ in spec["outputs"]],
                      dynamic_shapes=_shapes_for(module, _dims(dynamic, max_batch, limits)), dynamo=True)
    return [path] + [os.path.join(os.path.dirname(path), n) for n in _external_data(path)]


def _folder_name(s: str) -> str:
    out = "".join(c if c.isalnum() or c in "_-" else "_" for c in s).strip("_")
    return out or "model"


def export_for_serving(kind: str, out_dir: str, **options) -> dict:
    """Write model.pt2 (+ model.onnx) and a Triton repository under out_dir; returns what was written
    (the options are `_export_into`'s).

    `out_dir` must be new, empty or Overdrive's (`measure.lock.claim_results_dir`: a folder holding the
    user's own files is refused, and its lock keeps a second export, or a running bench/tune, out); no
    entry export writes may be a symbolic link. Everything is written into a hidden staging folder inside
    `out_dir`, checked there, then renamed into place, export.json last: a failed export changes nothing,
    and one cut short has no export.json."""
    from overdrive.io import discard_stage, publish, refuse_links, stage_folder
    from overdrive.measure.lock import claim_results_dir

    lock = claim_results_dir(out_dir, what="overdrive export")
    stage, done = None, False
    try:
        refuse_links(out_dir, [*_OUTPUTS, "triton", "triton_local", "export.json"])
        stage = stage_folder(out_dir)
        report = _export_into(kind, stage, **options)
        report["files"] = [os.path.join(out_dir, os.path.relpath(f, stage)) for f in report["files"]]
        write_atomic(os.path.join(stage, "export.json"), json.dumps(report, indent=1))
        extra = [os.path.relpath(f, out_dir) for f in report["files"] if os.path.dirname(f) == out_dir]
        publish(stage, out_dir, sorted({*_OUTPUTS, *extra, f"triton/{report['name']}", f"triton_local/{report['name']}"}),
                last="export.json")
        done = True
        return report
    except ExportError as e:  # said of the staging folder: name the folder the user gave
        raise ExportError(str(e).replace(stage or "\0", out_dir)) from None
    except OSError as e:
        raise ExportError(f"cannot write the export into {out_dir} ({e.strerror or type(e).__name__}"
                          f"{': ' + e.filename if getattr(e, 'filename', None) else ''}): free space or pass another "
                          "--out (what was there before is kept unless export.json is missing)") from None
    finally:
        if stage is not None:
            discard_stage(stage)
        lock.release() if done else lock.abandon()  # a failed export into a new folder leaves no folder


_OUTPUTS = ("model.pt2", "model.onnx", "model.onnx.data")
"""What an export writes at the top of --out besides triton/ and export.json (an export without ONNX
removes a previous export's model.onnx: a folder never mixes two exports)."""


def _export_into(kind: str, out_dir: str, *, size: str = "cpu-student", weights: str | None = None,
                       max_batch: int | None = None, onnx: bool | None = None, batching: dict | None = None,
                       inputs: str | None = None, dynamic: list[str] | None = None, bag_len: int = 5,
                       served: ServedModel | None = None, server_check: bool = True) -> dict:
    """Write model.pt2 (+ model.onnx) and a Triton repository into out_dir (a staging folder).

    kind: "recsys", "gpt", or "FILE.py:FACTORY" (then `inputs` is "FILE.py:FN", FN(batch) -> example
    inputs, and `dynamic` names further variable axes as INPUT:AXIS). batching: the dynamic batcher
    settings (from `batching_from`); else Triton's defaults at max_batch (1024 when None).
    onnx=None: export ONNX when onnx, onnxscript and onnxruntime import; True: require it.
    server_check: load the python-backend variant in a real tritonserver where one is set up.
    """
    if batching is not None:
        batching = dict(batching)
        if max_batch is not None and max_batch != batching["max_batch_size"]:
            batching["max_batch_size"] = max_batch
            batching["preferred_batch_size"] = [p for p in batching.get("preferred_batch_size") or []
                                                if isinstance(max_batch, int) and p <= max_batch]
            batching["source"] = (f"{batching.get('source', 'measured')}; max_batch_size {max_batch} from --max-batch, not "
                                  "measured (the rate above is the measured setting's)")
    else:
        batching = default_batching(1024 if max_batch is None else max_batch)
    mb = batching["max_batch_size"]
    if not _is_int(mb) or not 1 <= mb <= MAX_BATCH:
        raise ExportError(f"max_batch_size must be an integer 1..{MAX_BATCH}, got {mb!r} (--max-batch, or the "
                          "--slo-from results)")
    if bag_len < 1:
        raise ExportError(f"--bag-len must be >= 1, got {bag_len}")
    from overdrive.env import get_env

    st = get_env().engine("onnx")
    have_onnx = onnx is not False and st.ok
    if onnx and not st.ok:  # before any work
        raise ExportError(f"ONNX export needs onnx, onnxscript and onnxruntime ({st.status}: {st.reason}): {st.fix}")
    if served is not None:  # the user's model, already loaded (export --slo-from checked its identity)
        module, inputs_fn, spec, dyn = served.module, served.inputs, served.spec, served.dynamic
        name = _folder_name(kind.rpartition(":")[2])
    elif ".py:" in kind:
        module, inputs_fn, spec, dyn = _user(kind, inputs, weights, dynamic)
        name = _folder_name(kind.rpartition(":")[2])
    else:
        module, inputs_fn, spec, dyn = _builtin(kind, size, weights, bag_len)
        name = "click_model" if kind == "recsys" else f"gpt_{size.replace('-', '_')}"
    report: dict = {"kind": kind, "name": name, "max_batch": mb, "batching": batching, "files": [], "checks": {},
                    "spec": spec, "shapes": [f"output {n!r}: the model returns (B,) and the exported files keep it; "
                                             "Triton returns it as (B, 1) (config.pbtxt: dims [ 1 ], reshape [ ])"
                                             for n, d, _ in spec["outputs"] if not d]}
    # The example batch is min(8, max(2, max_batch)): never 1 (torch.export would specialise a size-1 dim), so it
    # may exceed a max_batch of 1; the exported batch dim then goes up to 2. The check uses another batch (and
    # variant 1 of the other dims: a longer bag, a shorter prompt) than the example, to prove the dims are dynamic.
    example = inputs_fn(min(8, max(2, mb)))
    fresh = inputs_fn(13 if mb >= 13 else 1, 1)
    limits = {"seq": module.model.config.block_size} if kind == "gpt" else {}

    try:
        ep = torch.export.export(module, example, dynamic_shapes=_shapes_for(module, _dims(dyn, mb, limits)))
    except Exception as e:  # noqa: BLE001 — a model torch.export cannot trace: say so in one line
        first = str(e).strip().splitlines()[0][:300] if str(e).strip() else ""
        raise ExportError(f"torch.export cannot export {kind}: {type(e).__name__}: {first}") from None
    pt2 = os.path.join(out_dir, "model.pt2")
    buf = io.BytesIO()  # in memory first: a full disk is then an OSError from Python, never a C++ terminate
    torch.export.save(ep, buf)
    write_atomic(pt2, buf.getvalue())
    report["files"].append(pt2)
    report["checks"]["torch.export"] = _check(torch.export.load(pt2).module(), module, fresh, "model.pt2")

    if onnx is None and not st.ok:
        report["onnx"] = f"skipped: {st.reason} ({st.fix})"
    if have_onnx:
        path = os.path.join(out_dir, "model.onnx")
        try:
            files = export_onnx(module, example, path, spec, dyn, mb, limits)
            report["checks"]["onnxruntime"] = _check(_ort_runner(path), module, fresh, "model.onnx under onnxruntime")
        except (ExportError, OSError):  # OSError: a full disk, said as such by export_for_serving
            raise
        except Exception as e:  # noqa: BLE001 — the exporter or onnxruntime refused this model (e.g. a bf16 Gemm)
            raise ExportError(f"ONNX Runtime cannot run {kind} as exported ({_first(e)}); pass --no-onnx to serve it "
                              "as TorchScript on libtorch") from None
        report["files"] += files

    # Triton: the ONNX model on onnxruntime when we have it, else TorchScript on libtorch.
    repo = os.path.join(out_dir, "triton", name)
    os.makedirs(os.path.join(repo, "1"), exist_ok=True)
    if have_onnx:
        platform, model_file = "onnxruntime_onnx", os.path.join(repo, "1", "model.onnx")
        # The model and every external-data file it names (model.onnx.data): Triton loads the folder alone.
        for fname in ["model.onnx", *_external_data(os.path.join(out_dir, "model.onnx"))]:
            with open(os.path.join(out_dir, fname), "rb") as f:
                write_atomic(os.path.join(repo, "1", fname), f.read())
            if fname != "model.onnx":
                report["files"].append(os.path.join(repo, "1", fname))
        report["checks"]["triton onnxruntime"] = _check(_ort_runner(model_file), module, fresh,
                                                        "the Triton copy of model.onnx under onnxruntime")
    else:
        platform, model_file = "pytorch_libtorch", os.path.join(repo, "1", "model.pt")
        traced = torch.jit.trace(module, example, check_trace=False)
        buf = io.BytesIO()
        torch.jit.save(traced, buf)
        write_atomic(model_file, buf.getvalue())
        report["checks"]["torchscript"] = _check(torch.jit.load(model_file), module, fresh, "TorchScript model.pt")
    cfg_path = os.path.join(repo, "config.pbtxt")
    write_atomic(cfg_path, triton_config(name, platform, spec, batching,
                                         kind="KIND_GPU" if batching.get("kind") == "KIND_GPU" else "KIND_CPU"))
    report["files"] += [model_file, cfg_path]
    report["triton_platform"] = platform
    from overdrive.serve.triton_repo import check_repository

    try:  # the staged repository holds only this model: another model's folder in --out is not ours to judge
        report["triton_check"] = check_repository(os.path.join(out_dir, "triton"), run=have_onnx)
    except ExportError:
        raise
    except Exception as e:  # noqa: BLE001 — e.g. onnxruntime's bad_alloc running a wide output at max_batch_size
        raise ExportError(f"the Triton repository of {kind} fails its check ({_first(e)}); a smaller --max-batch "
                          "may fit (nothing was written)") from None
    if have_onnx:  # the variant a tritonserver here can load: the same model.onnx in the python backend
        from overdrive.serve.triton_local import load_in_server, write_local_variant

        onnx_files = [os.path.join(repo, "1", f) for f in ["model.onnx", *_external_data(model_file)]]
        report["files"] += write_local_variant(out_dir, name, spec, batching, onnx_files,
                                               kind="KIND_GPU" if batching.get("kind") == "KIND_GPU" else "KIND_CPU")
        report["triton_server_check"] = load_in_server(out_dir) if server_check else {"ran": False,
                                                                                      "why": "the caller serves it"}
        if report["triton_server_check"].get("ready") is False:
            raise ExportError(f"tritonserver did not load {out_dir}/triton_local: "
                              f"{report['triton_server_check'].get('error')} (nothing was written)")
    return report
