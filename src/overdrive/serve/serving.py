"""The click model served under a request stream: per engine, the highest Poisson rate whose p99
end-to-end latency stays under the SLO, the dynamic-batcher settings that achieve it, and how sure
this run is of both: or, when it cannot be sure, no verdict and the reason.

Measured: per-batch service times of eager, compiled and ONNX Runtime (outputs checked equal first),
in interleaved rounds whose order is shuffled per round (`engines.measure_service`), with A/A twins
of eager at the smallest and the largest batch. Simulated from them: the Triton batcher over the
settings (`batcher.search_settings`). The unit of evidence is the round (the calls of one round share
that moment's contention): the rate's interval and the settings' stability come from a bootstrap
over rounds, every batch size of a resample taken from the same rounds.

The verdict is withheld, with the figures, when
- the host is too busy: an A/A twin's per-round interval is wider than `BUSY_FLOOR` (the bench's
  "too busy to judge"), or the A/A twins' highest rates differ by more than it;
- the answer is fragile: the recommended setting is chosen in fewer than `STABLE_SHARE` of the
  resamples, or the rate is known only to wider than ±(BUSY_FLOOR - 1).
Two runs agree (`agree`) when both give a verdict with the same settings and overlapping intervals;
a run that withholds contradicts nothing.
"""

from __future__ import annotations

import math

import numpy as np

from overdrive.measure.percentiles import aa_floor, latency_summary, t975
from overdrive.measure.stats import BUSY_FLOOR, host_too_busy, noise_floor, round_medians
from overdrive.measure.threads import load_report, plan_threads
from overdrive.serve.batcher import (BatcherConfig, ServiceTimes, choose_setting, max_rate_under_slo, rate_curve,
                                     search_settings)

__all__ = ["run_serving", "summarize_serving", "service_floor", "engine_verdict", "agree", "serving_threads",
           "STABLE_SHARE", "RESAMPLES"]

SIM_NOTE = ("simulated from measured service times: Poisson arrivals, Triton's dynamic-batcher rules, a batch "
            "costs a draw from the smallest measured batch >= it, at most 90% of the capacity at full batches; "
            "not included: network, (de)serialisation, the batcher's own overhead, copying requests into one batch")

STABLE_SHARE = 0.9
"""The recommended setting must be the one chosen in at least this share of the bootstrap resamples."""
RESAMPLES = 40
"""Bootstrap resamples over rounds per engine (each re-runs the rate search of the candidate settings)."""
REL_TOL = 0.02
"""The rate search's resolution (bisection to 2%): the interval is widened by it."""
CANDIDATES = 0.7
"""Settings whose rate on the pooled samples is within 70% of the best are re-searched on each resample:
the ones a resample could plausibly choose instead."""


def _rounds(xs) -> list[list[float]]:
    """Samples as rounds: a list of per-round lists, or a flat list (one round)."""
    xs = list(xs)
    if xs and isinstance(xs[0], (list, tuple, np.ndarray)):
        return [list(r) for r in xs]
    return [xs]


def _flat(rounds: list[list[float]]) -> list[float]:
    return [x for r in rounds for x in r]


def _cfg(d: dict) -> BatcherConfig:
    return BatcherConfig(**{k: tuple(v) if k == "preferred_batch_size" else v for k, v in d.items() if k != "kind"})


