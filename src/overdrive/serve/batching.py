"""The dynamic batcher settings an export writes: Triton's defaults, or those measured by
`overdrive bench --workload inference` (read from its results.json, an untrusted file: every field is
checked in range before anything is written)."""

from __future__ import annotations

import math

from overdrive.results.files import read_doc
from overdrive.serve.errors import ExportError
from overdrive.serve.identity import CLICK_IDENTITY, same_model

__all__ = ["batching_from", "slo_batch_from", "default_batching", "MAX_BATCH", "MAX_THREADS", "is_int"]

MAX_BATCH = 65536
"""The largest max_batch_size export writes: the checks run the model at it, and a batch above this many
requests is no latency setting."""
MAX_THREADS = 4096
"""The most intra-op threads a measured setting may carry (a results file is untrusted: 10^9 was accepted)."""


def is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_rate(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def default_batching(max_batch: int) -> dict:
    """Triton's own defaults (no preferred sizes, no delay): what `export` writes when nothing was measured."""
    return {"max_batch_size": max_batch, "preferred_batch_size": [], "max_queue_delay_us": 0, "instances": 1,
            "source": "Triton's defaults (not measured): pass --slo-from DIR of `overdrive bench --workload inference`"}


def batching_from(path: str, workload: str, engine: str = "onnxruntime", *, model: dict | None = None) -> dict:
    """The batcher settings measured by `overdrive bench --workload inference` (results.json or its folder):
    for the click model or a user's model (`model`: its `model_identity`; the results must be of that
    model), the serving search of `engine` (what Triton runs: ONNX Runtime); for the GPT, the largest
    fixed batch under the SLO."""
    try:  # the results files' one reader (bounded, regular, text JSON); each field checked below
        res = read_doc(path, {"type": "object"}, what="inference bench result", fix="")
        slo = res["slo_ms"]
        if not _is_rate(slo):
            raise ExportError(f"--slo-from {path}: slo_ms {slo!r} is not a positive number of milliseconds; re-run "
                              "the bench")
        serving = (res.get("serving") or {}).get("engines") or {}
        if model is not None and not serving:
            raise ExportError(f"--slo-from {path}: no serving results in it (run `overdrive bench --workload "
                              f"inference --model {model['given']['factory']} --inputs {model['given']['inputs']} "
                              "--slo-ms MS --out DIR` first)")
        if (workload == "recsys" or model is not None) and serving:
            return _measured_setting(res, slo, path, engine, model)
        b = res["workloads"][workload]["best"]["batch"]
    except RecursionError:
        raise ExportError(f"--slo-from {path}: nested too deeply to be bench results; re-run the bench") from None
    except (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError) as e:
        raise ExportError(f"--slo-from {path}: not an inference bench result with workload {workload} "
                          f"({type(e).__name__}: {e}); re-run the bench") from None
    if not b:
        raise ExportError(f"--slo-from {path}: no batch met the SLO for {workload}; pass --max-batch")
    return {**default_batching(int(b)), "source": f"measured: the largest fixed batch with p99 <= {slo:g} ms"}


def slo_batch_from(path: str, workload: str) -> int:
    """The max batch size of `batching_from` (kept for callers that want the number only)."""
    return int(batching_from(path, workload)["max_batch_size"])


def _measured_setting(res: dict, slo: float, path: str, engine: str, model: dict | None) -> dict:
    """The serving search's setting of `engine` (its fastest execution provider), checked, with its source."""
    sv, serving = res["serving"], res["serving"]["engines"]
    differs = same_model(sv.get("model_identity"), model or CLICK_IDENTITY)
    if differs:
        raise ExportError(f"--slo-from {path}: {differs}; bench the model you export, or export the one it measured")
    got = _fastest(sv, serving, engine, slo, path)
    c = _valid_setting(got["best"].get("config"), path)
    threads = sv.get("threads")
    if threads is not None and not (is_int(threads) and 1 <= threads <= MAX_THREADS):
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
    note = _faster_note(serving, engine, got, ci)
    if note:
        c["note"] = note
    return c


def _fastest(sv: dict, serving: dict, engine: str, slo: float, path: str) -> dict:
    """ONNX Runtime under any execution provider measured (CPU, CUDA, TensorRT): the fastest one given."""
    ort = [serving[n] for n in serving if n.startswith(engine) and (serving[n] or {}).get("status") == "ok"]
    if sv.get("withheld") or (ort and all(r.get("withheld") for r in ort)):
        why = sv.get("withheld") or ort[0]["withheld"]
        raise ExportError(f"--slo-from {path}: the bench withheld its verdict ({why}); re-run the bench on a "
                          "quieter host, or drop --slo-from and pass --max-batch")
    ok = [serving[n] for n in serving if n.startswith(engine) and (serving[n] or {}).get("best")]
    for r in ok:
        rate = r["best"].get("rate")
        if not _is_rate(rate):
            raise ExportError(f"--slo-from {path}: a measured rate of {rate!r} req/s is no rate; re-run the "
                              "bench (nothing was written)")
    if not ok:
        raise ExportError(f"--slo-from {path}: no setting of {engine} met p99 <= {slo:g} ms; drop --slo-from and "
                          "pass --max-batch, or bench with a larger --slo-ms")
    return max(ok, key=lambda r: r["best"]["rate"])


def _faster_note(serving: dict, engine: str, got: dict, ci) -> str | None:
    """Another engine surely faster (its interval's lower end above ONNX Runtime's upper end): said, while
    the repository still serves what was asked for (the ONNX model on onnxruntime)."""
    faster = [(n, r) for n, r in serving.items() if not n.startswith(engine) and isinstance(r, dict)
              and isinstance(r.get("best"), dict) and r["best"].get("ci") and ci and ci[1] is not None
              and r["best"]["ci"][0] > ci[1]]
    if not faster:
        return None
    n, r = max(faster, key=lambda nr: nr[1]["best"]["rate"])
    return (f"{r.get('label', n)} served this model faster in the same bench: "
            f"{r['best']['rate']:,.0f} [{r['best']['ci'][0]:,.0f}-{r['best']['ci'][1]:,.0f}] req/s "
            f"against {got['best']['rate']:,.0f}; the ONNX graph may be slower here than the model "
            "(--no-onnx serves TorchScript on libtorch instead)")


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


def _valid_setting(c, path: str) -> dict:
    """A measured batcher setting read from a results file (untrusted): every field in range, or one line."""
    if not isinstance(c, dict):
        raise ExportError(f"--slo-from {path}: its best setting is {type(c).__name__}, not an object; re-run the bench")
    mb, pref = c.get("max_batch_size"), c.get("preferred_batch_size") or []
    delay, inst = c.get("max_queue_delay_us", 0), c.get("instances", 1)
    problems = [] if is_int(mb) and 1 <= mb <= MAX_BATCH else [f"max_batch_size {mb!r} (an integer 1..{MAX_BATCH})"]
    if not problems and not (isinstance(pref, list) and all(is_int(p) and 1 <= p <= mb for p in pref)):
        problems.append(f"preferred_batch_size {pref!r} (integers 1..{mb})")
    if not (is_int(delay) and 0 <= delay <= 10_000_000):
        problems.append(f"max_queue_delay_us {delay!r} (an integer 0..10,000,000)")
    if not (is_int(inst) and 1 <= inst <= 256):
        problems.append(f"instances {inst!r} (an integer 1..256)")
    if c.get("kind") not in (None, "KIND_CPU", "KIND_GPU"):
        problems.append(f"kind {c.get('kind')!r} (KIND_CPU or KIND_GPU)")
    if problems:
        raise ExportError(f"--slo-from {path}: its best setting is not a batcher setting: {'; '.join(problems)}; "
                          "re-run the bench (nothing was written)")
    return {**c, "preferred_batch_size": list(pref), "max_queue_delay_us": delay, "instances": inst}
