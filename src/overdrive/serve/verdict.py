"""One engine's verdict from its per-round service times: the batcher setting that holds the most
under the SLO, its rate with a 95% interval, and how stable the answer is over bootstrap resamples of
the rounds; or why the answer is fragile.

The unit of evidence is the round (the calls of one round share that moment's contention): the
rate's interval and each setting's held rate come from a bootstrap over rounds, every batch size of a
resample taken from the same rounds. The setting recommended is the one that holds the most (the rate
it keeps in 90% of the resamples), not the one fastest on the pooled samples: near the SLO's edge the
fastest is the one a repeated run loses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from overdrive.measure.percentiles import t975
from overdrive.measure.stats import BUSY_FLOOR
from overdrive.serve.batcher import (SETTING_TOL, UTIL_CAP, BatcherConfig, ServiceTimes, max_rate_under_slo,
                                     search_settings, simplicity)

__all__ = ["engine_verdict", "STABLE_SHARE", "RESAMPLES", "config_of", "kept_service_times", "short"]

STABLE_SHARE = 0.9
"""A setting's held rate is the one it keeps under the SLO in this share of the bootstrap resamples."""
RESAMPLES = 40
"""Bootstrap resamples over rounds per engine (each re-runs the rate search of the candidate settings)."""
REL_TOL = 0.02
"""The rate search's resolution (bisection to 2%): the interval is widened by it."""
CANDIDATES = 0.6
"""Settings whose rate on the pooled samples is at least 60% of the best are searched again on every
resample: a steadier setting a little slower on the pooled samples may hold more than the fastest."""


def _levels(rounds: dict[int, list[list[float]]]) -> np.ndarray:
    """Per round, how slow that moment was for this engine: the geometric mean over batch sizes of the
    round's median against the median of all rounds' medians at that batch."""
    logs = []
    for rs in rounds.values():
        med = np.array([np.median(r) if len(r) else np.nan for r in rs])
        logs.append(np.log(med / np.nanmedian(med)))
    return np.nanmean(np.array(logs), axis=0)


def _trim(idx: np.ndarray, levels: np.ndarray) -> np.ndarray:
    """The rounds kept of `idx`: from 8 rounds on, the n//5 slowest and fastest are set aside (the
    rule measure.stats applies to per-round ratios): a round hit by another tenant's burst would
    otherwise make the service times of the run that drew it, and it alone, slower."""
    g = len(idx) // 5 if len(idx) >= 8 else 0
    order = idx[np.argsort(levels[idx], kind="stable")]
    return order[g:len(order) - g]


def _resample(rounds: dict[int, list[list[float]]], idx: np.ndarray, levels: np.ndarray | None = None) -> ServiceTimes:
    if levels is not None:
        idx = _trim(idx, levels)
    return ServiceTimes({b: [x for k in idx for x in rs[k]] for b, rs in rounds.items()})


