"""Statistics for timings: median and spread, and speedup ratios with a bootstrap interval."""

from __future__ import annotations

import numpy as np

__all__ = ["summarize", "speedup_ci"]


def summarize(xs: list[float]) -> dict:
    """median, p10, p90, mean, n of a list of samples (e.g. step times in ms)."""
    if not xs:
        return {"median": None, "p10": None, "p90": None, "mean": None, "n": 0}
    a = np.asarray(xs, dtype=float)
    return {"median": float(np.median(a)), "p10": float(np.percentile(a, 10)), "p90": float(np.percentile(a, 90)),
            "mean": float(a.mean()), "n": int(a.size)}


def speedup_ci(baseline: list[float], candidate: list[float], *, level: float = 0.95, resamples: int = 2000,
               seed: int = 0) -> tuple[float, float, float] | None:
    """median(baseline) / median(candidate) and a bootstrap confidence interval for it.

    Both samples are resampled independently (they come from interleaved rounds, so slow drift
    of the machine hits both alike); the interval is the percentile interval of the ratio.
    """
    if len(baseline) < 2 or len(candidate) < 2:
        return None
    b, c = np.asarray(baseline, dtype=float), np.asarray(candidate, dtype=float)
    rng = np.random.default_rng(seed)
    bi = rng.integers(0, b.size, size=(resamples, b.size))
    ci = rng.integers(0, c.size, size=(resamples, c.size))
    ratios = np.median(b[bi], axis=1) / np.median(c[ci], axis=1)
    alpha = (1 - level) / 2
    return (float(np.median(b) / np.median(c)), float(np.quantile(ratios, alpha)),
            float(np.quantile(ratios, 1 - alpha)))
