"""What `tune` keeps, and what it recommends: two different things when nothing is proven faster.

A *recommendation* needs the paired interval against the baseline wholly above 1.0, a speedup beyond
the A/A noise floor, and a safe loss curve (`measure.stats.compare`'s "faster"). When nothing earns one
(the host too busy to judge, the A/A interval wider than ±15%, or every verdict "same"), nothing is
recommended: but the configuration *kept* (returned, saved, cached as inconclusive) is the best
evidenced, not blindly the baseline. The baseline is the slowest plain loop a user writes (fp32, eager,
for-loop AdamW): beside two CPU hogs it ran 1.44x slower than a hand-written bf16 loop with fused
AdamW, while tune, too busy to judge, kept it; on a 2-core AVX2 host at load ~23, tune judged fp32
with fused AdamW "same" (1.05x, 95% CI 0.95-1.18) and kept the baseline, which then ran 1.12x slower
than the hand-written fp32 loop with fused AdamW.

Best evidenced: of the safe, timed rivals, the one whose interval's lower bound is highest, provided
that bound beats the A/A control's own lower bound (the baseline's evidence against itself, same
rounds, same level) and its point estimate is above 1.0. Otherwise the baseline is the best evidenced
and stays. The summary names what was kept, on which figures, and that it is no recommendation; such
a run is never "confident", so it never replaces a confident winner in the cache.
"""

from __future__ import annotations

from overdrive.measure.stats import MIN_EVIDENCE_ROUNDS, NoiseFloor
from overdrive.recipes import Recipe
from overdrive.recipes.labels import same_recipe_text, what_runs
from overdrive.tuning.candidates import baseline_recipe

__all__ = ["pick", "best_evidenced"]


def _timed_rivals(rows: list[dict]) -> list[dict]:
    return [r for r in rows[1:] if r["status"] in ("ok", "eliminated") and r["safe"] and not r["emulated"]
            and r["speedup_ci"] is not None]


def best_evidenced(rows: list[dict], floor: NoiseFloor | None) -> dict | None:
    """The rival with the best evidence of being faster than the baseline, or None (the baseline's
    own is best): the highest interval lower bound, above the A/A control's and with a point estimate
    above 1.0, over at least `MIN_EVIDENCE_ROUNDS` paired rounds (what any verdict rests on). Without a
    floor (too few rounds) nothing has evidence."""
    if floor is None:
        return None
    better = [r for r in _timed_rivals(rows) if r["speedup"] > 1.0 and r["speedup_ci"][0] > floor.lo
              and r["rounds"] >= MIN_EVIDENCE_ROUNDS]
    return max(better, key=lambda r: (r["speedup_ci"][0], r["speedup"]), default=None)


def _run_of(runs: list, name: str):
    return next(x for x in runs if x.cand.name == name)


def _busy(rows: list[dict], runs: list, floor: NoiseFloor, load: list | None, cores: int | None) -> tuple[Recipe, str]:
    """The too-busy answer: no recommendation, the best-evidenced configuration kept, and why."""
    base = rows[0]
    peak = max((x for x in (load or []) if x is not None), default=None)
    at = f", load average {peak:.1f} on {cores} cores" if peak is not None and cores else ""
    head = (f"The host was too busy to judge: the baseline against its own twin (A/A) measured {floor.ratio:.2f}x "
            f"(95% CI {floor.lo:.2f}-{floor.hi:.2f}, noise ±{floor.spread_pct:.0f}%) over {floor.rounds} rounds{at}. "
            "No recommendation. ")
    k = best_evidenced(rows, floor)
    if k is None:
        rivals = _timed_rivals(rows)
        b = max(rivals, key=lambda r: r["speedup_ci"][0], default=None)
        best_txt = (f" (the best, {b['name']}: {b['speedup']:.2f}x, 95% CI {b['speedup_ci'][0]:.2f}-"
                    f"{b['speedup_ci'][1]:.2f})") if b else ""
        return baseline_recipe(), head + (
            f"Kept: the baseline ({base['name']}: {base['ran']}), the best evidenced: no rival's interval has a lower "
            f"bound above the A/A control's own ({floor.lo:.2f}) with a speedup above 1.0{best_txt}. Re-run on a "
            "quieter machine for a verdict.")
    recipe, text = _kept(k, rows, runs, floor)
    return recipe, head + text + " Re-run on a quieter machine for a verdict."


