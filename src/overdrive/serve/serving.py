"""The click model served under a request stream: per engine, the highest Poisson rate whose p99
end-to-end latency stays under the SLO, the dynamic-batcher settings that achieve it, and how sure
this run is of both: or, when it cannot be sure, no verdict and the reason.

Measured: per-batch service times of eager, compiled and ONNX Runtime (outputs checked equal first),
in interleaved rounds whose order is shuffled per round (`engines.measure_service`), with A/A twins
of eager at the smallest and the largest batch. Simulated from them: the Triton batcher over the
settings (`batcher.search_settings`). The unit of evidence is the round (the calls of one round share
that moment's contention): the rate's interval and each setting's held rate come from a bootstrap
over rounds, every batch size of a resample taken from the same rounds. The setting recommended is
the one that holds the most (the rate it keeps in 90% of the resamples), not the one fastest on the
pooled samples: near the SLO's edge the fastest is the one a repeated run loses.

Each engine is judged against its own control: its own A/A twins at the smallest batch (eager's also
at the largest); an engine without twins (results written before, a server measured from outside) is
judged against eager's. An engine's verdict is withheld, with the figures and the check that tripped, when
- its control says the host is too busy: a twin pair's per-round interval is wider than `BUSY_FLOOR`
  (the bench's "too busy to judge"), or the twins' highest rates under the SLO differ by more than it;
- the answer is fragile: no setting keeps the SLO in `STABLE_SHARE` of the resamples; a setting not
  equivalent to the recommendation beats it beyond its interval in more than 1 - `STABLE_SHARE` of
  them (a setting at the SLO's edge: a repeated run may count it or not); or the rate is known only
  to wider than ±(BUSY_FLOOR - 1).
Two runs agree (`agree`) when both give a verdict with overlapping intervals and each run's evidence
accepts the other's setting (the same one, or one whose rate there reaches the lower end of that run's
interval); a run that withholds contradicts nothing.
"""

from __future__ import annotations

import math

import numpy as np

from overdrive.measure.percentiles import latency_summary, t975
from overdrive.measure.stats import BUSY_FLOOR
from overdrive.serve.aa_control import _flat, _rounds, busy_reason, floor_figures, own_floors, service_floor
from overdrive.measure.threads import load_report, plan_threads
from overdrive.serve.batcher import (SETTING_TOL, UTIL_CAP, BatcherConfig, ServiceTimes,
                                     max_rate_under_slo, rate_curve, search_settings, simplicity)

__all__ = ["run_serving", "click_served_model", "summarize_serving", "service_floor", "engine_verdict", "agree",
           "host_shift",
           "serving_threads",
           "STABLE_SHARE", "RESAMPLES"]

SIM_NOTE = ("simulated from measured service times: Poisson arrivals, Triton's dynamic-batcher rules, a batch "
            "costs a draw of its measured size's service times (between two measured sizes, the same quantile of "
            "both, interpolated), at most 80% of the capacity at full batches; "
            "not included: network, (de)serialisation, the batcher's own overhead, copying requests into one batch")

STABLE_SHARE = 0.9
"""A setting's held rate is the one it keeps under the SLO in this share of the bootstrap resamples."""
RESAMPLES = 40
"""Bootstrap resamples over rounds per engine (each re-runs the rate search of the candidate settings)."""
REL_TOL = 0.02
"""The rate search's resolution (bisection to 2%): the interval is widened by it."""
CANDIDATES = 0.6
"""Settings whose rate on the pooled samples is at least 60% of the best are searched again on every
resample: a steadier setting a little slower on the pooled samples may hold more than the fastest."""