def service_floor(pairs: list[dict], slo_ms: float, *, requests: int = 4000, seed: int = 0) -> dict:
    """The A/A floor of the service times: per twin pair (the same engine and batch measured as two keys
    in the same rounds), the per-round paired interval (measure.stats.noise_floor), the percentiles'
    difference, and at the smallest batch the difference of the two twins' highest rates under the SLO
    (what noise alone does to the answer). busy: any of them beyond BUSY_FLOOR."""
    out: dict = {"pairs": [], "factor": 1.0, "busy": False, "limit": BUSY_FLOOR}
    for p in pairs:
        a, b = _rounds(p["a"]), _rounds(p["b"])
        nf = noise_floor(round_medians(a), round_medians(b))
        row = {"of": p["of"], "batch": p["batch"], **aa_floor(_flat(a), _flat(b)),
               "rounds": min(len(a), len(b)), "round_floor": nf.to_dict() if nf else None}
        if nf:
            out["factor"] = max(out["factor"], nf.factor)
            out["busy"] = out["busy"] or host_too_busy(nf)
        if p.get("rate_check"):
            cfg = BatcherConfig(max_batch_size=p["batch"])
            ra, rb = (max_rate_under_slo(cfg, ServiceTimes({p["batch"]: _flat(x)}), slo_ms, requests=requests,
                                         seed=seed) for x in (a, b))
            row["rates"] = [ra, rb]
            ratio = (max(ra, rb) / min(ra, rb)) if ra and rb else (1.0 if ra == rb else math.inf)
            row["rate_ratio"] = ratio if math.isfinite(ratio) else None  # None: one twin met the SLO, the other not
            row["rate_split"] = not math.isfinite(ratio)
            out["busy"] = out["busy"] or ratio > BUSY_FLOOR
        out["pairs"].append(row)
    if out["pairs"]:
        worst = max(out["pairs"], key=lambda r: (r["round_floor"] or {}).get("spread_pct") or 0.0)
        out["spread_pct"] = (worst["round_floor"] or {}).get("spread_pct")
        out["of"] = worst["of"]
        rr = [r["rate_ratio"] for r in out["pairs"] if r.get("rate_ratio") is not None]
        out["rate_split"] = any(r.get("rate_split") for r in out["pairs"])
        out["rate_spread_pct"] = round(100 * (max(rr) - 1), 1) if rr else None
    return out


