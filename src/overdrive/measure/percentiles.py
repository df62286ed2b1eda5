"""How many samples a percentile needs, and its distribution-free interval (or "not estimable").

A p99 from 21 samples is the largest sample, not a p99. The order-statistic interval makes that
exact: for quantile q and n samples, the number of samples below the true quantile is Binomial(n, q),
so ranks (lo, hi) bracket it with the stated confidence; when no rank above the estimate exists
inside the samples (n < ~300 for a 95% p99), the percentile is not estimable from them.
"""

from __future__ import annotations

import math

__all__ = ["samples_needed", "quantile_ci", "estimable"]


def _binom_cdfs(n: int, p: float) -> list[float]:
    """[P(X <= k) for k in 0..n], X ~ Binomial(n, p), in one pass (pmf terms in log space)."""
    lp, lq, lg = math.log(p), math.log1p(-p), math.lgamma(n + 1)
    out, total = [], 0.0
    for i in range(n + 1):
        total += math.exp(lg - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * lp + (n - i) * lq)
        out.append(min(1.0, total))
    return out


def samples_needed(q: float, *, level: float = 0.95) -> int:
    """The fewest samples for which the q-quantile has an upper confidence bound inside the samples:
    1 - q**n >= level (the largest sample then lies above the quantile with that confidence).
    p50: 5, p90: 29, p99: 299, p99.9: 2995 at 95%."""
    if not 0 < q < 1:
        raise ValueError(f"quantile must be in (0, 1), got {q}")
    return math.ceil(math.log(1 - level) / math.log(q))


def estimable(n: int, q: float, *, level: float = 0.95) -> bool:
    return n >= samples_needed(q, level=level)


def quantile_ci(samples: list[float], q: float, *, level: float = 0.95) -> dict:
    """{"value", "lo", "hi", "n", "estimable", "needed"}: the q-quantile (nearest rank) with a
    distribution-free interval from order statistics; value/lo/hi are None when not estimable."""
    xs = sorted(samples)
    n = len(xs)
    need = samples_needed(q, level=level)
    out = {"value": None, "lo": None, "hi": None, "n": n, "estimable": False, "needed": need, "q": q}
    if n < need:
        return out
    alpha = (1 - level) / 2
    cdf = _binom_cdfs(n, q)  # cdf[k] = P(X <= k)
    # hi: the smallest rank j with P(X <= j-1) >= 1 - alpha; lo: the largest i with P(X <= i-1) <= alpha.
    hi_rank = next((j for j in range(1, n + 1) if cdf[j - 1] >= 1 - alpha), n)
    lo_rank = max([i for i in range(1, n + 1) if cdf[i - 1] <= alpha] or [1])
    rank = min(n, max(1, math.ceil(q * n)))
    out.update(value=xs[rank - 1], lo=xs[lo_rank - 1], hi=xs[hi_rank - 1], estimable=True)
    return out
