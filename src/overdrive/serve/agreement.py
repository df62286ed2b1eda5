"""Whether two serving runs agree (`agree`): both give a verdict with overlapping intervals and each run's
evidence accepts the other's setting (the same one, or one whose rate there reaches the lower end of
that run's interval); a run that withholds contradicts nothing, and two runs on a host whose own speed
moved between them (`host_shift`) neither agree nor contradict."""

from __future__ import annotations

import math

import numpy as np

from overdrive.measure.stats import BUSY_FLOOR
from overdrive.serve.verdict import short

__all__ = ["agree", "host_shift"]


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
        pair = f"settings {short(ba['config'])} vs {short(bb['config'])}"
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
