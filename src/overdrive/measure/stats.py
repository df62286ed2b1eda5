"""Statistics a busy host cannot fool: paired per-round ratios, a bootstrap over rounds, an A/A noise
floor measured in the same run, and the verdict that needs to clear it.

Why rounds and not steps: the steps of one turn share that moment's contention (another process on
the core, a frequency drop), so they are not independent samples. Resampling steps gives an interval
as narrow as if they were, and two runs of the same comparison then "prove" opposite things. The unit
of evidence is the round: in round k every contender runs one turn, close together in time; the
per-round ratio baseline_k / candidate_k is one sample, and the bootstrap resamples those. From 8
rounds the wildest 20% at each end are winsorized (a turn hit by another tenant's burst gives one
wild ratio), and the interval is widened to Student's t with Yuen's correction for the clipping.

The A/A control is the baseline against itself (a twin worker measured in the same rounds). Its
interval is what noise alone produces here and now; a difference is called only when the candidate's
interval clears it, so a host whose A/A spread is wide says "too busy to judge", not a false verdict.

Adaptive rounds (a run that measures until the evidence is in) look at the data more than once, and
each look is another chance for noise to cross a 95% line: stopping at the first look that says
"faster" would call an A/A difference far more often than 5% (peeking). The rule here is a fixed,
small schedule of looks (`look_rounds`: rounds 4, 8, 16, ... at most `LOOKS` of them) with the 5%
split evenly among them (Bonferroni): every interval a run reports is at level 1 - 0.05/looks, so
the chance that any look, and hence the one the run stopped at, calls a false difference stays
under 5% whenever and however often it stops (`NoiseFloor.looks` carries the split into `compare`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["summarize", "speedup_ci", "round_medians", "round_ratios", "paired_ci", "NoiseFloor", "noise_floor",
           "Comparison", "compare", "MIN_EVIDENCE_ROUNDS", "BUSY_FLOOR", "host_too_busy", "evidence_of_slowdown",
           "LOOKS", "look_level", "look_rounds", "settled", "ready_to_stop", "t_quantile", "PRACTICAL_MARGIN"]

MIN_EVIDENCE_ROUNDS = 3
"""An early stop or a verdict rests on at least this many rounds, each a different moment."""
BUSY_FLOOR = 1.15
"""An A/A interval wider than [1/1.15, 1.15] means the host's noise alone moves timings by more than
15%: no recommendation is made, the figures are shown instead."""
LOOKS = 4
"""An adaptive run looks at its rounds at most this many times (`look_rounds`), each at level
1 - 0.05/LOOKS: the Bonferroni split that keeps optional stopping honest."""
PRACTICAL_MARGIN = 1.05
"""A 'same' whose whole interval lies within [1/1.05, 1.05] cannot become a difference worth having
with more rounds: a settled verdict, like 'faster' and 'slower'."""


def look_level(looks: int = 1, level: float = 0.95) -> float:
    """The confidence of each interval when a run may stop at any of `looks` looks (Bonferroni)."""
    return 1 - (1 - level) / max(1, int(looks))


def look_rounds(first: int, last: int, looks: int = LOOKS) -> list[int]:
    """The rounds after which an adaptive run may stop: first, 2*first, 4*first, ... up to `last`
    (always included), at most `looks` of them. Fixed before any round is timed."""
    first = max(MIN_EVIDENCE_ROUNDS, int(first))
    last = max(first, int(last))
    out = [first]
    while len(out) < looks and out[-1] < last:
        out.append(min(last, 2 * out[-1]))
    if out[-1] < last:
        out[-1] = last
    return out


def t_quantile(p: float, df: int) -> float:
    """Student's t quantile (p in (0.5, 1)): exact for 1 and 2 degrees of freedom, the Cornish-Fisher
    series in the normal quantile above (Abramowitz & Stegun 26.7.5; within 0.3% from 3 on)."""
    from statistics import NormalDist

    df = max(1, int(df))
    if df == 1:
        return math.tan(math.pi * (p - 0.5))
    if df == 2:
        return (2 * p - 1) / math.sqrt(2 * p * (1 - p))
    z = NormalDist().inv_cdf(p)
    v = float(df)
    return (z + (z**3 + z) / (4 * v) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * v**2)
            + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * v**3)
            + (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / (92160 * v**4))


def summarize(xs: list[float]) -> dict:
    """median, p10, p90, mean, n of a list of samples (e.g. step times in ms)."""
    if not xs:
        return {"median": None, "p10": None, "p90": None, "mean": None, "n": 0}
    a = np.asarray(xs, dtype=float)
    return {"median": float(np.median(a)), "p10": float(np.percentile(a, 10)), "p90": float(np.percentile(a, 90)),
            "mean": float(a.mean()), "n": int(a.size)}


def speedup_ci(baseline: list[float], candidate: list[float], *, level: float = 0.95, resamples: int = 2000,
               seed: int = 0) -> tuple[float, float, float] | None:
    """median(baseline) / median(candidate) with a bootstrap over *independent* samples.

    Only for samples that really are independent (micro-benchmark repeats, each its own timing
    window); timed training steps come in rounds: use `paired_ci` on `round_medians`."""
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


def round_medians(rounds: list[list[float]]) -> list[float]:
    """One number per round (the median of that turn's step times): the unit of evidence."""
    return [float(np.median(r)) for r in rounds if len(r)]


def round_ratios(base: list[float], cand: list[float]) -> list[float]:
    """Per round k: base_k / cand_k (> 1: the candidate was faster in that round). Only the rounds
    both ran are paired: a stopped candidate is compared on the rounds it took part in."""
    n = min(len(base), len(cand))
    return [base[k] / cand[k] for k in range(n) if base[k] > 0 and cand[k] > 0]


def _trim(n: int) -> int:
    """Rounds clipped at each end of the sorted per-round log ratios: 20% from 8 rounds on, none below
    (a turn hit by a burst of another tenant gives one wild ratio; with few rounds every one counts)."""
    return n // 5 if n >= 8 else 0


def paired_ci(base: list[float], cand: list[float], *, level: float = 0.95, resamples: int = 4000,
              seed: int = 0) -> tuple[float, float, float] | None:
    """Speedup (base/cand) as the geometric mean of the per-round ratios (20%-winsorized from 8
    rounds), with a percentile bootstrap over rounds. `base`, `cand`: per-round medians
    (`round_medians`). None below 2 paired rounds."""
    r = np.sort(np.log(np.asarray(round_ratios(base, cand), dtype=float)))
    n = r.size
    if n < 2:
        return None
    g = _trim(n)
    if g:  # winsorize: the g wildest rounds at each end count as the nearest kept one, so a burst
        r = np.clip(r, r[g], r[n - 1 - g])  # resampled twice cannot come back in either
    rng = np.random.default_rng(seed)
    boot = r[rng.integers(0, n, size=(resamples, n))].mean(axis=1)
    alpha = (1 - level) / 2
    m = float(r.mean())
    # A percentile bootstrap over few rounds is too narrow (it spreads like s*sqrt((n-1)/n)/sqrt(n)
    # with normal quantiles); widen its deviations to Student's t with the kept rounds' freedom.
    # Winsorizing shrinks the spread it resamples: scale back by n/(n-2g) (Yuen's trimmed-mean error).
    h = n - 2 * g
    if level == 0.95:
        t_over_z = _t975(max(1, h - 1)) / 1.959964
    else:
        from statistics import NormalDist

        t_over_z = t_quantile(1 - alpha, h - 1) / NormalDist().inv_cdf(1 - alpha)
    widen = t_over_z * math.sqrt(n / (n - 1)) * n / h
    lo, hi = float(np.quantile(boot, alpha)), float(np.quantile(boot, 1 - alpha))
    return (math.exp(m), math.exp(m - widen * (m - lo)), math.exp(m + widen * (hi - m)))


_T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045,
         2.042]


