"""An open-loop request stream through a dynamic batcher with Triton's semantics, simulated from
measured per-batch service times; and the search for the highest rate that keeps p99 under an SLO.

Triton's dynamic batcher (docs/user_guide/batcher.md, "Dynamic Batcher"): when a model instance
becomes free, requests are taken in arrival order. If a batch of a preferred size can be formed,
the largest such preferred batch is sent at once; if not, and max_queue_delay_microseconds > 0, the
batcher waits until the oldest request has waited that long (or a preferred size / max_batch_size
is reached), then sends the largest batch it can, at most max_batch_size. Without preferred sizes
max_batch_size is the size it waits for. Delay 0: send what is queued, now.

The simulation is deterministic (seeded): Poisson arrivals (exponential gaps, drawn once and scaled
by 1/rate, so every rate sees the same stream), a service time per batch drawn from the samples
measured at its size (between two measured sizes, the same quantile of both, interpolated in the
batch size: `ServiceTimes`), and end-to-end latency = completion - arrival. What it leaves out, said
in the results: network and (de)serialisation, the batcher's own overhead (tens of µs in Triton), and
copies of requests into one batch tensor. The highest rate is capped at UTIL_CAP (80%) of the
capacity at full batches, and every simulation serves at least MIN_BATCHES batches.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from overdrive.measure.percentiles import latency_summary, min_samples

__all__ = ["BatcherConfig", "ServiceTimes", "simulate", "serve_arrivals", "max_rate_under_slo", "search_settings",
           "simplicity", "rate_curve", "meets_slo", "UTIL_CAP", "MIN_BATCHES", "SETTING_TOL"]


@dataclass(frozen=True, kw_only=True)
class BatcherConfig:
    """What config.pbtxt's dynamic_batching and max_batch_size say."""

    max_batch_size: int
    """The largest batch the batcher forms (Triton's max_batch_size)."""
    preferred_batch_size: tuple[int, ...] = ()
    """Sizes sent as soon as they can be formed; empty = max_batch_size."""
    max_queue_delay_us: int = 0
    """How long the oldest request may wait for others to join its batch (max_queue_delay_microseconds)."""
    instances: int = 1
    """Model instances (instance_group count): batches run on them in parallel."""

    def __post_init__(self) -> None:
        if self.max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {self.max_batch_size}")
        if any(p < 1 or p > self.max_batch_size for p in self.preferred_batch_size):
            raise ValueError(f"preferred_batch_size {list(self.preferred_batch_size)} must lie in "
                             f"1..max_batch_size ({self.max_batch_size})")

    def to_dict(self) -> dict:
        return {**asdict(self), "preferred_batch_size": list(self.preferred_batch_size)}


class ServiceTimes:
    """Measured service times (ms) per batch size. A batch of a measured size costs a draw from its
    samples; one between two measured sizes costs the same quantile of both, interpolated linearly in
    the batch size (a batch of 200 between 128 and 256 costs what it would take, not what 256 took);
    one below the smallest measured size costs what that size cost (an upper bound, like padding)."""

    def __init__(self, samples: Mapping[int, Sequence[float]]) -> None:
        self.sizes = sorted(int(b) for b, xs in samples.items() if len(xs))
        if not self.sizes:
            raise ValueError("no measured service times")
        self.samples = {b: np.asarray(samples[b], dtype=float) for b in self.sizes}
        self._sorted = {b: np.sort(self.samples[b]).tolist() for b in self.sizes}

    @property
    def largest(self) -> int:
        return self.sizes[-1]

    def _bracket(self, b: int) -> tuple[int, int, float]:
        """(lower, upper measured size, weight of the upper) around a batch of b: (m, m, 1) at a measured size
        and below the smallest one."""
        i = bisect.bisect_left(self.sizes, b)
        if i == len(self.sizes):
            raise ValueError(f"batch {b} is above the largest measured batch {self.largest}")
        hi = self.sizes[i]
        if hi == b or i == 0:
            return hi, hi, 1.0
        lo = self.sizes[i - 1]
        return lo, hi, (b - lo) / (hi - lo)

    def quantile(self, b: int, u: float) -> float:
        """The service time (ms) of a batch of b at quantile u in [0, 1): for a measured size the sample
        of rank floor(u * n), so a uniform u is a uniform draw of its samples; between two measured sizes
        the interpolation of both at the same u (a slow moment is slow for every batch size)."""
        lo, hi, w = self._bracket(b)
        xs = self._sorted[hi]
        top = xs[min(int(u * len(xs)), len(xs) - 1)]
        if w == 1.0:
            return top
        ys = self._sorted[lo]
        return ys[min(int(u * len(ys)), len(ys) - 1)] * (1 - w) + top * w

    def median(self, b: int) -> float:
        """The median service time (ms) of a batch of b, interpolated between measured sizes as `quantile` does."""
        lo, hi, w = self._bracket(b)
        return float(np.median(self.samples[lo])) * (1 - w) + float(np.median(self.samples[hi])) * w

    def capacity(self, b: int, instances: int = 1) -> float:
        """Requests per second at a steady stream of full batches of b (median service time)."""
        return instances * b / (self.median(b) / 1e3)