def _cfg(d: dict) -> BatcherConfig:
    return BatcherConfig(**{k: tuple(v) if k == "preferred_batch_size" else v for k, v in d.items() if k != "kind"})


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
    rounds = {b: rs[:n_rounds] for b, rs in rounds.items()}
    levels = _levels(rounds)
    svc = _resample(rounds, np.arange(n_rounds), levels)
    found = search_settings(svc, slo_ms, requests=requests, seed=seed, delays_us=delays_us, keep=CANDIDATES)
    point = {c: r for c, r in found["configs"]}
    top = max((r for r in point.values() if r), default=0.0)
    rng = np.random.default_rng(seed + 7)
    if not top:
        # Nothing met the SLO: would a resample let the quickest setting (smallest batch, no delay) meet it?
        quick = BatcherConfig(max_batch_size=svc.sizes[0])
        met = sum(bool(max_rate_under_slo(quick, _resample(rounds, rng.integers(0, n_rounds, n_rounds), levels), slo_ms,
                                          requests=requests, seed=seed)) for _ in range(resamples))
        return {"config": None, "rate": None, "held": None, "ci": None, "stability": 1 - met / resamples,
                "rounds": n_rounds, "resamples": resamples, "tried": len(point), "equivalent": [],
                "fragile": (f"fragile: no setting met the SLO, but {met} of {resamples} resamples of the rounds did"
                            if met / resamples > 1 - STABLE_SHARE else None)}
    cands = {c: r for c, r in point.items() if r and r >= CANDIDATES * top}
    # A batch size whose settings all missed here (or fell short) may meet the SLO in a resample (fewer
    # slow draws): its best setting is searched too, so the resamples can speak for it.
    for b in svc.sizes:
        of_b = [(c, r) for c, r in point.items() if c.max_batch_size == b]
        if of_b and not any(c in cands for c, _ in of_b) and UTIL_CAP * svc.capacity(b) >= CANDIDATES * top:
            c, r = max(of_b, key=lambda cr: cr[1] or 0.0)
            cands[c] = r
    boots: dict[BatcherConfig, list[float]] = {c: [] for c in cands}
    for _ in range(resamples):
        s = _resample(rounds, rng.integers(0, n_rounds, n_rounds), levels)
        for c, r in cands.items():
            boots[c].append(max_rate_under_slo(c, s, slo_ms, requests=requests, seed=seed, guess=r,
                                               rel_tol=REL_TOL) or 0.0)
    # Settings that missed on the pooled samples were searched for what the resamples say of them; only
    # those that met the SLO there can be recommended.
    held = {c: float(np.quantile(b, 1 - STABLE_SHARE)) for c, b in boots.items() if cands[c]}
    if not any(held.values()):
        c = max(cands, key=lambda c: cands[c] or 0.0)
        return {"config": c.to_dict(), "rate": cands[c], "held": 0.0 if held else None, "ci": [0.0, None],
                "stability": 0.0,
                "rounds": n_rounds, "resamples": resamples, "tried": len(point), "equivalent": [],
                "at_largest_batch": c.max_batch_size == svc.largest,
                "fragile": (f"fragile: no setting keeps the SLO in {STABLE_SHARE:.0%} of {resamples} resamples "
                            f"of the {n_rounds} rounds (the p99 rests on a few slow calls)")}
    # The settings as good as the one that holds the most: within 5% of its held rate and of its rate on the
    # pooled samples (a simpler setting that holds as much but runs slower is not the same answer).
    steadiest = max(held, key=lambda c: (held[c], [-x for x in simplicity(c)]))
    equivalent = sorted((c for c in held if held[c] >= (1 - SETTING_TOL) * held[steadiest]
                         and cands[c] >= (1 - SETTING_TOL) * cands[steadiest]), key=simplicity)
    chosen = equivalent[0]
    rate = cands[chosen]
    lo, hi = _interval(rate, boots[chosen], n_rounds, floor_factor * (1 + REL_TOL))
    # How often a different answer wins: a setting outside the equivalent ones (one that missed on the pooled
    # samples included) beats the recommendation in a resample when it exceeds both the recommendation's
    # rate there by 5% and the upper end of its interval (beyond what this run can tell apart).
    others = [c for c in boots if c not in equivalent]
    mine = np.array(boots[chosen])
    bar = np.maximum(mine / (1 - SETTING_TOL), hi if math.isfinite(hi) else np.inf)
    wins = {c: np.array(boots[c]) > bar for c in others}
    beaten = np.any(np.array(list(wins.values())), axis=0) if wins else np.zeros(mine.shape, bool)
    stability = float(1 - beaten.mean())
    rival = max(wins, key=lambda c: wins[c].mean()) if wins else None
    fragile = None
    missed = sum(1 for b in boots[chosen] if b <= 0)
    if missed:  # the interval is [0, inf]: say why, not "known only to [0, inf]"
        fragile = (f"fragile: in {missed} of {resamples} resamples of the {n_rounds} rounds the recommended setting "
                   f"({_short(chosen.to_dict())}) met the SLO at no rate (its p99 rests on a few slow calls)")
    elif not lo or not math.isfinite(hi) or hi / lo > BUSY_FLOOR ** 2:
        fragile = (f"fragile: the rate is known only to [{lo:,.0f}, {hi:,.0f}] req/s, wider than "
                   f"±{100 * (BUSY_FLOOR - 1):.0f}%")
    elif stability < STABLE_SHARE:
        # A rival that wins some resamples by more than the run can tell apart: a setting at the SLO's edge
        # (it keeps the SLO on some draws of the slow calls, not on others), so which of the two a repeated
        # run recommends depends on the slow calls it draws.
        fragile = (f"fragile: {_short(rival.to_dict())} ("
                   + (f"{cands[rival]:,.0f} req/s on the pooled samples, holds {held[rival]:,.0f}"
                      if cands[rival] else "missed the SLO on the pooled samples")
                   + f") beats the recommendation ({_short(chosen.to_dict())}, {rate:,.0f} [{lo:,.0f}-{hi:,.0f}]) "
                   f"beyond its interval in {1 - stability:.0%} of {resamples} resamples of the {n_rounds} rounds: "
                   f"the p99 there rests on a few slow calls")
    settings = [{"config": c.to_dict(), "rate": cands[c], "held": h} for c, h in
                sorted(held.items(), key=lambda ch: -ch[1])]
    return {"config": chosen.to_dict(), "rate": rate, "held": held[chosen],
            "ci": [lo, hi if math.isfinite(hi) else None],  # JSON: no inf
            "stability": stability, "equivalent": [c.to_dict() for c in equivalent], "settings": settings,
            "rounds": n_rounds, "resamples": resamples, "fragile": fragile, "tried": len(point),
            "at_largest_batch": chosen.max_batch_size == svc.largest}


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