def _kept(k: dict, rows: list[dict], runs: list, floor: NoiseFloor) -> tuple[Recipe, str]:
    """The best-evidenced rival `k` kept without a recommendation: what it runs, its figures, why it is
    not called faster."""
    base, (lo, hi) = rows[0], k["speedup_ci"]
    run = _run_of(runs, k["name"])
    also = same_recipe_text(k["names"][1:], what_runs(run.cand.resolved))
    return run.cand.recipe, (
        f"Kept, not recommended: {k['name']}{also}; it runs {k['ran']}. It is the best evidenced: {k['speedup']:.2f}x "
        f"the baseline ({base['name']}: {base['ran']}), 95% CI {lo:.2f}-{hi:.2f} over {k['rounds']} paired rounds, the "
        f"highest lower bound of the field and above the A/A control's own ({floor.lo:.2f}); loss "
        f"{k['loss_delta_pct']:+.2f}% vs the fp32 shadow. Not called faster: "
        f"{'its interval includes 1.0' if lo <= 1.0 else 'it is inside the A/A noise'}.")


def pick(rows: list[dict], runs: list, *, floor: NoiseFloor | None = None, busy: bool = False,
         load: list | None = None, cores: int | None = None) -> tuple[Recipe, str, bool]:
    """(the recipe kept, the summary, whether it is a confident result): a winner; else the best-evidenced
    configuration (`best_evidenced`), never confident; else the baseline (confident when every rival was
    judged "same" or "slower" on a host quiet enough to say so)."""
    base = rows[0]
    ok = _timed_rivals(rows)
    winners = [r for r in ok if r["verdict"] == "faster"]
    # Too busy to judge: nothing cleared the A/A floor. A difference larger than the host's noise is
    # still judged (and said to be from a busy host), never a smaller one.
    if busy and not winners:
        recipe, text = _busy(rows, runs, floor, load, cores)
        return recipe, text, False
    floor_txt = f", beyond the A/A noise floor ±{floor.spread_pct:.1f}%" if floor else ""
    if winners:
        w = max(winners, key=lambda r: r["speedup"])
        lo, hi = w["speedup_ci"]
        run = _run_of(runs, w["name"])
        also = same_recipe_text(w["names"][1:], what_runs(run.cand.resolved))
        text = (f"Winner: {w['name']}{also}: {w['speedup']:.2f}x the baseline ({base['name']}, plain fp32 PyTorch), "
                f"95% CI {lo:.2f}-{hi:.2f}{floor_txt}, over {w['rounds']} paired rounds ({w['n']} vs {base['n']} "
                f"timed steps) ({w['step_ms']:.1f} vs {base['step_ms']:.1f} ms/step); it runs {w['ran']}; loss "
                f"{w['loss_delta_pct']:+.2f}% ({w['loss_delta_nats']:+.4f} nats) vs the fp32 shadow.")
        if busy:
            text += (f" The host was busy (A/A ±{floor.spread_pct:.0f}%): only a difference beyond that noise is "
                     "called, and this one is not cached over a winner from a quieter run.")
        return run.cand.recipe, text, not busy
    if ok:
        b = max(ok, key=lambda r: r["speedup"])
        lo, hi = b["speedup_ci"]
        text = (f"Nothing beat the baseline with confidence: the best, {b['name']}, ran {b['speedup']:.2f}x "
                f"(95% CI {lo:.2f}-{hi:.2f}{floor_txt}: {b['verdict']}).")
        k = best_evidenced(rows, floor)
        if k is not None:  # the slowest plain loop is not kept when a rival has better evidence than it
            recipe, kept = _kept(k, rows, runs, floor)
            return recipe, f"{text} {kept}", False
        text += f" Keeping the baseline ({base['name']}: {base['ran']}), the best evidenced."
    else:
        text = (f"No other candidate finished a safe timed measurement: keeping the baseline ({base['name']}: "
                f"{base['ran']}).")
    # Confident only when every rival was judged on enough rounds (a "same" or "slower" verdict).
    confident = bool(ok) and all(r["verdict"] in ("same", "slower") for r in ok)
    return baseline_recipe(), text, confident