UTIL_CAP = 0.8
"""The highest rate reported is at most this share of the capacity at full batches (median service
time): 20% headroom. Near saturation the p99 is decided by a few long busy periods that a simulation
of a few hundred batches cannot pin down: at 90%, ONNX Runtime's batch-256 settings that differ only
in their delay gave 78k to 123k req/s from the same samples, and the setting best in one quiet run
missed the SLO outright in the next; at 80%, 10 pairs of 5 quiet runs never contradicted."""

MIN_BATCHES = 200
"""A simulation serves at least this many batches: at 250k req/s in batches of 256, 4000 requests are
16 batches, and whether one of them drew a preempted call decided the p99."""


def _gaps(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).exponential(1.0, size=n)


def simulate(cfg: BatcherConfig, service: ServiceTimes, rate: float, *, requests: int = 4000, seed: int = 0,
             warmup_frac: float = 0.1, min_batches: int = MIN_BATCHES) -> np.ndarray:
    """End-to-end latencies (ms) of at least `requests` Poisson arrivals at `rate`/s through the batcher,
    continued until `min_batches` batches were served; the first warmup_frac are dropped (the queue
    starts empty, a server under traffic does not)."""
    lat = serve_arrivals(cfg, service, _arrivals(cfg, rate, requests, seed, min_batches), seed=seed,
                         stop_after=(requests, min_batches))
    return lat[int(lat.size * warmup_frac):]


def _arrivals(cfg: BatcherConfig, rate: float, requests: int, seed: int, min_batches: int) -> np.ndarray:
    if rate <= 0:
        raise ValueError(f"rate must be positive, got {rate}")
    n = min(max(requests, min_batches * cfg.max_batch_size), max(requests, 100_000))
    return np.cumsum(_gaps(n, seed)) / rate * 1e3                    # arrival times, ms


def meets_slo(cfg: BatcherConfig, service: ServiceTimes, rate: float, slo_ms: float, *, requests: int = 4000,
              seed: int = 0, warmup_frac: float = 0.1, min_batches: int = MIN_BATCHES) -> bool:
    """np.percentile(simulate(...), 99) <= slo_ms, the same simulation, but it stops as soon as enough
    requests past any possible warm-up cut have missed the SLO that the p99 cannot be under it (most
    of a rate search's misses are decided in the first few hundred batches)."""
    arr = _arrivals(cfg, rate, requests, seed, min_batches)
    n = arr.size
    # Counted from index int(warmup_frac * n) (the cut is at most that), against the longest tail
    # there can be (n - the shortest cut): this many misses put both order statistics around the
    # 99th percentile above the SLO, whatever the final count turns out to be.
    first = int(warmup_frac * n)
    kept_max = n - int(warmup_frac * requests)
    limit = 0.01 * (kept_max - 1) + 1
    lat = serve_arrivals(cfg, service, arr, seed=seed, stop_after=(requests, min_batches),
                         give_up=(slo_ms, first, limit))
    if lat is None:
        return False
    return float(np.percentile(lat[int(lat.size * warmup_frac):], 99)) <= slo_ms


def serve_arrivals(cfg: BatcherConfig, service: ServiceTimes, arrivals_ms: Sequence[float], *,
                   seed: int = 0, stop_after: tuple[int, int] | None = None,
                   give_up: tuple[float, int, float] | None = None) -> np.ndarray | None:
    """Latencies (ms) of requests arriving at the given sorted times through the batcher; with
    stop_after=(requests, batches), only until both that many requests and batches were served.
    give_up=(slo_ms, first, limit): None as soon as more than `limit` requests from index `first` on
    have taken longer than slo_ms (`meets_slo`'s early answer)."""
    if cfg.max_batch_size > service.largest:
        raise ValueError(f"max_batch_size {cfg.max_batch_size} is above the largest measured batch {service.largest}")
    arr = np.asarray(arrivals_ms, dtype=float).tolist()
    requests = len(arr)
    need_req, need_batches = stop_after or (requests, 0)
    rng = np.random.default_rng(seed + 1)
    delay = cfg.max_queue_delay_us / 1e3
    pref = sorted(cfg.preferred_batch_size) or [cfg.max_batch_size]
    target = pref[-1]
    free = [0.0] * cfg.instances                                       # when each instance is next free
    done = [0.0] * requests
    us: list[float] = []
    used = 0
    i = nb = 0
    slo, first, limit = give_up if give_up else (math.inf, requests, math.inf)
    missed = 0
    while i < requests and (i < need_req or nb < need_batches):
        k = min(range(cfg.instances), key=free.__getitem__) if cfg.instances > 1 else 0
        start = max(free[k], arr[i])                                   # an instance free, a request queued
        queued = bisect.bisect_right(arr, start, lo=i) - i
        if queued < target and delay > 0:
            # Wait for the oldest request's deadline, or for the queue to reach the target size.
            reach = arr[i + target - 1] if i + target - 1 < requests else math.inf
            start = max(start, min(arr[i] + delay, reach))
            queued = bisect.bisect_right(arr, start, lo=i) - i
        queued = min(queued, cfg.max_batch_size)
        fits = [p for p in pref if p <= queued]
        b = fits[-1] if fits and cfg.preferred_batch_size else queued  # the largest preferred size, else all
        if used >= len(us):                                            # quantiles drawn in blocks
            us, used = rng.random(1024).tolist(), 0
        s = service.quantile(b, us[used])
        used += 1
        free[k] = start + s
        done[i:i + b] = [free[k]] * b
        if i + b > first and free[k] - arr[max(i, first)] > slo:   # some of this batch missed the SLO
            missed += bisect.bisect_left(arr, free[k] - slo, max(i, first), i + b) - max(i, first)
            if missed > limit:
                return None
        i += b
        nb += 1
    return np.asarray(done[:i]) - np.asarray(arr[:i])