def summarize_serving(measured: dict, engines: list, slo_ms: float, *, requests: int = 4000, seed: int = 0,
                      loads: tuple[dict, dict] | None = None, resamples: int = RESAMPLES,
                      curve: bool = True, delays_us: tuple[int, ...] = (0, 250, 500, 1000, 2000)) -> dict:
    """The serving results from measured per-round service samples (pure: tested without timing anything).

    measured: {"samples": {engine: {batch: [[ms...] per round]}}, "aa": [{"of", "batch", "a", "b",
    "rate_check"}]}."""
    out: dict = {"slo_ms": slo_ms, "note": SIM_NOTE, "engines": {}, "requests": requests, "seed": seed,
                 "resamples": resamples}
    floor = service_floor(measured.get("aa") or [], slo_ms, requests=requests, seed=seed)
    out["noise_floor"] = floor
    if loads:
        out["load"] = {"before": loads[0], "after": loads[1],
                       "busy": bool(loads[0].get("busy") or loads[1].get("busy"))}
    figures = floor_figures(floor, loads)
    own = own_floors(measured.get("aa") or [], slo_ms, requests=requests, seed=seed)
    out["noise_floors"] = own
    for e in engines:
        row: dict = {"label": e.label, "status": e.status, "reason": e.reason, "kind": e.kind,
                     "max_abs_error_vs_eager": e.meta.get("max_abs_error_vs_eager"), "best": None}
        samples = measured["samples"].get(e.name)
        if e.status != "ok" or not samples:
            out["engines"][e.name] = row
            continue
        rounds = {int(b): _rounds(xs) for b, xs in samples.items()}
        row["service"] = {str(b): latency_summary(_flat(rs)) for b, rs in rounds.items()}
        control = own.get(e.name) or floor  # its own twins; else eager's (all the pairs measured)
        row["control"] = e.name if e.name in own else (floor.get("of") or "none measured")
        busy_why = busy_reason(control, loads)
        est = engine_verdict(rounds, slo_ms, requests=requests, seed=seed, resamples=resamples,
                             floor_factor=control["factor"], delays_us=delays_us)
        row["estimate"] = est
        why = busy_why or (f"{est['fragile']} ({floor_figures(control, loads)})" if est["fragile"] else None)
        row["verdict"] = "withheld" if why else "given"
        row["withheld"] = why
        if not why and est["config"]:
            row["best"] = {"config": {**est["config"], "kind": e.kind}, "rate": est["rate"], "held": est["held"],
                           "ci": est["ci"], "stability": est["stability"], "equivalent": est["equivalent"],
                           "settings": est["settings"],
                           "at_largest_batch": est["at_largest_batch"]}
        if curve and est["config"]:
            cfg, top = _cfg(est["config"]), est["rate"]
            svc = _resample(rounds, np.arange(est["rounds"]), _levels(rounds))  # the rounds the estimate kept
            row["curve"] = {"config": est["config"], "points": rate_curve(cfg, svc, np.geomspace(top * 0.05, top * 1.1, 12),
                                                                          requests=requests, seed=seed)}
        row["tried"] = est["tried"]
        out["engines"][e.name] = row
    given = {k: r for k, r in out["engines"].items() if r.get("best")}
    # The run's verdict is given where any engine's is (each judged against its own control); none given:
    # the run's reason is the engines' own reasons, never a figure that was inside the limit.
    judged = [r for r in out["engines"].values() if r.get("verdict")]
    out["verdict"] = "given" if any(r["verdict"] == "given" for r in judged) else "withheld"
    out["withheld"] = None
    if out["verdict"] == "withheld":
        busy = [r["withheld"] for r in judged if (r.get("withheld") or "").startswith("too busy")]
        out["withheld"] = ((busy[0] if len(set(busy)) == 1 else "; ".join(dict.fromkeys(busy)))
                           if busy and len(busy) == len(judged) else
                           "no engine's answer held: " + "; ".join(
                               f"{k}: {_no_figures(r.get('withheld')) or 'no setting met the SLO'}"
                               for k, r in out["engines"].items() if r.get("verdict")) + f" ({figures})")
    out["winner"] = None
    # A winner only among engines that were all judged: one whose verdict was withheld may be the faster.
    if given and not any(r.get("verdict") == "withheld" for r in judged):
        k = max(given, key=lambda k: given[k]["best"]["rate"])
        others = [r["best"]["ci"][1] for k2, r in given.items() if k2 != k]
        # A winner only when its interval clears every other engine's.
        out["winner"] = k if not others or given[k]["best"]["ci"][0] > max(others) else None
    out["text"] = "; ".join(f"{k}: {_best_text(r)}" for k, r in out["engines"].items())
    if out["verdict"] == "withheld":
        out["text"] = f"no verdict: {out['withheld']}"
    if out.get("load", {}).get("busy") and out["verdict"] == "given":
        out["text"] += (f" (host busy: load {out['load']['before']['load1']} -> {out['load']['after']['load1']} on "
                        f"{out['load']['before']['cores']} cores; figures are this host's, now)")
    return out