def engine_verdict(rounds: dict[int, list[list[float]]], slo_ms: float, *, requests: int = 4000, seed: int = 0,
                   resamples: int = RESAMPLES, floor_factor: float = 1.0,
                   delays_us: tuple[int, ...] = (0, 250, 500, 1000, 2000)) -> dict:
    """The recommendation for one engine from its per-round service samples {batch: [[ms, ...] per round]}:
    {"config", "rate", "held", "ci", "stability", "equivalent", "rounds", "resamples", "fragile": reason or
    None, "tried"}.

    The rounds pooled are those left after setting aside the n//5 slowest and fastest (`_trim`), in the
    run and in every resample alike. On the pooled samples: every setting's highest rate. The settings
    within CANDIDATES of the best are searched again on `resamples` bootstrap resamples of the rounds
    (the same rounds for every batch size). A setting's `held` rate is the one it keeps under the SLO in
    STABLE_SHARE of the resamples (their 10th percentile). A setting that is the fastest on the pooled
    samples but sits at the SLO's edge (the p99 decided by a few slow calls: some resamples miss at far
    lower rates) holds little; one that keeps its rate in nearly every resample holds nearly all of it.
    `equivalent`: the settings within 5% of the one that holds the most, both in held rate and in rate
    on the pooled samples (a repeated run may recommend any of them); the recommendation is the
    simplest of them (`batcher.simplicity`). `stability`: the share of resamples in which no setting
    outside the equivalent ones beats the recommendation by more than 5% and than its interval's upper
    end; below STABLE_SHARE the answer is fragile (a repeated run may find that other winner: typically
    the fastest setting on the pooled samples, at the SLO's edge). `settings`: every candidate's rate
    and held rate, which `agree` reads to check one run's recommendation against another's evidence.
    The rate's 95% interval is the bootstrap's, widened to Student's t for the kept rounds, by the A/A
    floor factor and by the search's 2% resolution (`_interval`)."""
    n_rounds = min(len(rs) for rs in rounds.values())
    ev = _Evidence({b: rs[:n_rounds] for b, rs in rounds.items()}, slo_ms, requests, seed, resamples,
                   np.random.default_rng(seed + 7))
    svc = ev.kept()
    found = search_settings(svc, slo_ms, requests=requests, seed=seed, delays_us=delays_us, keep=CANDIDATES)
    point = {c: r for c, r in found["configs"]}
    top = max((r for r in point.values() if r), default=0.0)
    if not top:
        return _none_met(ev, svc, len(point))
    cands = _candidates(point, svc, top)
    boots = ev.bootstrap(cands)
    # Settings that missed on the pooled samples were searched for what the resamples say of them; only
    # those that met the SLO there can be recommended.
    held = {c: float(np.quantile(b, 1 - STABLE_SHARE)) for c, b in boots.items() if cands[c]}
    if not any(held.values()):
        return _none_holds(ev, svc, cands, held, len(point))
    # The settings as good as the one that holds the most: within 5% of its held rate and of its rate on the
    # pooled samples (a simpler setting that holds as much but runs slower is not the same answer).
    steadiest = max(held, key=lambda c: (held[c], [-x for x in simplicity(c)]))
    equivalent = sorted((c for c in held if held[c] >= (1 - SETTING_TOL) * held[steadiest]
                         and cands[c] >= (1 - SETTING_TOL) * cands[steadiest]), key=simplicity)
    chosen = equivalent[0]
    rate = cands[chosen]
    lo, hi = _interval(rate, boots[chosen], ev.n, floor_factor * (1 + REL_TOL))
    stability, rival = _stability(boots, equivalent, chosen, hi)
    fragile = _fragile(ev, boots, cands, held, chosen, rival, stability, (lo, hi))
    settings = [{"config": c.to_dict(), "rate": cands[c], "held": h} for c, h in
                sorted(held.items(), key=lambda ch: -ch[1])]
    return {"config": chosen.to_dict(), "rate": rate, "held": held[chosen],
            "ci": [lo, hi if math.isfinite(hi) else None],  # JSON: no inf
            "stability": stability, "equivalent": [c.to_dict() for c in equivalent], "settings": settings,
            "rounds": ev.n, "resamples": resamples, "fragile": fragile, "tried": len(point),
            "at_largest_batch": chosen.max_batch_size == svc.largest}


@dataclass
class _Evidence:
    """One engine's rounds (cut to the same count per batch) and how they are searched and resampled."""

    rounds: dict[int, list[list[float]]]
    slo_ms: float
    requests: int
    seed: int
    resamples: int
    rng: np.random.Generator

    def __post_init__(self) -> None:
        self.n = min(len(rs) for rs in self.rounds.values())
        self.levels = _levels(self.rounds)

    def kept(self) -> ServiceTimes:
        """The service times of the rounds the run keeps (`_trim`)."""
        return _resample(self.rounds, np.arange(self.n), self.levels)

    def draw(self) -> ServiceTimes:
        """One bootstrap resample of the rounds, trimmed as the run is."""
        return _resample(self.rounds, self.rng.integers(0, self.n, self.n), self.levels)

    def bootstrap(self, cands: dict[BatcherConfig, float | None]) -> dict[BatcherConfig, list[float]]:
        """Each candidate's highest rate under the SLO on every resample (0 where it met it at no rate)."""
        boots: dict[BatcherConfig, list[float]] = {c: [] for c in cands}
        for _ in range(self.resamples):
            s = self.draw()
            for c, r in cands.items():
                boots[c].append(max_rate_under_slo(c, s, self.slo_ms, requests=self.requests, seed=self.seed,
                                                   guess=r, rel_tol=REL_TOL) or 0.0)
        return boots


