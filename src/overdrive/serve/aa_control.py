"""The A/A control of the serving bench: twins (one engine at one batch, measured as two keys in the
same rounds) say how far two identical measurements sit apart on this host, now. Each engine is judged
against its own twins (serving.summarize_serving); the figures and the check that tripped are said
beside a withheld verdict."""

from __future__ import annotations

import math

import numpy as np

from overdrive.measure.percentiles import aa_floor
from overdrive.measure.stats import BUSY_FLOOR, host_too_busy, noise_floor, round_medians
from overdrive.serve.batcher import BatcherConfig, ServiceTimes, max_rate_under_slo

__all__ = ["service_floor", "own_floors", "busy_reason", "floor_figures"]


def _rounds(xs) -> list[list[float]]:
    """Samples as rounds: a list of per-round lists, or a flat list (one round)."""
    xs = list(xs)
    if xs and isinstance(xs[0], (list, tuple, np.ndarray)):
        return [list(r) for r in xs]
    return [xs]


def _flat(rounds: list[list[float]]) -> list[float]:
    return [x for r in rounds for x in r]


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
        why = []
        if nf:
            out["factor"] = max(out["factor"], nf.factor)
            if host_too_busy(nf):
                why.append(f"{p['of']}: the twins' per-round interval is ±{nf.spread_pct:.1f}%")
        if p.get("rate_check"):
            cfg = BatcherConfig(max_batch_size=p["batch"])
            ra, rb = (max_rate_under_slo(cfg, ServiceTimes({p["batch"]: _flat(x)}), slo_ms, requests=requests,
                                         seed=seed) for x in (a, b))
            row["rates"] = [ra, rb]
            # None: neither twin met the SLO (nothing to compare), or one met it and the other not (a split)
            ratio = (max(ra, rb) / min(ra, rb)) if ra and rb else (math.inf if bool(ra) != bool(rb) else None)
            row["rate_ratio"] = ratio if ratio is not None and math.isfinite(ratio) else None
            row["rate_split"] = ratio == math.inf
            if ratio is not None and ratio > BUSY_FLOOR:
                why.append(f"{p['of']}: " + (f"one twin met the SLO ({ra or rb:,.0f} req/s), the other not"
                                            if row["rate_split"] else
                                            f"the twins' highest rates under the SLO differ by "
                                            f"{100 * (ratio - 1):.1f}% ({max(ra, rb):,.0f} vs {min(ra, rb):,.0f} req/s)"))
        row["busy_why"] = "; ".join(why) or None
        out["busy"] = out["busy"] or bool(why)
        out["pairs"].append(row)
    if out["pairs"]:
        worst = max(out["pairs"], key=lambda r: (r["round_floor"] or {}).get("spread_pct") or 0.0)
        out["spread_pct"] = (worst["round_floor"] or {}).get("spread_pct")
        out["of"] = worst["of"]
        rr = [r["rate_ratio"] for r in out["pairs"] if r.get("rate_ratio") is not None]
        out["rate_split"] = any(r.get("rate_split") for r in out["pairs"])
        out["rate_spread_pct"] = round(100 * (max(rr) - 1), 1) if rr else None
    return out


def floor_figures(floor: dict | None, loads: tuple[dict, dict] | None) -> str:
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
        elif any("rates" in r for r in floor["pairs"]):
            parts.append("neither A/A twin met the SLO")
    return ", ".join(parts)


def own_floors(pairs: list[dict], slo_ms: float, *, requests: int, seed: int) -> dict:
    """engine -> the floor of its own twins (pairs carry "engine"; older results name it in "of")."""
    by: dict[str, list[dict]] = {}
    for p in pairs:
        by.setdefault(p.get("engine") or str(p["of"]).rsplit(" at batch", 1)[0], []).append(p)
    return {e: service_floor(ps, slo_ms, requests=requests, seed=seed) for e, ps in by.items()}


def busy_reason(floor: dict, loads: tuple[dict, dict] | None) -> str | None:
    """'too busy to judge: eager at batch 1: the twins' highest rates ... (load ...)': the checks that
    tripped, by name, then the figures; None when the control is within the limit."""
    if not floor.get("busy"):
        return None
    tripped = "; ".join(p["busy_why"] for p in floor["pairs"] if p.get("busy_why"))
    return (f"too busy to judge: {tripped} (limit ±{100 * (BUSY_FLOOR - 1):.0f}%; "
            f"{floor_figures(floor, loads)})")