def _no_figures(why: str | None) -> str | None:
    """An engine's reason without the figures in its last parenthesis (the run's line says them once)."""
    return why.rsplit(" (", 1)[0] if why and why.endswith(")") else why


def _best_text(r: dict) -> str:
    if r.get("status") != "ok":
        return r.get("reason") or r.get("status")
    if r.get("withheld"):
        return f"no verdict: {r['withheld']}"
    if not r.get("best"):
        return "no setting meets the SLO"
    b, c = r["best"], r["best"]["config"]
    pref = f", preferred {c['preferred_batch_size']}" if c["preferred_batch_size"] else ""
    cap = " (the largest batch measured: capacity-bound)" if b.get("at_largest_batch") else ""
    return (f"{b['rate']:,.0f} req/s [{b['ci'][0]:,.0f}-{b['ci'][1]:,.0f}] with max_batch_size {c['max_batch_size']}"
            f"{pref}, delay {c['max_queue_delay_us']} µs{cap}, {held_text(b)}")


def held_text(best: dict) -> str:
    """'holds 107,197 in 90% of resamples; 2 other setting(s) within 5%': the held rate and the
    equivalent settings of a recommendation, as the table and the report print them."""
    eq = len(best.get("equivalent") or []) - 1
    alt = f"; {eq} other setting(s) within 5%" if eq > 0 else ""
    return f"holds {best['held']:,.0f} in {STABLE_SHARE:.0%} of resamples{alt}"


def _same_setting(a: dict, b: dict) -> bool:
    keys = ("max_batch_size", "preferred_batch_size", "max_queue_delay_us", "instances")
    return all(list(a.get(k) or []) == list(b.get(k) or []) if k == "preferred_batch_size" else a.get(k) == b.get(k)
               for k in keys)


