"""The serving results of one run: per engine its verdict, judged against its own A/A control (its
twins at the smallest batch; an engine without twins against eager's), withheld with the figures and
the check that tripped when the host is too busy or the answer fragile; the run's verdict, the winner
(only when its interval clears every other engine's) and the line that says it all. Pure: tested
without timing anything."""

from __future__ import annotations

import numpy as np

from overdrive.measure.percentiles import latency_summary
from overdrive.serve.aa_control import _flat, _rounds, busy_reason, floor_figures, own_floors, service_floor
from overdrive.serve.batcher import rate_curve
from overdrive.serve.verdict import RESAMPLES, STABLE_SHARE, config_of, engine_verdict, kept_service_times

__all__ = ["summarize_serving", "held_text", "SIM_NOTE"]

SIM_NOTE = ("simulated from measured service times: Poisson arrivals, Triton's dynamic-batcher rules, a batch "
            "costs a draw of its measured size's service times (between two measured sizes, the same quantile of "
            "both, interpolated), at most 80% of the capacity at full batches; "
            "not included: network, (de)serialisation, the batcher's own overhead, copying requests into one batch")

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
        samples = measured["samples"].get(e.name)
        control = own.get(e.name) or floor  # its own twins; else eager's (all the pairs measured)
        out["engines"][e.name] = _engine_row(e, samples, control, e.name if e.name in own else
                                             (floor.get("of") or "none measured"), slo_ms, loads=loads,
                                             requests=requests, seed=seed, resamples=resamples, curve=curve,
                                             delays_us=delays_us)
    _run_verdict(out, figures)
    out["winner"] = _winner(out)
    out["text"] = "; ".join(f"{k}: {_best_text(r)}" for k, r in out["engines"].items())
    if out["verdict"] == "withheld":
        out["text"] = f"no verdict: {out['withheld']}"
    if out.get("load", {}).get("busy") and out["verdict"] == "given":
        out["text"] += (f" (host busy: load {out['load']['before']['load1']} -> {out['load']['after']['load1']} on "
                        f"{out['load']['before']['cores']} cores; figures are this host's, now)")
    return out


def _engine_row(e, samples: dict | None, control: dict, control_of: str, slo_ms: float, *, loads, requests: int,
                seed: int, resamples: int, curve: bool, delays_us: tuple[int, ...]) -> dict:
    """One engine's results: its service times, its estimate, its verdict against `control` (its own
    twins' floor, else eager's) and, given, its recommended setting; its rate curve."""
    row: dict = {"label": e.label, "status": e.status, "reason": e.reason, "kind": e.kind,
                 "max_abs_error_vs_eager": e.meta.get("max_abs_error_vs_eager"), "best": None}
    if e.status != "ok" or not samples:
        return row
    rounds = {int(b): _rounds(xs) for b, xs in samples.items()}
    row["service"] = {str(b): latency_summary(_flat(rs)) for b, rs in rounds.items()}
    row["control"] = control_of
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
        cfg, top = config_of(est["config"]), est["rate"]
        svc = kept_service_times(rounds, est["rounds"])  # the rounds the estimate kept
        row["curve"] = {"config": est["config"], "points": rate_curve(cfg, svc, np.geomspace(top * 0.05, top * 1.1, 12),
                                                                      requests=requests, seed=seed)}
    row["tried"] = est["tried"]
    return row


def _run_verdict(out: dict, figures: str) -> None:
    """The run's verdict is given where any engine's is (each judged against its own control); none given:
    the run's reason is the engines' own reasons, never a figure that was inside the limit."""
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


def _winner(out: dict) -> str | None:
    """A winner only among engines that were all judged (one whose verdict was withheld may be the faster),
    and only when its interval clears every other engine's."""
    given = {k: r for k, r in out["engines"].items() if r.get("best")}
    judged = [r for r in out["engines"].values() if r.get("verdict")]
    if not given or any(r.get("verdict") == "withheld" for r in judged):
        return None
    k = max(given, key=lambda k: given[k]["best"]["rate"])
    others = [r["best"]["ci"][1] for k2, r in given.items() if k2 != k]
    return k if not others or given[k]["best"]["ci"][0] > max(others) else None


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