def _floor_figures(floor: dict | None, loads: tuple[dict, dict] | None) -> str:
    """'load 3.8 on 2 cores, A/A spread ±2.1% per round, ±4.0% in rate': the figures beside a withheld verdict."""
    parts = []
    if loads:
        parts.append(f"load {loads[0].get('load1')} -> {loads[1].get('load1')} on {loads[0].get('cores')} cores")
    if floor and floor.get("pairs"):
        sp = floor.get("spread_pct")
        rs = floor.get("rate_spread_pct")
        parts.append(f"A/A spread ±{sp:.1f}% per round" if sp is not None else "A/A spread: too few rounds")
        if floor.get("rate_split"):
            parts.append("one A/A twin met the SLO, the other not")
        elif rs is not None:
            parts.append(f"A/A rates differ by {rs:.1f}%")
    return ", ".join(parts)


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
    {"config", "rate", "ci", "stability", "rounds", "resamples", "fragile": reason or None, "tried"}.

    The rounds pooled are those left after setting aside the n//5 slowest and fastest (`_trim`), in the
    run and in every resample alike. On the pooled samples: every setting's highest rate, then the simplest within 5% of the best
    (`choose_setting`). On `resamples` bootstrap resamples of the rounds (the same rounds for every
    batch size): the candidates' rates again, the choice again. The rate's 95% interval is the
    bootstrap's, widened to Student's t for the few rounds, for the trimming, by the A/A floor factor
    and by the search's 2% resolution; stability is
    the share of resamples that chose the same setting."""
    n_rounds = min(len(rs) for rs in rounds.values())
    rounds = {b: rs[:n_rounds] for b, rs in rounds.items()}
    levels = _levels(rounds)
    svc = _resample(rounds, np.arange(n_rounds), levels)
    found = search_settings(svc, slo_ms, requests=requests, seed=seed, delays_us=delays_us)
    point = {c: r for c, r in found["configs"]}
    top = max((r for r in point.values() if r), default=0.0)
    rng = np.random.default_rng(seed + 7)
    if not top:
        # Nothing met the SLO: would a resample let the quickest setting (smallest batch, no delay) meet it?
        quick = BatcherConfig(max_batch_size=svc.sizes[0])
        met = sum(bool(max_rate_under_slo(quick, _resample(rounds, rng.integers(0, n_rounds, n_rounds), levels), slo_ms,
                                          requests=requests, seed=seed)) for _ in range(resamples))
        return {"config": None, "rate": None, "ci": None, "stability": 1 - met / resamples, "rounds": n_rounds,
                "resamples": resamples, "tried": len(point),
                "fragile": (f"fragile: no setting met the SLO, but {met} of {resamples} resamples of the rounds did"
                            if met / resamples > 1 - STABLE_SHARE else None)}
    cands = {c: r for c, r in point.items() if r and r >= CANDIDATES * top}
    chosen = choose_setting(cands)
    # A larger batch that missed here may meet the SLO in a resample (fewer slow draws): each such size's
    # best setting is re-searched too, so a resample can choose it.
    for b in (b for b in svc.sizes if svc.capacity(b) > svc.capacity(chosen.max_batch_size)):
        of_b = [(c, r) for c, r in point.items() if c.max_batch_size == b]
        if of_b and not any(c in cands for c, _ in of_b):
            c, r = max(of_b, key=lambda cr: cr[1] or 0.0)
            cands[c] = r
    boot, same = [], 0
    for _ in range(resamples):
        s = _resample(rounds, rng.integers(0, n_rounds, n_rounds), levels)
        rates = {c: max_rate_under_slo(c, s, slo_ms, requests=requests, seed=seed, guess=r, rel_tol=REL_TOL)
                 for c, r in cands.items()}
        same += choose_setting(rates) == chosen
        boot.append(rates[chosen] or 0.0)
    rate = cands[chosen]
    lo, hi = _interval(rate, boot, n_rounds, floor_factor * (1 + REL_TOL))
    stability = same / resamples
    fragile = None
    if stability < STABLE_SHARE:
        fragile = (f"fragile: the setting is chosen in only {stability:.0%} of {resamples} resamples of the "
                   f"{n_rounds} rounds (a verdict needs {STABLE_SHARE:.0%})")
    elif not lo or not math.isfinite(hi) or hi / lo > BUSY_FLOOR ** 2:
        fragile = (f"fragile: the rate is known only to [{lo:,.0f}, {hi:,.0f}] req/s, wider than "
                   f"±{100 * (BUSY_FLOOR - 1):.0f}%")
    return {"config": chosen.to_dict(), "rate": rate, "ci": [lo, hi if math.isfinite(hi) else None],  # JSON: no inf
            "stability": stability, "rounds": n_rounds,
            "resamples": resamples, "fragile": fragile, "tried": len(point),
            "at_largest_batch": chosen.max_batch_size == svc.largest}


def _interval(rate: float, boot: list[float], n_rounds: int, floor_factor: float) -> tuple[float, float]:
    """The bootstrap's 95% percentile interval in log rate, its deviations widened to Student's t with
    n_rounds - 1 degrees of freedom (a percentile bootstrap over 10 rounds is too narrow), then by the
    A/A floor factor and the search's resolution (`floor_factor`)."""
    if n_rounds < 2 or min(boot) <= 0:
        return 0.0, math.inf
    lb = np.log(np.asarray(boot, dtype=float))
    m = math.log(rate)
    q_lo, q_hi = (float(x) for x in np.quantile(lb, [0.025, 0.975]))
    kept = n_rounds - 2 * (n_rounds // 5 if n_rounds >= 8 else 0)
    # Student's t for the kept rounds' freedom; n/kept for the trimming (Yuen: a trimmed mean's error is
    # the winsorized spread scaled by n/h; the bootstrap of the kept middle alone sees too little of it).
    widen = t975(max(1, kept - 1)) / 1.959964 * math.sqrt(n_rounds / (n_rounds - 1)) * n_rounds / kept
    return (math.exp(m - widen * max(0.0, m - q_lo)) / floor_factor,
            math.exp(m + widen * max(0.0, q_hi - m)) * floor_factor)


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
    figures = _floor_figures(floor, loads)
    busy_reason = (f"too busy to judge: the A/A control is beyond ±{100 * (BUSY_FLOOR - 1):.0f}% ({figures})"
                   if floor["busy"] else None)
    out["verdict"] = "withheld" if busy_reason else "given"
    out["withheld"] = busy_reason
    for e in engines:
        row: dict = {"label": e.label, "status": e.status, "reason": e.reason, "kind": e.kind,
                     "max_abs_error_vs_eager": e.meta.get("max_abs_error_vs_eager"), "best": None}
        samples = measured["samples"].get(e.name)
        if e.status != "ok" or not samples:
            out["engines"][e.name] = row
            continue
        rounds = {int(b): _rounds(xs) for b, xs in samples.items()}
        row["service"] = {str(b): latency_summary(_flat(rs)) for b, rs in rounds.items()}
        est = engine_verdict(rounds, slo_ms, requests=requests, seed=seed, resamples=resamples,
                             floor_factor=floor["factor"], delays_us=delays_us)
        row["estimate"] = est
        why = busy_reason or (f"{est['fragile']} ({figures})" if est["fragile"] else None)
        row["verdict"] = "withheld" if why else "given"
        row["withheld"] = why
        if not why and est["config"]:
            row["best"] = {"config": {**est["config"], "kind": e.kind}, "rate": est["rate"], "ci": est["ci"],
                           "stability": est["stability"], "at_largest_batch": est["at_largest_batch"]}
        if curve and est["config"]:
            cfg, top = _cfg(est["config"]), est["rate"]
            svc = _resample(rounds, np.arange(est["rounds"]), _levels(rounds))  # the rounds the estimate kept
            row["curve"] = {"config": est["config"], "points": rate_curve(cfg, svc, np.geomspace(top * 0.05, top * 1.1, 12),
                                                                          requests=requests, seed=seed)}
        row["tried"] = est["tried"]
        out["engines"][e.name] = row
    given = {k: r for k, r in out["engines"].items() if r.get("best")}
    # The run's verdict is given only where an engine's is: a host quiet enough but every answer fragile is
    # no verdict either.
    if not any(r.get("verdict") == "given" for r in out["engines"].values()):
        out["verdict"] = "withheld"
        out["withheld"] = busy_reason or f"no engine's answer held: each was fragile or failed ({figures})"
    out["winner"] = None
    if given:
        k = max(given, key=lambda k: given[k]["best"]["rate"])
        others = [r["best"]["ci"][1] for k2, r in given.items() if k2 != k]
        # A winner only when its interval clears every other engine's.
        out["winner"] = k if not others or given[k]["best"]["ci"][0] > max(others) else None
    out["text"] = "; ".join(f"{k}: {_best_text(r)}" for k, r in out["engines"].items())
    if busy_reason:
        out["text"] = f"no verdict: {busy_reason}"
    if out.get("load", {}).get("busy") and not busy_reason:
        out["text"] += (f" (host busy: load {out['load']['before']['load1']} -> {out['load']['after']['load1']} on "
                        f"{out['load']['before']['cores']} cores; figures are this host's, now)")
    return out


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
            f"{pref}, delay {c['max_queue_delay_us']} µs{cap}, chosen in {b['stability']:.0%} of resamples")