def _accepts(best: dict, cfg: dict) -> bool:
    """Whether a run's evidence accepts another run's recommended setting: the same setting, or one whose
    rate on this run's pooled samples reaches the lower end of this run's recommended interval (a
    setting this run did not search again was below 60% of its best: not accepted)."""
    if _same_setting(best["config"], cfg):
        return True
    for row in best.get("settings") or ():
        if _same_setting(row["config"], cfg):
            return bool(row.get("rate")) and row["rate"] >= best["ci"][0]
    return any(_same_setting(e, cfg) for e in best.get("equivalent") or ())


def agree(a: dict, b: dict) -> dict:
    """Two serving results (results.json's "serving") side by side, per engine: "agree" (both gave a
    verdict, overlapping rate intervals, and each run's evidence accepts the other's setting:
    `_accepts`), "withheld" (either gave none: nothing to contradict), "contradict" (disjoint intervals,
    or a setting the other run measured below its interval), "host-changed" (the same engines at the
    same batches ran more than ±15% apart in median service time: the host's own speed moved between
    the runs, as a shared VM's does when a neighbour arrives, and no interval from one run can cover
    the other), or "missing". Threads differ: said beside it (the two runs measured different
    configurations)."""
    out: dict = {"engines": {}, "contradictions": 0}
    shift = host_shift(a, b)
    out["host_shift"] = shift
    moved = shift is not None and abs(shift["log_ratio"]) > math.log(BUSY_FLOOR)
    for name in sorted(set(a.get("engines", {})) | set(b.get("engines", {}))):
        ra, rb = a.get("engines", {}).get(name) or {}, b.get("engines", {}).get(name) or {}
        if ra.get("status") != "ok" or rb.get("status") != "ok":
            out["engines"][name] = {"status": "missing", "why": "not measured in both runs"}
            continue
        if moved:
            out["engines"][name] = {"status": "host-changed", "why": (
                f"the host itself ran {abs(shift['pct']):.0f}% {'slower' if shift['pct'] > 0 else 'faster'} in the "
                f"second run (median service time over "
                f"{shift['pairs']} engine-batch pairs): two measurements of different host speeds, beyond the "
                f"±{100 * (BUSY_FLOOR - 1):.0f}% a verdict tolerates, neither agree nor contradict")}
            continue
        ba, bb = ra.get("best"), rb.get("best")
        if ra.get("withheld") or rb.get("withheld") or not ba or not bb:
            out["engines"][name] = {"status": "withheld", "why": ra.get("withheld") or rb.get("withheld") or
                                    "no setting met the SLO in one run"}
            continue
        (la, ha), (lb, hb) = ((lo, math.inf if hi is None else hi) for lo, hi in (ba["ci"], bb["ci"]))
        same = _same_setting(ba["config"], bb["config"])
        accepted = same or (_accepts(ba, bb["config"]) and _accepts(bb, ba["config"]))
        overlap = la <= hb and lb <= ha
        pair = f"settings {_short(ba['config'])} vs {_short(bb['config'])}"
        why = (("same settings, intervals overlap" if same else f"{pair}, each accepted by the other run's "
                "evidence, intervals overlap") if accepted and overlap else
               "; ".join(w for w in (None if accepted else f"{pair}: one run measured the other's below its interval",
                                     None if overlap else f"intervals [{la:,.0f}, {ha:,.0f}] vs [{lb:,.0f}, {hb:,.0f}]")
                         if w))
        row = {"status": "agree" if accepted and overlap else "contradict", "why": why,
               "rates": [ba["rate"], bb["rate"]], "ci": [ba["ci"], bb["ci"]]}
        out["contradictions"] += row["status"] == "contradict"
        out["engines"][name] = row
    if a.get("threads") != b.get("threads"):
        out["threads"] = f"threads differ ({a.get('threads')} vs {b.get('threads')}): different configurations"
    return out


def host_shift(a: dict, b: dict) -> dict | None:
    """How much slower the host ran in b than in a: the median over every engine and batch measured in
    both of log(b's service p50 / a's), as {"log_ratio", "pct", "pairs"}; None without common pairs."""
    logs = []
    for name, ea in (a.get("engines") or {}).items():
        eb = (b.get("engines") or {}).get(name) or {}
        for bs, sa in (ea.get("service") or {}).items():
            sb = (eb.get("service") or {}).get(bs) or {}
            if sa.get("p50") and sb.get("p50"):
                logs.append(math.log(sb["p50"] / sa["p50"]))
    if not logs:
        return None
    m = float(np.median(logs))
    return {"log_ratio": m, "pct": 100 * (math.exp(m) - 1), "pairs": len(logs)}