def _none_met(ev: _Evidence, svc: ServiceTimes, tried: int) -> dict:
    """Nothing met the SLO: would a resample let the quickest setting (smallest batch, no delay) meet it?"""
    quick = BatcherConfig(max_batch_size=svc.sizes[0])
    met = sum(bool(max_rate_under_slo(quick, ev.draw(), ev.slo_ms, requests=ev.requests, seed=ev.seed))
              for _ in range(ev.resamples))
    return {"config": None, "rate": None, "held": None, "ci": None, "stability": 1 - met / ev.resamples,
            "rounds": ev.n, "resamples": ev.resamples, "tried": tried, "equivalent": [],
            "fragile": (f"fragile: no setting met the SLO, but {met} of {ev.resamples} resamples of the rounds did"
                        if met / ev.resamples > 1 - STABLE_SHARE else None)}


def _candidates(point: dict[BatcherConfig, float | None], svc: ServiceTimes, top: float) -> dict:
    """The settings searched again on every resample: those within CANDIDATES of the best, and per batch size
    whose settings all missed here (or fell short) the best of them, since it may meet the SLO in a
    resample (fewer slow draws) and the resamples can then speak for it."""
    cands = {c: r for c, r in point.items() if r and r >= CANDIDATES * top}
    for b in svc.sizes:
        of_b = [(c, r) for c, r in point.items() if c.max_batch_size == b]
        if of_b and not any(c in cands for c, _ in of_b) and UTIL_CAP * svc.capacity(b) >= CANDIDATES * top:
            c, r = max(of_b, key=lambda cr: cr[1] or 0.0)
            cands[c] = r
    return cands


def _none_holds(ev: _Evidence, svc: ServiceTimes, cands: dict, held: dict, tried: int) -> dict:
    """No setting keeps the SLO in STABLE_SHARE of the resamples: the fastest on the pooled samples, fragile."""
    c = max(cands, key=lambda c: cands[c] or 0.0)
    return {"config": c.to_dict(), "rate": cands[c], "held": 0.0 if held else None, "ci": [0.0, None],
            "stability": 0.0,
            "rounds": ev.n, "resamples": ev.resamples, "tried": tried, "equivalent": [],
            "at_largest_batch": c.max_batch_size == svc.largest,
            "fragile": (f"fragile: no setting keeps the SLO in {STABLE_SHARE:.0%} of {ev.resamples} resamples "
                        f"of the {ev.n} rounds (the p99 rests on a few slow calls)")}


def _stability(boots: dict, equivalent: list, chosen: BatcherConfig, hi: float) -> tuple[float, BatcherConfig | None]:
    """How often a different answer wins, and the setting that wins most: a setting outside the equivalent
    ones (one that missed on the pooled samples included) beats the recommendation in a resample when it
    exceeds both the recommendation's rate there by 5% and the upper end of its interval (beyond what
    this run can tell apart)."""
    others = [c for c in boots if c not in equivalent]
    mine = np.array(boots[chosen])
    bar = np.maximum(mine / (1 - SETTING_TOL), hi if math.isfinite(hi) else np.inf)
    wins = {c: np.array(boots[c]) > bar for c in others}
    beaten = np.any(np.array(list(wins.values())), axis=0) if wins else np.zeros(mine.shape, bool)
    return float(1 - beaten.mean()), (max(wins, key=lambda c: wins[c].mean()) if wins else None)


