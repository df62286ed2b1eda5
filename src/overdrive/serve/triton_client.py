"""An open-loop client for a real Triton server: Poisson arrivals at a set rate, every request sent at its
own arrival time whether or not earlier ones were answered (a closed loop would slow down with the
server and hide its queue), bounded in count and in time, on 127.0.0.1 only.

A request's latency runs from its *scheduled* arrival to its answer, so a client that falls behind its
schedule shows up as latency, never as a quieter stream; how far it fell behind is reported too. The
client's own CPU time is measured beside the server's: on a 2-core host they compete.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import numpy as np

from overdrive.measure.percentiles import latency_summary, min_samples

__all__ = ["poisson_arrivals", "requests_for", "stats_delta", "drive", "MAX_REQUESTS", "MAX_SECONDS", "MIN_RATE"]

MAX_REQUESTS = 6000
"""The most requests one rate sends."""
MAX_SECONDS = 20.0
"""The longest one rate sends for; requests scheduled later are not sent (counted as such)."""
P99_REQUESTS = int(min_samples(99) * 1.25)
"""Requests per rate at least: 368 bound a p99; a few more leave room for a failure or two."""
MIN_RATE = P99_REQUESTS / (0.8 * MAX_SECONDS)
"""The lowest rate whose p99 can be measured within MAX_SECONDS (29 req/s: a Poisson stream of 460
requests at 23 req/s outlasts 20 s about half the time; the 20% margin keeps it inside)."""


def poisson_arrivals(rate: float, n: int, *, seed: int = 0) -> np.ndarray:
    """n arrival times in seconds from 0 of a Poisson process at `rate` per second (exponential gaps)."""
    if not rate > 0 or n < 1:
        raise ValueError(f"rate must be > 0 and n >= 1, got rate {rate}, n {n}")
    return np.cumsum(np.random.default_rng(seed).exponential(1.0 / rate, size=n))


def requests_for(rate: float, *, seconds: float = 4.0, max_requests: int = MAX_REQUESTS) -> int:
    """Requests at one rate: `seconds` of the stream, at least enough for a p99 (and a margin), at most
    max_requests, and never more than MAX_SECONDS of the stream."""
    return int(max(P99_REQUESTS, min(rate * seconds, max_requests, rate * MAX_SECONDS)))


def stats_delta(before: dict, after: dict) -> dict:
    """What Triton did between two /v2/models/<m>/stats readings: requests, executions, mean queue and
    compute time per request (ms), and the batch sizes it executed (size -> count)."""
    def ns(d, k):
        return ((d.get("inference_stats") or {}).get(k) or {}).get("ns", 0)

    def cnt(d, k):
        return ((d.get("inference_stats") or {}).get(k) or {}).get("count", 0)

    ok = cnt(after, "success") - cnt(before, "success")
    out = {"requests": ok, "failed": cnt(after, "fail") - cnt(before, "fail"),
           "executions": after.get("execution_count", 0) - before.get("execution_count", 0)}
    for k in ("queue", "compute_input", "compute_infer", "compute_output"):
        out[f"{k}_ms"] = (ns(after, k) - ns(before, k)) / ok / 1e6 if ok else None
    sizes = Counter()
    prior = {b["batch_size"]: b.get("compute_infer", {}).get("count", 0) for b in before.get("batch_stats") or []}
    for b in after.get("batch_stats") or []:
        n = b.get("compute_infer", {}).get("count", 0) - prior.get(b["batch_size"], 0)
        if n:
            sizes[int(b["batch_size"])] = n
    out["batch_sizes"] = dict(sorted(sizes.items()))
    execs = sum(sizes.values())
    out["mean_batch"] = sum(s * n for s, n in sizes.items()) / execs if execs else None
    return out


def _first_line(e: BaseException) -> str:
    msg = str(e).strip().splitlines()[0][:120] if str(e).strip() else ""
    return f"{type(e).__name__}: {msg}" if msg else type(e).__name__


async def _drive(url: str, model: str, payloads: list, arrivals: np.ndarray, *, timeout_s: float,
                 max_seconds: float) -> dict:
    import tritonclient.http.aio as aio

    client = aio.InferenceServerClient(url.removeprefix("http://"), conn_limit=256)
    loop = asyncio.get_running_loop()
    lat, late, failures = [], [], Counter()

    async def one(i: int, due: float) -> None:
        late.append((loop.time() - due) * 1e3)
        try:
            await asyncio.wait_for(client.infer(model, payloads[i % len(payloads)]), timeout_s)
        except Exception as e:  # noqa: BLE001 — each failure counted and named, none lost
            failures[_first_line(e)] += 1
            return
        lat.append((loop.time() - due) * 1e3)

    tasks, start = [], loop.time()
    try:
        for i, t in enumerate(arrivals):
            if t > max_seconds:  # bounded in time: what was scheduled later is not sent
                break
            wait = start + t - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            tasks.append(asyncio.create_task(one(i, start + t)))
        await asyncio.gather(*tasks)
    finally:
        await client.close()
    return {"lat": lat, "late": late, "failures": failures, "sent": len(tasks), "wall": loop.time() - start}


def drive(url: str, model: str, payloads: list, rate: float, *, n: int, seed: int = 0, timeout_s: float = 5.0,
          max_seconds: float = MAX_SECONDS, server=None) -> dict:
    """Send n requests (payloads: lists of tritonclient.http InferInput, cycled) as a Poisson stream at
    `rate` req/s; returns the latency summary (ms, from the scheduled arrival), requests sent, answered
    and failed by reason, how late the client sent, its CPU share and the server's (`server`: a
    TritonServer), and Triton's own statistics for the stream."""
    if not url.startswith("http://127.0.0.1:"):
        raise ValueError(f"the client drives 127.0.0.1 only, not {url}")
    arrivals = poisson_arrivals(rate, n, seed=seed)
    before = server.stats(model) if server else {}
    cpu0, srv0, t0 = time.process_time(), server.cpu_seconds() if server else 0.0, time.perf_counter()
    r = asyncio.run(_drive(url, model, payloads, arrivals, timeout_s=timeout_s, max_seconds=max_seconds))
    wall = time.perf_counter() - t0
    cpu, srv = time.process_time() - cpu0, (server.cpu_seconds() - srv0) if server else None
    after = server.stats(model) if server else {}
    s = latency_summary(r["lat"])
    late = np.asarray(r["late"]) if r["late"] else np.zeros(1)
    return {"rate": float(rate), "scheduled": n, "sent": r["sent"], "not_sent": n - r["sent"],
            "answered": len(r["lat"]), "failed": dict(r["failures"]), "latency_ms": s,
            "achieved_rate": r["sent"] / r["wall"] if r["wall"] > 0 else None,
            "answered_rate": len(r["lat"]) / r["wall"] if r["wall"] > 0 else None,  # what the server kept up with
            "client_late_ms": {"p50": float(np.percentile(late, 50)), "max": float(late.max())},
            "client_cpu_cores": cpu / wall, "server_cpu_cores": srv / wall if srv is not None else None,
            "triton_stats": stats_delta(before, after) if server else None}