def _short(c: dict) -> str:
    return f"{c['max_batch_size']}/{list(c.get('preferred_batch_size') or [])}/{c['max_queue_delay_us']}µs"


def run_serving(suite, env, *, slo_ms: float, seed: int = 0, progress=None, model=None) -> dict:
    """Measure the engines on `model` (a `serve.export.ServedModel`: a user's FILE.py:FACTORY) or, by
    default, on the suite's click model (table_scale), at the suite's serve_batches, and summarise."""
    import tempfile

    import torch

    from overdrive.serve.engines import MIN_ROUND_MS, check_engines, measure_service, serving_engines

    torch.manual_seed(seed)
    if model is None:
        model = click_served_model(suite, seed)
    batches = list(suite.serve_batches)
    inputs = {b: tuple(model.inputs(b)) for b in batches}
    before = load_report()
    threads, why = serving_threads(before, torch.get_num_threads())
    was = torch.get_num_threads()
    torch.set_num_threads(threads)  # every engine (torch and ONNX Runtime) with the same intra-op threads
    try:
        with tempfile.TemporaryDirectory(prefix="overdrive-onnx-") as tmp:  # ORT reads the file at session start
            engines = serving_engines(model.module.eval(), inputs, env, spec=model.spec, dynamic=model.dynamic,
                                      compile=suite.compile, workdir=tmp)
        check_engines(engines, batches)
        measured = measure_service(engines, batches, rounds=suite.serve_rounds, reps=suite.serve_reps,
                                   progress=progress, seed=seed,
                                   min_round_ms=getattr(suite, "serve_min_round_ms", MIN_ROUND_MS))
    finally:
        torch.set_num_threads(was)
    after = load_report()
    res = summarize_serving(measured, engines, slo_ms, seed=seed, loads=(before, after),
                            resamples=getattr(suite, "serve_resamples", RESAMPLES))
    res["model"] = model.description
    res["model_identity"] = model.identity
    res["batches"] = batches
    res["rounds"], res["reps"] = suite.serve_rounds, suite.serve_reps
    res["reps_per_key"] = measured.get("reps_per_key")
    res["threads"], res["threads_why"] = threads, why
    return res


def click_served_model(suite, seed: int = 0):
    """The built-in DLRM click model with the suite's table scale (weights from `seed`), served with bag length 5."""
    import torch

    from overdrive.recsys import DLRM, CriteoSpec
    from overdrive.serve.export import (CLICK_DYNAMIC, CLICK_IDENTITY, CLICK_SPEC, ClickServing, ServedModel,
                                       click_inputs)

    torch.manual_seed(seed)
    base = CriteoSpec()
    spec = CriteoSpec(table_sizes=tuple(max(10, int(n * suite.table_scale)) for n in base.table_sizes))
    return ServedModel(ClickServing(DLRM(spec)).eval(), lambda b: click_inputs(b, 5, seed=seed + b, spec=spec),
                       CLICK_SPEC, CLICK_DYNAMIC,
                       f"DLRM click model, {sum(spec.table_sizes):,} embedding rows, bag length 5",
                       {**CLICK_IDENTITY, "table_scale": suite.table_scale})


def serving_threads(load: dict, default: int) -> tuple[int, str]:
    """Intra-op threads per engine: half the cores the host's load leaves free, at least one
    (measure.threads.plan_threads for the free cores: one engine runs at a time; this process, busy
    while planning, is not counted as another tenant). A p99 judged over thousands of calls counts
    every call whose threads met at an op's barrier while one of them was descheduled, so the tail,
    not the median, decides the thread count: on an idle 2-core host 2 threads gave eager batch-1
    calls p50 0.52 / p99 8.0 ms against 0.55 / 1.1 ms with 1, and at load 18 calls went from 0.3 to
    10 ms. The other half is headroom for the host's own work."""
    cores = int(load.get("cores") or default)
    plan = plan_threads(active=1, cores=min(cores, max(1, default)), load=load.get("load1"), own_running=1)
    threads = max(1, plan.threads // 2)
    how = f"load {load['load1']} on {cores} cores" if load.get("load1") is not None else "load not readable"
    return threads, (f"{threads} ({how}: half the {plan.threads} core(s) the host's other work leaves free, "
                     f"the rest headroom for the p99)")
