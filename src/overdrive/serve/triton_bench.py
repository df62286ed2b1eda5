"""`bench --workload inference --server triton`: the simulated highest rate under the SLO, checked on a real
Triton server running the exported model with the batcher settings the simulation chose.

The model is exported to a temporary folder with ONNX Runtime's simulated best setting, its
python-backend variant is served by `tritonserver` on 127.0.0.1, and an open-loop Poisson client drives
it at rates found by search: from the simulated rate down (halving, or straight to 80% of the rate
the server was seen to answer) until a rate meets the SLO with every request answered, then up by
geometric bisection between the highest met and the lowest missed. The highest rate met is the
measured rate; the next one tried above it bounds it. The rate is repeated once (A/A) for the noise.
"""

from __future__ import annotations

import dataclasses
import math
import os
import tempfile

from overdrive.serve.triton_client import MIN_RATE

__all__ = ["run_triton_bench", "meets", "next_rate", "ort_setting", "triton_unavailable"]

MAX_STEPS = 9
"""Rates tried at most (each bounded by triton_client.MAX_REQUESTS and MAX_SECONDS)."""


def meets(point: dict, slo_ms: float) -> bool:
    """A rate is met when every scheduled request was sent and answered and the p99 is estimable and <= SLO."""
    p99 = point["latency_ms"]["p99"]
    return not point["failed"] and not point["not_sent"] and point["answered"] == point["scheduled"] and \
        p99 is not None and p99 <= slo_ms


def next_rate(points: list[dict], slo_ms: float) -> float | None:
    """The next rate to try, or None when the search is done (pure: tested without a server)."""
    ok = [p["rate"] for p in points if meets(p, slo_ms)]
    bad = [p for p in points if not meets(p, slo_ms)]
    lo = max(ok) if ok else None
    hi = min((p["rate"] for p in bad if lo is None or p["rate"] > lo), default=None)
    if lo is None:  # nothing met yet: go down
        last = min(bad, key=lambda p: p["rate"])
        seen = last.get("answered_rate") or 0
        r = min(last["rate"] / 2, 0.8 * seen) if seen > 0 else last["rate"] / 2
        return max(r, MIN_RATE) if last["rate"] > MIN_RATE else None  # no lower: a p99 would outlast the time bound
    if hi is None:  # everything met: the simulated rate was too low for this server, go up
        return lo * 2 if lo * 2 <= 1e6 else None
    return math.sqrt(lo * hi) if hi / lo > 1.15 else None


def ort_setting(serving: dict) -> tuple[str, dict, float] | None:
    """(engine key, batcher setting, simulated highest rate) of ONNX Runtime in the simulation's results."""
    rows = [(k, r) for k, r in (serving.get("engines") or {}).items() if k.startswith("onnxruntime")
            and isinstance(r, dict) and (r.get("best") or (r.get("estimate") or {}).get("config"))]
    if not rows:
        return None
    k, r = max(rows, key=lambda kr: (kr[1].get("best") or kr[1]["estimate"])["rate"])
    best = r.get("best") or {"config": r["estimate"]["config"], "rate": r["estimate"]["rate"]}
    return k, dict(best["config"]), float(best["rate"])


def _payloads(model, n: int = 64) -> list:
    import tritonclient.http as http

    xs = model.inputs(n)
    dtypes = {"TYPE_FP32": "FP32", "TYPE_INT64": "INT64", "TYPE_INT32": "INT32", "TYPE_FP16": "FP16",
              "TYPE_FP64": "FP64", "TYPE_BOOL": "BOOL", "TYPE_INT8": "INT8", "TYPE_UINT8": "UINT8"}
    out = []
    for i in range(n):  # one example per request, as the simulation's stream
        req = []
        for (name, _, t), x in zip(model.spec["inputs"], xs):
            a = x[i:i + 1].numpy()
            inp = http.InferInput(name, list(a.shape), dtypes[t])
            inp.set_data_from_numpy(a)
            req.append(inp)
        out.append(req)
    return out


def _drain(server, name: str, *, max_s: float = 15.0) -> None:
    """Wait until Triton has no request of an earlier rate left (a client that timed out left them queued):
    its executed count stops moving for half a second."""
    import time

    deadline, last = time.monotonic() + max_s, None
    while time.monotonic() < deadline:
        now = server.stats(name).get("execution_count")
        if now == last:
            return
        last = now
        time.sleep(0.5)


def triton_unavailable() -> str | None:
    """Why a real server cannot be run here (the `triton` extra, the machine), or None."""
    import importlib.util

    if importlib.util.find_spec("tritonclient") is None or importlib.util.find_spec("aiohttp") is None:
        return "the client is not installed: pip install 'tritonclient[http,grpc]' (the overdrive[triton] extra)"
    from overdrive.serve.triton_env import unavailable_reason

    return unavailable_reason()


