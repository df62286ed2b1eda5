"""A served model (the click model, or a user's FILE.py:FACTORY) in the engines that serve it: eager
PyTorch, torch.compile, and the exported ONNX model in ONNX Runtime (CPU; CUDA and TensorRT execution
providers where present). Same inputs, outputs checked equal before anything is timed; then
per-batch service times measured host to host (inputs on the host, outputs back on the host: what a
server sees), in interleaved rounds by the one scheduler (`measure.rounds`), with an A/A twin of one
engine for the noise floor.
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from overdrive.measure.rounds import interleaved_rounds, time_fn
from overdrive.serve.errors import first_line

__all__ = ["Engine", "ServingError", "serving_engines", "check_engines", "measure_service"]

# fp32 engines against eager fp32 on the same inputs: ORT and inductor reorder sums (the interaction's
# bmm, the MLPs), so agreement is to rounding, not bits.
ATOL, RTOL = 1e-5, 1e-4


class ServingError(RuntimeError):
    """The served model itself cannot run (in eager PyTorch, on its example inputs): one line, no traceback."""


@dataclass
class Engine:
    name: str
    label: str
    run: Callable[[int], object] | None
    """run(batch) -> output as a numpy array, from host inputs prepared for that batch."""
    status: str = "ok"
    reason: str | None = None
    kind: str = "KIND_CPU"
    meta: dict = field(default_factory=dict)


# TF32 rounds each GEMM input to a 10-bit mantissa (relative error up to 2^-11 per product) and keeps
# fp32 accumulation: over the few hundred products of a click model's dot products the output moves by
# ~1e-3 of its scale, beyond the fp32 tolerance above.
TF32_ATOL, TF32_RTOL = 2e-3, 2e-2


@dataclass(frozen=True)
class OrtProvider:
    """One ONNX Runtime execution provider as we run it."""

    name: str
    label: str
    providers: list
    """What onnxruntime is given: names, or (name, options) pairs."""
    kind: str
    tolerance: tuple[float, float, str] | None = None
    """(atol, rtol, why) when its fp32 is not IEEE fp32 (TF32 in TensorRT), else the fp32 tolerance."""


def _ort_providers(env) -> list[OrtProvider]:
    """Each execution provider present here. The CUDA EP runs fp32 GEMMs in TF32 unless told not to
    (`use_tf32` defaults to 1: onnxruntime/core/providers/cuda/cuda_execution_provider_info.h), which
    would miss the fp32 tolerance and mark the engine as differing from eager: we pass use_tf32=0, so
    it runs the fp32 eager runs. TensorRT enables TF32 by default (BuilderFlag::kTF32) and ORT's
    TensorRT EP has no option to clear it: that engine is compared at a TF32 tolerance, and its label
    says so."""
    import onnxruntime as ort

    have = ort.get_available_providers()
    out = [OrtProvider("onnxruntime", "ONNX Runtime (CPU EP)", ["CPUExecutionProvider"], "KIND_CPU")]
    cuda = ("CUDAExecutionProvider", {"use_tf32": "0"})
    if env.has_gpu and "CUDAExecutionProvider" in have:
        out.append(OrtProvider("onnxruntime-cuda", "ONNX Runtime (CUDA EP, use_tf32=0)",
                               [cuda, "CPUExecutionProvider"], "KIND_GPU"))
    if env.has_gpu and "TensorrtExecutionProvider" in have:
        out.append(OrtProvider("onnxruntime-tensorrt", "ONNX Runtime (TensorRT EP, TF32)",
                               ["TensorrtExecutionProvider", cuda, "CPUExecutionProvider"], "KIND_GPU",
                               (TF32_ATOL, TF32_RTOL, "TensorRT runs fp32 GEMMs in TF32 (on by default)")))
    return out


def _provider_name(p) -> str:
    return p[0] if isinstance(p, tuple) else p


def serving_engines(model, inputs: dict[int, tuple], env, *, spec: dict, dynamic: dict, compile: bool = True,
                    workdir: str | None = None) -> list[Engine]:
    """Eager, torch.compile (dynamic) and the exported ONNX model in ONNX Runtime (one engine per
    execution provider present) for any serving module `model(*inputs[b])`: `inputs[b]` is a tuple of
    host tensors, batch first; `spec` names the inputs and outputs (as config.pbtxt does) and `dynamic`
    the variable axes per input ({name: {axis: label}}, the batch always). run(b) returns the outputs
    as a list of numpy arrays, brought back to the host (what a server sees)."""
    engines = _torch_engines(model.to(env.device).eval(), inputs, env, compile=compile)
    return engines + _ort_engines(model, inputs, env, spec=spec, dynamic=dynamic, workdir=workdir)


def _torch_engines(m, inputs: dict[int, tuple], env, *, compile: bool) -> list[Engine]:
    """Eager and, where it works here, torch.compile (dynamic) of the module `m` on env.device."""
    import torch

    dev = env.device

    def torch_run(fn):
        def run(b):
            xs = tuple(x.to(dev, non_blocking=True) for x in inputs[b])
            with torch.inference_mode():
                out = fn(*xs)
            outs = out if isinstance(out, (tuple, list)) else (out,)
            # host to host; numpy has no bfloat16: such an output comes back widened to fp32
            return [(o.float() if o.dtype == torch.bfloat16 else o).cpu().numpy() for o in outs]
        return run

    kind = "KIND_GPU" if dev != "cpu" else "KIND_CPU"
    # The label says the precision the model's weights are in (the engines run it as given, no autocast).
    dtype = next((p.dtype for p in m.parameters() if p.is_floating_point()), torch.float32)
    prec = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.float64: "fp64"}.get(
        dtype, str(dtype).replace("torch.", ""))
    engines = [Engine("eager", f"PyTorch eager {prec} ({dev})", torch_run(m), kind=kind)]
    if compile:
        st = env.engine("torch.compile")
        if st.ok:
            engines.append(Engine("compiled", f"torch.compile dynamic {prec} ({dev})",
                                  torch_run(torch.compile(m, dynamic=True)), kind=kind))
        else:
            engines.append(Engine("compiled", "torch.compile", None, "unavailable",
                                  f"torch.compile {st.status}: {st.reason}"))
    return engines


def _ort_engines(model, inputs: dict[int, tuple], env, *, spec: dict, dynamic: dict,
                 workdir: str | None) -> list[Engine]:
    """The model exported to ONNX (on the CPU) and run by ONNX Runtime, one engine per execution provider
    present; or one engine saying why there is none."""
    import torch

    from overdrive.serve.artefacts import export_onnx

    st = env.engine("onnx")
    if not st.ok:
        return [Engine("onnxruntime", "ONNX Runtime", None, "unavailable", f"{st.reason} ({st.fix})")]
    workdir = workdir or tempfile.mkdtemp(prefix="overdrive-onnx-")
    path = os.path.join(workdir, "model.onnx")
    # The example batch is never 1 (torch.export would specialise a size-1 dimension).
    ex = inputs[min(b for b in inputs if b >= 2)] if any(b >= 2 for b in inputs) else inputs[max(inputs)]
    cpu_model = model.to("cpu")
    try:
        export_onnx(cpu_model, ex, path, spec, dynamic, max(inputs))
    except Exception as e:  # noqa: BLE001 — an exporter failure is a result, said in one line
        return [Engine("onnxruntime", "ONNX Runtime", None, "failed",
                       f"ONNX export failed: {type(e).__name__}: {str(e).splitlines()[0][:150]}")]
    finally:
        model.to(env.device)
    names = [n for n, _, _ in spec["inputs"]]
    odd = sorted({str(x.dtype) for xs in inputs.values() for x in xs if x.dtype == torch.bfloat16})
    if odd:  # numpy has no bfloat16: onnxruntime's Python API cannot be fed these inputs
        return [Engine("onnxruntime", "ONNX Runtime", None, "unavailable",
                       f"inputs of {', '.join(odd)} have no numpy type to feed onnxruntime's Python API")]
    np_in = {b: {n: x.numpy() for n, x in zip(names, xs)} for b, xs in inputs.items()}
    return [_ort_engine(p, path, np_in, torch.get_num_threads()) for p in _ort_providers(env)]


def _ort_engine(p: OrtProvider, path: str, np_in: dict, threads: int) -> Engine:
    """The ONNX model at `path` in one execution provider, with `threads` intra-op threads."""
    from overdrive.serve.artefacts import ort_session

    try:
        sess = ort_session(path, p.providers, threads=threads)
    except Exception as e:  # noqa: BLE001
        return Engine(p.name, p.label, None, "failed", f"{type(e).__name__}: {str(e).splitlines()[0][:150]}")
    got, want = sess.get_providers(), _provider_name(p.providers[0])
    if got[0] != want:  # ORT falls back to the CPU EP without raising: say so, do not time it
        return Engine(p.name, p.label, None, "unavailable", f"onnxruntime ran {got[0]}, not {want}")

    def run(b):
        return sess.run(None, np_in[b])

    meta = {"providers": got, "provider_options": {k: v for k, v in sess.get_provider_options().items()
                                                   if k == want and k != "CPUExecutionProvider"},
            "threads": threads}
    if p.tolerance:
        meta["tolerance"] = {"atol": p.tolerance[0], "rtol": p.tolerance[1], "why": p.tolerance[2]}
    return Engine(p.name, p.label, run, kind=p.kind, meta=meta)


def _outputs(x) -> list[np.ndarray]:
    return [np.asarray(o) for o in x] if isinstance(x, (list, tuple)) else [np.asarray(x)]


def check_engines(engines: list[Engine], batches: list[int], *, atol: float = ATOL, rtol: float = RTOL) -> None:
    """Each engine's outputs (every one of them) against eager's on the same inputs, every batch, before
    any timing; an engine that differs is marked failed (with its max error) and is not timed. An engine
    whose fp32 is TF32 by design carries its own tolerance (`meta["tolerance"]`, said in its label)."""
    atol_fp32, rtol_fp32 = atol, rtol
    ref_engine = next(e for e in engines if e.name == "eager")
    ref = {}
    for b in batches:
        try:
            ref[b] = _outputs(ref_engine.run(b))
        except Exception as ex:  # noqa: BLE001 — the model itself fails: nothing to serve, said in one line
            raise ServingError(f"the model fails in eager PyTorch at batch {b}: {first_line(ex)}") from None
        if not all(np.isfinite(o.astype(np.float64)).all() for o in ref[b] if o.dtype.kind in "fc"):
            raise ServingError(f"the model's outputs in eager PyTorch at batch {b} are not finite (NaN or inf): "
                               "nothing to serve or compare")
    for e in engines:
        if e.status != "ok" or e is ref_engine:
            continue
        tol = e.meta.get("tolerance") or {}
        atol, rtol = tol.get("atol", atol_fp32), tol.get("rtol", rtol_fp32)
        worst = 0.0
        try:
            for b in batches:
                got = _outputs(e.run(b))
                if len(got) != len(ref[b]):
                    e.status, e.reason = "failed", f"{len(got)} outputs at batch {b}, eager gives {len(ref[b])}"
                    break
                for g, r in zip(got, ref[b]):
                    g = g.astype(np.float64).reshape(r.shape)
                    worst = max(worst, float(np.abs(g - r).max()) if g.size else 0.0)
                    if not np.allclose(g, r, atol=atol, rtol=rtol):
                        e.status, e.reason = "failed", (f"outputs differ from eager at batch {b}: max abs error "
                                                        f"{worst:.3g} > {atol:g} + {rtol:g}*|ref|"
                                                        + (f" ({tol['why']})" if tol else ""))
                        break
                if e.status != "ok":
                    break
        except Exception as ex:  # noqa: BLE001
            e.status, e.reason = "failed", f"{type(ex).__name__}: {str(ex).splitlines()[0][:150]}"
        e.meta["max_abs_error_vs_eager"] = worst


MIN_ROUND_MS = 20.0
"""Each key's calls in one round last at least this long (more than `reps` calls when they are short)."""
MAX_REP_FACTOR = 20
"""... but at most this many times `reps` calls."""


