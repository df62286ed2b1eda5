"""The click model in the engines that serve it: eager PyTorch, torch.compile, and the exported ONNX
model in ONNX Runtime (CPU; CUDA and TensorRT execution providers where present). Same inputs,
outputs checked equal before anything is timed; then per-batch service times measured host to host
(inputs on the host, outputs back on the host: what a server sees), in interleaved rounds by the
one scheduler (`bench.timing`), with an A/A twin of one engine for the noise floor.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from overdrive.measure.rounds import interleaved_rounds, time_fn

__all__ = ["Engine", "click_engines", "check_engines", "measure_service"]

# fp32 engines against eager fp32 on the same inputs: ORT and inductor reorder sums (the interaction's
# bmm, the MLPs), so agreement is to rounding, not bits.
ATOL, RTOL = 1e-5, 1e-4


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


def _ort_providers(env) -> list[tuple[str, str, list, str]]:
    """(engine name, label, providers, instance kind) for each execution provider present here."""
    import onnxruntime as ort

    have = ort.get_available_providers()
    out = [("onnxruntime", "ONNX Runtime (CPU EP)", ["CPUExecutionProvider"], "KIND_CPU")]
    if env.has_gpu and "CUDAExecutionProvider" in have:
        out.append(("onnxruntime-cuda", "ONNX Runtime (CUDA EP)", ["CUDAExecutionProvider", "CPUExecutionProvider"],
                    "KIND_GPU"))
    if env.has_gpu and "TensorrtExecutionProvider" in have:
        out.append(("onnxruntime-tensorrt", "ONNX Runtime (TensorRT EP)",
                    ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"], "KIND_GPU"))
    return out


def click_engines(model, inputs: dict[int, tuple], env, *, compile: bool = True, workdir: str | None = None,
                  bag: int = 5) -> list[Engine]:
    """Engines for the click serving module `model` (dense, ids) -> (B, 1); `inputs[b]` are host tensors."""
    import torch

    dev = env.device
    gpu = dev != "cpu"
    m = model.to(dev).eval()
    engines: list[Engine] = []

    def torch_run(fn):
        def run(b):
            d, i = inputs[b]
            with torch.inference_mode():
                return fn(d.to(dev, non_blocking=True), i.to(dev, non_blocking=True)).cpu().numpy()  # host to host
        return run

    kind = "KIND_GPU" if gpu else "KIND_CPU"
    engines.append(Engine("eager", f"PyTorch eager fp32 ({dev})", torch_run(m), kind=kind))
    if compile:
        st = env.engine("torch.compile")
        if st.ok:
            engines.append(Engine("compiled", f"torch.compile dynamic fp32 ({dev})",
                                  torch_run(torch.compile(m, dynamic=True)), kind=kind))
        else:
            engines.append(Engine("compiled", "torch.compile", None, "unavailable",
                                  f"torch.compile {st.status}: {st.reason}"))
    st = env.engine("onnx")
    if not st.ok:
        engines.append(Engine("onnxruntime", "ONNX Runtime", None, "unavailable",
                              f"{st.reason} ({st.fix})"))
        return engines
    from overdrive.serve.export import export_onnx, ort_session

    workdir = workdir or tempfile.mkdtemp(prefix="overdrive-onnx-")
    path = os.path.join(workdir, "model.onnx")
    spec = {"inputs": [("dense", [13], "TYPE_FP32"), ("ids", [26, -1], "TYPE_INT64")],
            "outputs": [("prob", [1], "TYPE_FP32")]}
    ex = inputs[min(b for b in inputs if b >= 2)] if any(b >= 2 for b in inputs) else inputs[max(inputs)]
    cpu_model = model.to("cpu")
    try:
        export_onnx(cpu_model, ex, path, spec, {"dense": {0: "batch"}, "ids": {0: "batch", 2: "bag"}},
                    max(inputs))
    except Exception as e:  # noqa: BLE001 — an exporter failure is a result, said in one line
        engines.append(Engine("onnxruntime", "ONNX Runtime", None, "failed",
                              f"ONNX export failed: {type(e).__name__}: {str(e).splitlines()[0][:150]}"))
        return engines
    finally:
        model.to(dev)
    np_in = {b: (d.numpy(), i.numpy()) for b, (d, i) in inputs.items()}
    for name, label, providers, kind in _ort_providers(env):
        try:
            sess = ort_session(path, providers, threads=torch.get_num_threads())
        except Exception as e:  # noqa: BLE001
            engines.append(Engine(name, label, None, "failed", f"{type(e).__name__}: {str(e).splitlines()[0][:150]}"))
            continue
        got = sess.get_providers()
        if got[0] != providers[0]:  # ORT falls back to the CPU EP without raising: say so, do not time it
            engines.append(Engine(name, label, None, "unavailable", f"onnxruntime ran {got[0]}, not {providers[0]}"))
            continue

        def run(b, sess=sess):
            d, i = np_in[b]
            return sess.run(None, {"dense": d, "ids": i})[0]

        engines.append(Engine(name, label, run, kind=kind, meta={"providers": got,
                                                                 "threads": torch.get_num_threads()}))
    return engines


def check_engines(engines: list[Engine], batches: list[int], *, atol: float = ATOL, rtol: float = RTOL) -> None:
    """Each engine's outputs against eager's on the same inputs, every batch, before any timing; an
    engine that differs is marked failed (with its max error) and is not timed."""
    ref_engine = next(e for e in engines if e.name == "eager")
    ref = {b: np.asarray(ref_engine.run(b)) for b in batches}
    for e in engines:
        if e.status != "ok" or e is ref_engine:
            continue
        worst = 0.0
        try:
            for b in batches:
                got = np.asarray(e.run(b), dtype=np.float64).reshape(ref[b].shape)
                worst = max(worst, float(np.abs(got - ref[b]).max()))
                if not np.allclose(got, ref[b], atol=atol, rtol=rtol):
                    e.status, e.reason = "failed", (f"outputs differ from eager at batch {b}: max abs error "
                                                    f"{worst:.3g} > {atol:g} + {rtol:g}*|ref|")
                    break
        except Exception as ex:  # noqa: BLE001
            e.status, e.reason = "failed", f"{type(ex).__name__}: {str(ex).splitlines()[0][:150]}"
        e.meta["max_abs_error_vs_eager"] = worst


def measure_service(engines: list[Engine], batches: list[int], *, rounds: int, reps: int, aa: str = "eager",
                    progress=None, clock_cuda: bool = False, seed: int = 0, timer=None) -> dict:
    """{"samples": {engine: {batch: [[ms, ...] per round]}}, "aa": [twin pairs]}: per-call service times.

    One key per (engine, batch), plus A/A twins of `aa` at the smallest and the largest batch (each
    measured as two keys); `rounds` rounds of `reps` calls per key, in an order shuffled afresh each
    round (`measure.rounds.shuffled`: no key always follows the same neighbour), so the host's drift
    and contention fall on every key alike and each round is one moment's evidence. Warm-up calls
    first, apart. Timing is host to host on the wall clock (the outputs come back to the host, which
    syncs); `timer(fn) -> ms` replaces the clock in tests."""
    live = [e for e in engines if e.status == "ok"]
    keys = [(e.name, b) for e in live for b in batches]
    twins = sorted({batches[0], batches[-1]})
    aa_keys = [(f"{aa}#{t}", b) for b in twins for t in "AB"] if any(e.name == aa for e in live) else []
    runs = {e.name: e.run for e in live}
    runs.update({k[0]: runs[aa] for k in aa_keys})
    samples: dict = {k: [[] for _ in range(rounds)] for k in keys + aa_keys}
    timer = timer or (lambda fn: time_fn(fn, cuda=clock_cuda))
    for name, b in keys + aa_keys:
        for _ in range(3):  # compilation, allocator growth, ORT's first-run arena
            runs[name](b)

    def one(key, k) -> bool:
        name, b = key
        fn = runs[name]
        for _ in range(reps):
            samples[key][k].append(timer(lambda: fn(b)))
        return True

    task = progress.add_task("latency: serving engines", total=rounds) if progress else None
    done = interleaved_rounds(keys + aa_keys, one, rounds=rounds, shuffle_seed=seed,
                              on_round=(lambda *_: progress.update(task, advance=1)) if progress else None)
    out: dict = {"samples": {}, "rounds": done, "reps": reps,
                 "aa": [{"of": f"{aa} at batch {b}", "batch": b, "a": samples[(f"{aa}#A", b)][:done],
                         "b": samples[(f"{aa}#B", b)][:done], "rate_check": b == batches[0]}
                        for b in twins if aa_keys]}
    for (name, b) in keys:
        out["samples"].setdefault(name, {})[b] = samples[(name, b)][:done]
    return out
