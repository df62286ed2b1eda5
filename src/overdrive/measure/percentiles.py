"""Percentiles that say when they do not know: a percentile only from enough samples, with a
distribution-free interval, and the A/A noise floor of a latency (the same call measured twice).
Used by the latency bench and the serving simulation; free of torch.

Why a minimum sample count: the p-th percentile's 95% interval, from order statistics alone (no
assumption on the shape of the distribution), is [x_(l), x_(u)] with l, u the binomial(n, p)
quantiles. Its upper end exists only when P(no sample above the percentile) = p^n < 2.5%, i.e.
n >= log(0.025) / log(p): 6 samples for p50, 72 for p95, 368 for p99. Below that the sample's
largest value is not an upper bound for the percentile at 95%: we say "not estimable".
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

__all__ = ["min_samples", "percentile", "latency_summary", "aa_floor", "t975", "PERCENTILES"]

PERCENTILES = (50, 95, 99)


def min_samples(p: float, *, level: float = 0.95) -> int:
    """The fewest samples whose order statistics bound the p-th percentile (p in 0..100) at `level`."""
    q = p / 100.0
    if not 0.0 < q < 1.0:
        raise ValueError(f"percentile must be in (0, 100), got {p}")
    return math.ceil(math.log((1 - level) / 2) / math.log(q))


def _binom_cdf(n: int, q: float) -> np.ndarray:
    """P(Bin(n, q) <= k) for k = 0..n, in log space (n up to millions without overflow)."""
    k = np.arange(n + 1)
    logpmf = (math.lgamma(n + 1) - np.array([math.lgamma(i + 1) for i in k]) -
              np.array([math.lgamma(n - i + 1) for i in k]) + k * math.log(q) + (n - k) * math.log1p(-q))
    return np.cumsum(np.exp(logpmf - logpmf.max())) / np.exp(logpmf - logpmf.max()).sum()


def percentile(xs: Sequence[float], p: float, *, level: float = 0.95) -> dict:
    """{"value", "lo", "hi", "n", "estimable", "needs"}: the p-th percentile and its order-statistic
    interval; value/lo/hi are None when n < min_samples(p) (the note says how many it needs)."""
    a = np.sort(np.asarray(xs, dtype=float))
    n, need = int(a.size), min_samples(p, level=level)
    out = {"n": n, "needs": need, "estimable": n >= need, "value": None, "lo": None, "hi": None}
    if n < need:
        return out
    cdf = _binom_cdf(n, p / 100.0)
    alpha = (1 - level) / 2
    # l: the largest rank with P(Bin < l) <= alpha; u: the smallest with P(Bin < u) >= 1 - alpha (1-based ranks).
    lo_rank = int(np.searchsorted(cdf, alpha, side="right"))          # number of k with cdf(k) <= alpha
    hi_rank = int(np.searchsorted(cdf, 1 - alpha, side="left")) + 1
    out.update(value=float(np.percentile(a, p)), lo=float(a[max(lo_rank, 1) - 1]), hi=float(a[min(hi_rank, n) - 1]))
    return out


def latency_summary(xs: Sequence[float], *, level: float = 0.95) -> dict:
    """p50/p95/p99 (None where not estimable), their intervals, n, and a note naming what is missing."""
    out: dict = {"n": len(xs)}
    missing = []
    for p in PERCENTILES:
        st = percentile(xs, p, level=level)
        out[f"p{p}"] = st["value"]
        out[f"p{p}_ci"] = [st["lo"], st["hi"]] if st["estimable"] else None
        if not st["estimable"]:
            missing.append(f"p{p} needs {st['needs']}")
    out["max"] = float(max(xs)) if len(xs) else None
    out["note"] = f"not estimable from {len(xs)} samples: {', '.join(missing)}" if missing else None
    return out


def aa_floor(a: Sequence[float], b: Sequence[float]) -> dict:
    """The noise floor from an A/A control (the same call measured twice, interleaved): the relative
    difference of the two samples' p50 and p99. A difference between two engines smaller than this
    is not a difference this host can show."""
    sa, sb = latency_summary(a), latency_summary(b)
    out = {"n": [len(a), len(b)]}
    for p in ("p50", "p99"):
        x, y = sa[p], sb[p]
        out[f"{p}_rel"] = None if x is None or y is None else round(abs(x - y) / min(x, y), 4)
    return out


_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t975(df: int) -> float:
    """Student's t 97.5% quantile (a two-sided 95% interval) for df degrees of freedom; beyond the
    table, 1.96 + 2.4/df (within 0.002 of the exact value from df 30)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    return _T975[df - 1] if df <= len(_T975) else 1.959964 + 2.4 / df