def _fragile(ev: _Evidence, boots: dict, cands: dict, held: dict, chosen: BatcherConfig,
             rival: BatcherConfig | None, stability: float, ci: tuple[float, float]) -> str | None:
    """Why the recommendation is fragile, or None."""
    (lo, hi), rate, resamples, n_rounds = ci, cands[chosen], ev.resamples, ev.n
    missed = sum(1 for b in boots[chosen] if b <= 0)
    if missed:  # the interval is [0, inf]: say why, not "known only to [0, inf]"
        return (f"fragile: in {missed} of {resamples} resamples of the {n_rounds} rounds the recommended setting "
                f"({short(chosen.to_dict())}) met the SLO at no rate (its p99 rests on a few slow calls)")
    if not lo or not math.isfinite(hi) or hi / lo > BUSY_FLOOR ** 2:
        return (f"fragile: the rate is known only to [{lo:,.0f}, {hi:,.0f}] req/s, wider than "
                f"±{100 * (BUSY_FLOOR - 1):.0f}%")
    if stability < STABLE_SHARE:
        # A rival that wins some resamples by more than the run can tell apart: a setting at the SLO's edge
        # (it keeps the SLO on some draws of the slow calls, not on others), so which of the two a repeated
        # run recommends depends on the slow calls it draws.
        return (f"fragile: {short(rival.to_dict())} ("
                + (f"{cands[rival]:,.0f} req/s on the pooled samples, holds {held[rival]:,.0f}"
                   if cands[rival] else "missed the SLO on the pooled samples")
                + f") beats the recommendation ({short(chosen.to_dict())}, {rate:,.0f} [{lo:,.0f}-{hi:,.0f}]) "
                f"beyond its interval in {1 - stability:.0%} of {resamples} resamples of the {n_rounds} rounds: "
                f"the p99 there rests on a few slow calls")
    return None


def _interval(rate: float, boot: list[float], n_rounds: int, widen_by: float) -> tuple[float, float]:
    """The bootstrap's 95% percentile interval in log rate, its deviations widened to Student's t with
    n_rounds - 1 degrees of freedom (a percentile bootstrap over 10 rounds is too narrow), then by
    `widen_by`: the A/A floor factor times the search's resolution (1.02). The bootstrap over rounds
    carries this run's round-to-round noise but not the host's drift from one run to the next (ONNX
    Runtime's batch-256 service time moved 7% between two quiet runs minutes apart, outside both
    bootstrap intervals); the A/A twins' paired interval is this run's measure of how far two identical
    measurements can sit apart, and the interval is widened by it."""
    if n_rounds < 2 or min(boot) <= 0:
        return 0.0, math.inf
    lb = np.log(np.asarray(boot, dtype=float))
    m = math.log(rate)
    q_lo, q_hi = (float(x) for x in np.quantile(lb, [0.025, 0.975]))
    kept = n_rounds - 2 * (n_rounds // 5 if n_rounds >= 8 else 0)
    # Student's t for the kept rounds' freedom (Yuen's h - 1). Every resample is trimmed as the run is
    # (`_resample`), so the bootstrap already carries the trimmed estimate's own spread.
    widen = t975(max(1, kept - 1)) / 1.959964 * math.sqrt(n_rounds / (n_rounds - 1))
    return (math.exp(m - widen * max(0.0, m - q_lo)) / widen_by,
            math.exp(m + widen * max(0.0, q_hi - m)) * widen_by)


def config_of(d: dict) -> BatcherConfig:
    """A setting as results.json holds it, as a BatcherConfig (its instance kind left out)."""
    return BatcherConfig(**{k: tuple(v) if k == "preferred_batch_size" else v for k, v in d.items() if k != "kind"})


def kept_service_times(rounds: dict[int, list[list[float]]], n_rounds: int) -> ServiceTimes:
    """The service times of the rounds an estimate over `n_rounds` rounds keeps (`_trim`)."""
    return _resample(rounds, np.arange(n_rounds), _levels(rounds))


def short(c: dict) -> str:
    """'64/[32]/500µs': a setting's max batch size, preferred sizes and delay, in one word."""
    return f"{c['max_batch_size']}/{list(c.get('preferred_batch_size') or [])}/{c['max_queue_delay_us']}µs"