def _t975(df: int) -> float:
    """Student's t 97.5% quantile (two-sided 95%)."""
    return _T975[df - 1] if 1 <= df <= len(_T975) else 1.96 + 2.4 / max(df, 1)


@dataclass(frozen=True)
class NoiseFloor:
    """The A/A control: the baseline against its twin, over the same rounds."""
    ratio: float
    """The A/A 'speedup' (1.0 on a perfect host)."""
    lo: float
    hi: float
    rounds: int
    spread_pct: float
    """Half-width of the A/A interval in percent (log scale): what noise alone does here."""
    looks: int = 1
    """The looks the run may stop at: this interval, and every `compare` against this floor, is at
    level `look_level(looks)`."""

    @property
    def factor(self) -> float:
        """exp(half-width): a candidate must beat this factor beyond its own interval."""
        return math.exp(self.spread_pct / 100)

    def to_dict(self) -> dict:
        return {"ratio": self.ratio, "ci": [self.lo, self.hi], "rounds": self.rounds, "spread_pct": self.spread_pct,
                "looks": self.looks, "level": look_level(self.looks)}


def noise_floor(base: list[float], twin: list[float], *, seed: int = 12345, looks: int = 1) -> NoiseFloor | None:
    """The A/A floor from the baseline's and its twin's per-round medians (None below 2 rounds), at
    the level of a run that may stop at `looks` looks."""
    ci = paired_ci(base, twin, seed=seed, level=look_level(looks))
    if ci is None:
        return None
    half = max(abs(math.log(ci[1])), abs(math.log(ci[2])))
    return NoiseFloor(ratio=ci[0], lo=ci[1], hi=ci[2], rounds=min(len(base), len(twin)), spread_pct=100 * half,
                      looks=max(1, int(looks)))