def run_triton_bench(serving: dict, model, *, slo_ms: float, seed: int = 0, say=print) -> dict:
    """The measured highest rate under the SLO on a real tritonserver beside the simulated one."""
    from overdrive.measure.threads import load_report

    got = ort_setting(serving)
    if got is None:
        return {"status": "not run", "reason": "the simulation found no ONNX Runtime setting to serve (see its table)"}
    engine, setting, sim_rate = got
    batching = {**setting, "threads": serving.get("threads"), "source": f"simulated by this bench ({engine})"}
    before = load_report()
    points, aa, leftover = _serve_and_drive(model, setting, batching, sim_rate, slo_ms=slo_ms, seed=seed, say=say)
    after = load_report()
    top = max((p for p in points if p["met"]), key=lambda p: p["rate"], default=None)
    above = min((p["rate"] for p in points if not p["met"] and (top is None or p["rate"] > top["rate"])), default=None)
    measured = top["rate"] if top else None
    # The CPU shares where the verdict is decided: the highest rate met and the one missed above it (an
    # overload rate far above, where the client only queues requests, says nothing of the verdict).
    near = [p for p in points if p["rate"] in (measured, above)] or points
    client = max(p["client_cpu_cores"] for p in near)
    srv = [p["server_cpu_cores"] for p in near if p["server_cpu_cores"] is not None]
    return {
        "status": "ok", "server": "tritonserver 2.51 (nvidia-pytriton 0.7.0): python backend running the exported "
                                  "model.onnx in ONNX Runtime",
        "engine": engine, "setting": setting, "slo_ms": slo_ms, "simulated_rate": sim_rate,
        # the simulation's own verdict on that rate: a withheld one (a busy host) is an estimate, said so
        "simulated_verdict": ((serving.get("engines") or {}).get(engine) or {}).get("withheld") or "given",
        "measured_rate": measured, "missed_above": above,
        "ratio": measured / sim_rate if measured else None, "points": points, "aa": aa,
        "requests": {"sent": sum(p["sent"] for p in points), "answered": sum(p["answered"] for p in points),
                     "failed": sum(sum(p["failed"].values()) for p in points),
                     "not_sent": sum(p["not_sent"] for p in points)},
        "client_cpu_cores_max": client, "server_cpu_cores_max": max(srv) if srv else None,
        "client_competes": bool(srv) and client >= max(srv),
        "load": {"before": before, "after": after}, "leftover_processes": leftover,
        "note": ("measured = the highest rate tried whose p99 met the SLO with every request answered; the next rate "
                 "tried above it missed. The HTTP front end and the python backend's IPC are in this latency; the "
                 "simulation has neither."),
    }


def _serve_and_drive(model, setting: dict, batching: dict, sim_rate: float, *, slo_ms: float, seed: int,
                     say) -> tuple[list[dict], dict | None, bool]:
    """Export the model with `batching` (ONNX Runtime's simulated `setting`) into a temporary folder, serve it by tritonserver and drive it:
    (the rates tried, the A/A repeat of the highest met, the server's processes left after it stopped)."""
    from overdrive.serve.export import export_for_serving
    from overdrive.serve.triton_client import drive
    from overdrive.serve.triton_local import LOCAL_DIR
    from overdrive.serve.triton_server import TritonServer, group_alive

    server = None  # a SIGTERM to the bench is SystemExit here (commands/bench.py): the finally stops the server
    try:
        with tempfile.TemporaryDirectory(prefix="overdrive-triton-") as tmp:
            say(f"exporting the model with ONNX Runtime's simulated setting {setting} for tritonserver")
            served = model
            if model.identity.get("builtin"):  # the bench's click model takes inputs(batch) only: export's variant
                served = dataclasses.replace(model, inputs=lambda b, v=0, f=model.inputs: f(b))  # check, same bag
            rep = export_for_serving("recsys" if model.identity.get("builtin") else model.identity["given"]["factory"],
                                     tmp, batching=batching, served=served, onnx=True, server_check=False)
            server = TritonServer(os.path.join(tmp, LOCAL_DIR), log_path=os.path.join(tmp, "tritonserver.log"))
            server.start()
            pgid = server.proc.pid
            name, payloads = rep["name"], _payloads(model)
            drive(server.url, name, payloads, 200.0, n=200, seed=seed + 99, server=server)  # warm-up, not kept
            points = _search(server, name, payloads, sim_rate, slo_ms=slo_ms, seed=seed, say=say)
            met = [p for p in points if p["met"]]
            aa = _repeat(server, name, payloads, max(met, key=lambda p: p["rate"]), slo_ms=slo_ms,
                         seed=seed) if met else None
            server.stop()
            leftover = group_alive(pgid)
    finally:
        if server is not None:
            server.stop()
    return points, aa, leftover


def _search(server, name: str, payloads: list, sim_rate: float, *, slo_ms: float, seed: int, say) -> list[dict]:
    """Rates tried from the simulated one (`next_rate`), each marked met or missed, at most MAX_STEPS."""
    from overdrive.serve.triton_client import drive, requests_for

    points: list[dict] = []
    rate = sim_rate
    while rate is not None and len(points) < MAX_STEPS:
        p = drive(server.url, name, payloads, rate, n=requests_for(rate), seed=seed + len(points), server=server)
        p["met"] = meets(p, slo_ms)
        points.append(p)
        say(f"  {rate:,.0f} req/s: {p['answered']}/{p['scheduled']} answered, p99 "
            + (f"{p['latency_ms']['p99']:.2f} ms" if p["latency_ms"]["p99"] is not None else "not estimable")
            + (" (met)" if p["met"] else " (missed)")
            + "".join(f"; {n} x {why}" for why, n in p["failed"].items()))
        if p["failed"] or p["not_sent"]:
            _drain(server, name)
        rate = next_rate(points, slo_ms)
    return points


def _repeat(server, name: str, payloads: list, top: dict, *, slo_ms: float, seed: int) -> dict:
    """The highest rate met, driven again: how much the p99 moves on this host, now."""
    from overdrive.serve.triton_client import drive, requests_for

    again = drive(server.url, name, payloads, top["rate"], n=requests_for(top["rate"]), seed=seed + 77, server=server)
    a, b = top["latency_ms"]["p99"], again["latency_ms"]["p99"]
    return {"rate": top["rate"], "p99_a": a, "p99_b": b, "met_again": meets(again, slo_ms),
            "relative": abs(a - b) / min(a, b) if a and b else None}