def max_rate_under_slo(cfg: BatcherConfig, service: ServiceTimes, slo_ms: float, *, requests: int = 4000,
                       seed: int = 0, rel_tol: float = 0.02, guess: float | None = None) -> float | None:
    """The highest Poisson rate (req/s) whose simulated p99 is <= slo_ms, by bisection in log rate
    (p99 grows with the rate); None if even a trickle (1% of capacity) misses the SLO. At most
    UTIL_CAP of the capacity at full batches (median service time). `guess` (a rate found before, e.g.
    on the pooled samples when these are a resample of them) brackets the bisection near it first."""
    cap = UTIL_CAP * service.capacity(cfg.max_batch_size, cfg.instances)

    def ok(r: float) -> bool:
        return meets_slo(cfg, service, r, slo_ms, requests=requests, seed=seed)

    if ok(cap):
        return cap
    lo, hi = cap * 0.01, cap
    checked_lo = False
    if guess:
        g_lo, g_hi = max(lo, min(cap, guess) / 1.25), min(cap, guess * 1.25)
        if ok(g_lo):
            lo, checked_lo = g_lo, True
            if g_hi < cap and not ok(g_hi):
                hi = g_hi
        else:
            hi = g_lo
    if not checked_lo and not ok(lo):
        return None
    while hi / lo > 1 + rel_tol:
        mid = math.sqrt(lo * hi)
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return lo


def search_settings(service: ServiceTimes, slo_ms: float, *, delays_us: Sequence[int] = (0, 250, 500, 1000, 2000),
                    instances: int = 1, requests: int = 4000, seed: int = 0, keep: float = 1.0) -> dict:
    """Every (max_batch_size, preferred sizes, delay) over the measured batch sizes, with the highest
    rate under the SLO of each; `best` is the highest (ties: the smaller batch, then the shorter
    delay). Which one to recommend is `choose_setting`'s business."""
    if requests * 0.9 < min_samples(99):
        raise ValueError(f"{requests} simulated requests cannot estimate a p99 (needs {min_samples(99)} after warm-up)")
    tried = []
    best_rate = 0.0
    # Largest capacity first: a setting whose capacity is below the best rate found cannot beat it.
    for b in sorted(service.sizes, key=lambda b: -service.capacity(b, instances)):
        for d in delays_us:
            if d / 1e3 >= slo_ms:
                continue
            prefs = [()] + ([(b // 2, b)] if d > 0 and b >= 4 else [])
            for pref in prefs:
                cfg = BatcherConfig(max_batch_size=b, preferred_batch_size=pref, max_queue_delay_us=d,
                                    instances=instances)
                if UTIL_CAP * service.capacity(b, instances) <= keep * best_rate:
                    continue
                r = max_rate_under_slo(cfg, service, slo_ms, requests=requests, seed=seed)
                tried.append((cfg, r))
                best_rate = max(best_rate, r or 0.0)
    ok = [(c, r) for c, r in tried if r]
    best = max(ok, key=lambda cr: (cr[1], -cr[0].max_batch_size, -cr[0].max_queue_delay_us)) if ok else None
    return {"best": None if best is None else {"config": best[0].to_dict(), "rate": best[1]},
            "tried": [{"config": c.to_dict(), "rate": r} for c, r in tried], "configs": tried,
            "requests": requests, "seed": seed}


SETTING_TOL = 0.05
"""Settings whose rates lie within 5% of the best are as good as it: the simplest of them is recommended."""


def simplicity(cfg: BatcherConfig) -> tuple:
    """The order of preference between settings that perform alike: smallest max_batch_size, then the
    shortest delay, then no preferred sizes, then fewest instances."""
    return (cfg.max_batch_size, cfg.max_queue_delay_us, len(cfg.preferred_batch_size), cfg.instances)


def rate_curve(cfg: BatcherConfig, service: ServiceTimes, rates: Sequence[float], *, requests: int = 4000,
               seed: int = 0) -> list[dict]:
    """Latency percentiles per rate for one batcher setting (the report's latency-vs-rate line)."""
    out = []
    for r in rates:
        s = latency_summary(simulate(cfg, service, r, requests=requests, seed=seed).tolist())
        out.append({"rate": float(r), "p50": s["p50"], "p99": s["p99"], "n": s["n"]})
    return out