@dataclass(frozen=True)
class Comparison:
    verdict: str
    """faster | slower | same (within noise or the A/A floor) | unknown (too few rounds)"""
    speedup: float | None
    ci: tuple[float, float] | None
    rounds: int
    why: str

    def to_dict(self) -> dict:
        return {"verdict": self.verdict, "speedup": self.speedup, "ci": list(self.ci) if self.ci else None,
                "rounds": self.rounds, "why": self.why}


def compare(base: list[float], cand: list[float], floor: NoiseFloor | None = None, *, seed: int = 0,
            min_rounds: int = MIN_EVIDENCE_ROUNDS, looks: int | None = None) -> Comparison:
    """The verdict on per-round medians: 'faster' only when the whole paired interval lies above 1.0
    and the speedup itself exceeds what the A/A control (baseline vs its twin, same rounds) produced
    from noise alone; 'slower' likewise below. Fewer than `min_rounds` paired rounds: 'unknown'.
    The interval's level is that of the run's looks (`looks`, else the floor's)."""
    n = len(round_ratios(base, cand))
    k = looks if looks is not None else (floor.looks if floor else 1)
    ci = paired_ci(base, cand, seed=seed, level=look_level(k))
    if ci is None or n < min_rounds:
        return Comparison("unknown", ci[0] if ci else None, (ci[1], ci[2]) if ci else None, n,
                          f"{n} paired round(s); a verdict needs {min_rounds}")
    f = floor.factor if floor else 1.0
    s, lo, hi = ci
    floor_txt = f", beyond the A/A noise floor ±{floor.spread_pct:.1f}%" if floor else ""
    if lo > 1.0 and s > f:
        return Comparison("faster", s, (lo, hi), n, f"interval above 1.0{floor_txt}")
    if hi < 1.0 and s < 1 / f:
        return Comparison("slower", s, (lo, hi), n, f"interval below 1.0{floor_txt}")
    if floor and (lo > 1.0 or hi < 1.0):
        return Comparison("same", s, (lo, hi), n, f"{s:.2f}x is within the A/A noise floor ±{floor.spread_pct:.1f}%")
    return Comparison("same", s, (lo, hi), n, "interval includes 1.0")


def settled(c: Comparison, *, margin: float = PRACTICAL_MARGIN) -> bool:
    """More rounds could not change what this comparison decides: 'faster' or 'slower', or a 'same'
    whose whole interval lies within [1/margin, margin]."""
    if c.verdict in ("faster", "slower"):
        return True
    return c.verdict == "same" and c.ci is not None and c.ci[0] >= 1 / margin and c.ci[1] <= margin


def ready_to_stop(floor: NoiseFloor | None, comparisons: list[Comparison]) -> str | None:
    """At a look: why the rounds may stop now, or None to measure on. Only on evidence: the A/A floor
    is measured and narrow enough to judge (`host_too_busy` false), and every comparison that matters
    is `settled`. A run also stops at its last look or when its wall-time cap comes: the caller's."""
    if floor is None or host_too_busy(floor):
        return None
    if all(settled(c) for c in comparisons):
        return (f"settled after {floor.rounds} rounds: A/A floor ±{floor.spread_pct:.1f}%, every verdict "
                "decided (faster, slower, or the same within ±5%)")
    return None


def host_too_busy(floor: NoiseFloor | None, *, limit: float = BUSY_FLOOR) -> bool:
    """True when the A/A interval is wider than [1/limit, limit]: the host's own noise exceeds what a
    recommendation may rest on. No floor (too few rounds) is not 'busy': the verdicts say 'unknown'."""
    return floor is not None and floor.factor > limit


def evidence_of_slowdown(base: list[float], cand: list[float], factor: float, *, seed: int = 0,
                         floor: NoiseFloor | None = None) -> tuple[float, float, float] | None:
    """The paired interval when it says `cand` is more than `factor` times slower on at least
    MIN_EVIDENCE_ROUNDS rounds (the whole interval below 1/factor, and below the floor); else None.
    This is the only early stop: never from the steps of one moment."""
    if len(round_ratios(base, cand)) < MIN_EVIDENCE_ROUNDS:
        return None
    ci = paired_ci(base, cand, seed=seed, level=look_level(floor.looks if floor else 1))
    f = floor.factor if floor else 1.0
    if ci is None or ci[2] >= 1 / factor or ci[2] >= 1 / f:
        return None
    return ci