def measure_service(engines: list[Engine], batches: list[int], *, rounds: int, reps: int, aa: str = "eager",
                    progress=None, clock_cuda: bool = False, seed: int = 0, timer=None,
                    min_round_ms: float = MIN_ROUND_MS) -> dict:
    """{"samples": {engine: {batch: [[ms, ...] per round]}}, "aa": [twin pairs]}: per-call service times.

    One key per (engine, batch), plus A/A twins (each measured as two keys): of every engine at the
    smallest batch (each engine's verdict is judged against its own control: one engine's outliers
    say nothing of another's), and of `aa` at the largest batch too; `rounds` rounds of `reps` calls
    per key (more for short calls: a key's round lasts at least `min_round_ms` by its warm-up's median
    call, up to MAX_REP_FACTOR x reps), in an order shuffled afresh each round (`measure.rounds.shuffled`: no key always follows the same
    neighbour), so the host's drift and contention fall on every key alike and each round is one
    moment's evidence. Warm-up calls first, apart. Timing is host to host on the wall clock (the
    outputs come back to the host, which syncs); `timer(fn) -> ms` replaces the clock in tests."""
    live = [e for e in engines if e.status == "ok"]
    keys = [(e.name, b) for e in live for b in batches]
    twins = [(e.name, batches[0]) for e in live]  # (engine, batch): the aa engine first, at both ends
    twins.sort(key=lambda t: t[0] != aa)
    if any(e.name == aa for e in live) and batches[-1] != batches[0]:
        twins.insert(1, (aa, batches[-1]))
    aa_keys = [(f"{n}#{t}", b) for n, b in twins for t in "AB"]
    runs = {e.name: e.run for e in live}
    runs.update({k[0]: runs[k[0].rsplit("#", 1)[0]] for k in aa_keys})
    samples: dict = {k: [[] for _ in range(rounds)] for k in keys + aa_keys}
    timer = timer or (lambda fn: time_fn(fn, cuda=clock_cuda))
    per_key: dict = {}
    for key in keys + aa_keys:
        name, b = key
        for _ in range(3):  # compilation, allocator growth, ORT's first-run arena
            runs[name](b)
        if key not in keys:  # an A/A twin: as many calls as the key it twins
            continue
        warm = sorted(timer(lambda: runs[name](b)) for _ in range(5))[2] if min_round_ms > 0 else math.inf
        # A round of a key lasts at least min_round_ms: 30 calls of 0.05 ms are one 1.5 ms burst, whose
        # median one timer interrupt or a neighbour's time slice moves (eager's A/A twins at batch 1 of
        # a 0.06 ms model sat 13% apart over 20 rounds); calls of 2 ms keep `reps`.
        per_key[key] = min(reps * MAX_REP_FACTOR, max(reps, math.ceil(min_round_ms / max(warm, 1e-6))))
    for key in aa_keys:
        per_key[key] = per_key.get((key[0].rsplit("#", 1)[0], key[1]), reps)

    def one(key, k) -> bool:
        name, b = key
        fn = runs[name]
        for _ in range(per_key[key]):
            samples[key][k].append(timer(lambda: fn(b)))
        return True

    task = progress.add_task("latency: serving engines", total=rounds) if progress else None
    done = interleaved_rounds(keys + aa_keys, one, rounds=rounds, shuffle_seed=seed,
                              on_round=(lambda *_: progress.update(task, advance=1)) if progress else None)
    out: dict = {"samples": {}, "rounds": done, "reps": reps,
                 "reps_per_key": {f"{n}@{b}": r for (n, b), r in per_key.items()},
                 "aa": [{"of": f"{n} at batch {b}", "engine": n, "batch": b, "a": samples[(f"{n}#A", b)][:done],
                         "b": samples[(f"{n}#B", b)][:done], "rate_check": b == batches[0]}
                        for n, b in twins]}
    for (name, b) in keys:
        out["samples"].setdefault(name, {})[b] = samples[(name, b)][:done]
    return out