def _same_setting(a: dict, b: dict) -> bool:
    keys = ("max_batch_size", "preferred_batch_size", "max_queue_delay_us", "instances")
    return all(list(a.get(k) or []) == list(b.get(k) or []) if k == "preferred_batch_size" else a.get(k) == b.get(k)
               for k in keys)


def agree(a: dict, b: dict) -> dict:
    """Two serving results (results.json's "serving") side by side, per engine: "agree" (both gave a
    verdict, the same settings, overlapping rate intervals), "withheld" (either gave none: nothing to
    contradict), "contradict" (the settings differ or the intervals do not overlap), or "missing".
    Threads differ: said beside it (the two runs measured different configurations)."""
    out: dict = {"engines": {}, "contradictions": 0}
    for name in sorted(set(a.get("engines", {})) | set(b.get("engines", {}))):
        ra, rb = a.get("engines", {}).get(name) or {}, b.get("engines", {}).get(name) or {}
        if ra.get("status") != "ok" or rb.get("status") != "ok":
            out["engines"][name] = {"status": "missing", "why": "not measured in both runs"}
            continue
        ba, bb = ra.get("best"), rb.get("best")
        if ra.get("withheld") or rb.get("withheld") or not ba or not bb:
            out["engines"][name] = {"status": "withheld", "why": ra.get("withheld") or rb.get("withheld") or
                                    "no setting met the SLO in one run"}
            continue
        (la, ha), (lb, hb) = ((lo, math.inf if hi is None else hi) for lo, hi in (ba["ci"], bb["ci"]))
        same = _same_setting(ba["config"], bb["config"])
        overlap = la <= hb and lb <= ha
        why = ("same settings, intervals overlap" if same and overlap else
               "; ".join(w for w in (None if same else f"settings {_short(ba['config'])} vs {_short(bb['config'])}",
                                     None if overlap else f"intervals [{la:,.0f}, {ha:,.0f}] vs [{lb:,.0f}, {hb:,.0f}]")
                         if w))
        row = {"status": "agree" if same and overlap else "contradict", "why": why,
               "rates": [ba["rate"], bb["rate"]], "ci": [ba["ci"], bb["ci"]]}
        out["contradictions"] += row["status"] == "contradict"
        out["engines"][name] = row
    if a.get("threads") != b.get("threads"):
        out["threads"] = f"threads differ ({a.get('threads')} vs {b.get('threads')}): different configurations"
    return out


def _short(c: dict) -> str:
    return f"{c['max_batch_size']}/{list(c.get('preferred_batch_size') or [])}/{c['max_queue_delay_us']}µs"


def run_serving(suite, env, *, slo_ms: float, seed: int = 0, progress=None) -> dict:
    """Measure the engines on the click model of `suite` (table_scale, serve_batches) and summarise."""
    import torch

    from overdrive.recsys import DLRM, CriteoSpec
    from overdrive.serve.engines import check_engines, click_engines, measure_service
    from overdrive.serve.export import ClickServing, click_inputs

    torch.manual_seed(seed)
    base = CriteoSpec()
    spec = CriteoSpec(table_sizes=tuple(max(10, int(n * suite.table_scale)) for n in base.table_sizes))
    model = ClickServing(DLRM(spec)).eval()
    batches = list(suite.serve_batches)
    inputs = {b: click_inputs(b, 5, seed=seed + b, spec=spec) for b in batches}
    import tempfile

    before = load_report()
    threads, why = serving_threads(before, torch.get_num_threads())
    was = torch.get_num_threads()
    torch.set_num_threads(threads)  # every engine (torch and ONNX Runtime) with the same intra-op threads
    try:
        with tempfile.TemporaryDirectory(prefix="overdrive-onnx-") as tmp:  # ORT reads the file at session start
            engines = click_engines(model, inputs, env, compile=suite.compile, workdir=tmp)
        check_engines(engines, batches)
        measured = measure_service(engines, batches, rounds=suite.serve_rounds, reps=suite.serve_reps,
                                   progress=progress, seed=seed)
    finally:
        torch.set_num_threads(was)
    after = load_report()
    res = summarize_serving(measured, engines, slo_ms, seed=seed, loads=(before, after),
                            resamples=getattr(suite, "serve_resamples", RESAMPLES))
    res["model"] = f"DLRM click model, {sum(spec.table_sizes):,} embedding rows, bag length 5"
    res["batches"] = batches
    res["rounds"], res["reps"] = suite.serve_rounds, suite.serve_reps
    res["threads"], res["threads_why"] = threads, why
    return res


def serving_threads(load: dict, default: int) -> tuple[int, str]:
    """Intra-op threads per engine, from the cores and the host's load (measure.threads.plan_threads:
    one engine runs at a time; this process, busy while planning, is not counted as another tenant).
    A thread that waits at every op's barrier for a descheduled sibling costs more than it brings:
    eager batch-1 calls went from 0.3 to 10 ms at load 18 on 2 cores."""
    cores = int(load.get("cores") or default)
    plan = plan_threads(active=1, cores=min(cores, max(1, default)), load=load.get("load1"), own_running=1)
    how = f"load {load['load1']} on {cores} cores" if load.get("load1") is not None else "load not readable"
    return plan.threads, f"{plan.threads} ({how}: the cores the host's other work leaves free)"
