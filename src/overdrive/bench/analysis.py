"""From raw runs to the numbers people read: speedups with intervals (paired per-round ratios,
bootstrap over rounds), MFU, memory, quality parity, safety, the A/A noise floor, and a
recommendation that needs evidence (the whole interval above the floor, on a host quiet enough)."""

from __future__ import annotations

from overdrive.bench.apply import apply_hint
from overdrive.bench.runner import ConfigRun, Schedule
from overdrive.bench.suites import Suite
from overdrive.bench.workloads import workload_for_task
from overdrive.env import EnvReport
from overdrive.measure.quality import LOSS_TOLERANCE, loss_tolerance
from overdrive.measure.session import ci_seed
from overdrive.measure.stats import compare, host_too_busy, noise_floor, paired_ci, round_medians, summarize
from overdrive.recipes.labels import same_recipe_text

__all__ = ["analyze", "LOSS_TOLERANCE", "loss_tolerance", "recommend", "apply_hint"]


def _safe(run: ConfigRun, rows: dict[str, dict]) -> tuple[bool | None, str | None]:
    """(safe, why not assessed): True/False only when every model's quality was judged."""
    if run.status in ("failed", "oom", "crashed"):
        return False, None
    if run.status != "ok":
        return None, f"quality not assessed: {run.status}"
    if any(m.get("unsafe_reason") for m in rows.values()):
        return False, None
    if run.parity_skipped:
        return None, run.parity_skipped
    missing = [m.get("not_assessed_reason") for m in rows.values() if not m.get("assessed")]
    if missing:
        return None, next((w for w in missing if w), "quality not assessed")
    return True, None


def _role_rounds(run: ConfigRun, role: str) -> list[float]:
    """Per-round medians of one role's step times (the rounds' lengths come from rounds_ms)."""
    out, i = [], 0
    for r in run.rounds_ms:
        out.append(run.ms[role][i:i + len(r)])
        i += len(r)
    return round_medians(out)


def _config_record(run: ConfigRun) -> dict:
    """What ran and how it went, before any figure: names, recipe, status, fallbacks and the raw timings."""
    res = run.resolved or {}
    raw = {"warmup_ms": run.warmup_ms, "warmup_cpu_ms": run.warmup_cpu_ms, "rounds_ms": run.rounds_ms}
    for r in run.roles:
        raw[f"{r}_ms"], raw[f"{r}_loss"], raw[f"{r}_skipped"] = run.ms[r], run.loss[r], run.skipped[r]
    c = {"name": run.cand.name, "label": run.label, "ran": run.label, "also": run.also,
         "names": [run.cand.name] + [a["name"] for a in run.also], "description": run.cand.description,
         "baseline": run.cand.baseline, "status": run.status, "reason": run.reason, "stopped_at": run.stopped_at,
         "warmup_slowdown": run.warmup_slowdown,
         "recipe": run.cand.recipe.to_dict(), "resolved": res, "options": dict(run.cand.options),
         "precision": res.get("precision", "?"), "emulated": bool(res.get("emulated")),
         "fallbacks": [d["reason"] for d in res.get("decisions", []) if d.get("fallback")],
         "setup_s": run.setup_s, "first_step_s": run.first_step_s, "memory": run.memory, "final": run.final,
         "models": {}, "raw": raw}
    tot = summarize(run.step_ms())
    c["step_ms"] = tot
    if tot["median"] and run.warmup_ms:
        # Compile time (and other first-step costs) reported apart from the step time.
        c["compile_s"] = max(0.0, run.warmup_ms[0] - tot["median"]) / 1e3
    return c


def _model_row(run: ConfigRun, base: ConfigRun | None, role: str, suite: Suite, workload, gpu, c: dict) -> dict:
    """One model's row: its step times, rate, the workload's own figures and its paired speedup."""
    ms = run.ms[role]
    s = summarize(ms)
    # The precision this role really ran in (the applier's, when the worker reported it).
    role_precision = ((run.applied or {}).get(role) or {}).get("precision", c["precision"])
    m = {"model": getattr(suite, role, role), "precision": role_precision, "step_ms": s, "tokens_per_s": None,
         "examples_per_s": None, "tflops": None, "mfu_bf16_peak": None, "mfu_fp8_peak": None, "mfu_fp4_peak": None,
         "speedup": None, "speedup_ci": None}
    rate = workload.items_per_step(suite) / (s["median"] / 1e3) if s["median"] else None
    if rate is not None:
        m[workload.rate_key] = rate
    m.update(workload.role_figures(role, suite, rate=rate, precision=role_precision, gpu=gpu, emulated=c["emulated"]))
    bms = base.ms[role] if base else []
    if not c["emulated"] and bms and ms and not run.cand.baseline:
        ci = paired_ci(_role_rounds(base, role), _role_rounds(run, role), seed=ci_seed(run.cand.name))
        if ci:
            m["speedup"], m["speedup_ci"] = ci[0], [ci[1], ci[2]]
    elif run.cand.baseline and ms:
        m["speedup"], m["speedup_ci"] = 1.0, [1.0, 1.0]
    return m


def _verdict(c: dict, run: ConfigRun, base: ConfigRun | None, base_rounds: list, floor, looks: int) -> None:
    """The configuration's speedup against the baseline, its interval and its verdict (in place)."""
    if not run.cand.baseline and base and base.step_ms() and run.step_ms() and not c["emulated"]:
        cmp = compare(base_rounds, round_medians(run.rounds_ms), floor, seed=ci_seed(run.cand.name), looks=looks)
        c["speedup"], c["speedup_ci"] = (cmp.speedup, list(cmp.ci)) if cmp.ci else (None, None)
        c["verdict"], c["verdict_why"], c["rounds"] = cmp.verdict, cmp.why, cmp.rounds
    else:
        c["speedup"], c["speedup_ci"] = (1.0, [1.0, 1.0]) if run.cand.baseline else (None, None)
        c["verdict"] = "baseline" if run.cand.baseline else None
        c["rounds"] = len(run.rounds_ms)


def _memory_and_quality(c: dict, run: ConfigRun, base: ConfigRun | None) -> None:
    """Peak memory against the baseline's, the worst loss delta and the safety verdict (in place)."""
    bm = (base.memory or {}).get("peak_mb") if base else None
    pm = (run.memory or {}).get("peak_mb")
    c["peak_mb"] = pm
    c["memory_saved_pct"] = (100 * (1 - pm / bm)) if (pm is not None and bm) else None
    deltas = [c["models"][r]["loss_delta_pct"] for r in run.roles]
    unsafe = [c["models"][r]["unsafe_reason"] for r in run.roles if c["models"][r]["unsafe_reason"]]
    c["loss_delta_pct"] = max((abs(d) for d in deltas if d is not None), default=None)
    c["safe"], c["not_assessed_reason"] = _safe(run, c["models"])
    c["unsafe_reason"] = "; ".join(unsafe) or None
    c["skipped_steps"] = {r: sum(run.skipped[r]) for r in run.roles}


def _schedule(sched: Schedule, suite: Suite, floor, twin: ConfigRun | None, looks: int) -> dict:
    return {"rounds_planned": sched.rounds_planned, "rounds_run": sched.rounds_run,
            "cut_by_budget": sched.cut_by_budget, "budget_s": sched.budget_s,
            "looks": list(sched.looks), "level": 1 - 0.05 / looks, "wall_cap_s": sched.wall_cap_s,
            "stop_reason": sched.stop_reason, "parity_steps": suite.parity_steps,
            "threads": sched.threads.to_dict() if sched.threads else None, "load_1min": list(sched.load),
            "noise": noise_record(floor, twin, sched)}


def analyze(runs: list[ConfigRun], suite: Suite, env: EnvReport, sched: Schedule | None = None) -> dict:
    """Every configuration's record (what ran, per-model figures from its workload, speedup, memory,
    quality), the schedule with the A/A noise floor, and the recommendation."""
    base = next((r for r in runs if r.cand.baseline), None)
    twin = sched.twin if sched is not None else None
    base_rounds = round_medians(base.rounds_ms) if base else []
    looks = len(sched.looks) if sched is not None and sched.looks else 1  # the level the run stopped at
    floor = noise_floor(base_rounds, round_medians(twin.rounds_ms), looks=looks) if (twin is not None and base) else None
    gpu = env.gpus[0].spec if env.gpus else None
    workload = workload_for_task(suite.task)
    configs = []
    for run in runs:
        c = _config_record(run)
        quality = workload.quality_rows(run, base, suite)
        for role in run.roles:
            c["models"][role] = {**_model_row(run, base, role, suite, workload, gpu, c), **quality[role]}
        _verdict(c, run, base, base_rounds, floor, looks)
        _memory_and_quality(c, run, base)
        configs.append(c)
    schedule = _schedule(sched or Schedule(rounds_planned=suite.rounds, rounds_run=suite.rounds), suite, floor, twin,
                         looks)
    return {"configs": configs, "recommendation": recommend(configs, schedule, suite.task), "schedule": schedule}


def noise_record(floor, twin: ConfigRun | None, sched: Schedule) -> dict:
    """The A/A control as the results record it: the twin's interval, and whether the host was too
    busy to judge (with the figures that say so)."""
    cores = sched.threads.cores if sched.threads else None
    load = max((x for x in sched.load if x is not None), default=None)
    if floor is None:
        why = ("no A/A control (no baseline twin)" if twin is None else
               f"the A/A twin {twin.status}: {twin.reason}" if twin.status not in ("ok", "pending") else
               "too few rounds for an A/A interval")
        return {"aa": None, "too_busy": False, "load_1min": load, "cores": cores, "note": why}
    busy = host_too_busy(floor)
    return {"aa": floor.to_dict(), "too_busy": busy, "load_1min": load, "cores": cores,
            "note": (f"A/A (baseline vs its twin, {floor.rounds} rounds): {floor.ratio:.3f}x [{floor.lo:.2f}–"
                     f"{floor.hi:.2f}], noise floor ±{floor.spread_pct:.1f}%"
                     + (f"; load {load:.1f} on {cores} cores" if load is not None and cores else ""))}


def _loss_words(c: dict) -> str:
    deltas = [m["loss_delta_pct"] for m in c["models"].values() if m.get("loss_delta_pct") is not None]
    if not deltas:
        return "loss not compared"
    d = max(deltas, key=abs)
    if d < -0.05:
        return f"loss {-d:.1f}% below the baseline's"
    return f"loss within {abs(d):.1f}% of the baseline"


def _why_no_evidence(best: dict | None, schedule: dict, configs: list[dict]) -> str:
    base = next((c for c in configs if c["baseline"]), None)
    why = []
    if schedule.get("cut_by_budget"):
        why.append(f"the time budget cut the timed rounds to {schedule['rounds_run']} of {schedule['rounds_planned']}")
    n = (base or {}).get("rounds") or 0
    if n and n < 6:
        why.append(f"only {n} timed rounds per configuration")
    s = (base or {}).get("step_ms") or {}
    if s.get("median") and s.get("p90") and s.get("p10") and (s["p90"] - s["p10"]) / s["median"] > 0.2:
        why.append(f"a noisy host (baseline steps vary {100 * (s['p90'] - s['p10']) / s['median']:.0f}% p10–p90)")
    if best and best.get("speedup_ci") and best["speedup_ci"][1] < 1.0 and not why:
        why.append("every candidate was as fast as the baseline or slower")
    return "; ".join(why) or "the differences are within the run-to-run noise"


def recommend(configs: list[dict], schedule: dict, task: str = "gpt") -> dict:
    """Name the fastest safe configuration whose speedup interval lies wholly above 1.0; otherwise
    say that none was measurably faster here, and why."""
    measured = [c for c in configs if c["status"] == "ok" and c["safe"] is True and not c["emulated"]
                and not c["baseline"] and c.get("speedup_ci")]
    unsafe = [c["label"] for c in configs if c["safe"] is False and c["status"] == "ok"]
    tail = f" (not recommended, quality beyond tolerance: {', '.join(unsafe)})" if unsafe else ""
    unjudged = [c["label"] for c in configs if c["safe"] is None and c["status"] == "ok" and not c["baseline"]]
    if unjudged:
        tail += f" (quality not assessed: {', '.join(unjudged)})"
    noise = schedule.get("noise") or {}
    # "faster" needs the whole paired interval above 1.0 and a speedup beyond the A/A floor.
    faster = [c for c in measured if c.get("verdict", "faster" if c["speedup_ci"][0] > 1.0 else "same") == "faster"]
    if noise.get("too_busy") and not faster:  # nothing cleared the host's own noise: no verdict at all
        aa = noise["aa"]
        load = f", load average {noise['load_1min']:.1f} on {noise['cores']} cores" if noise.get("load_1min") else ""
        text = (f"the host was too busy to judge: the baseline against its own twin (A/A) measured {aa['ratio']:.2f}x "
                f"[{aa['ci'][0]:.2f}–{aa['ci'][1]:.2f}] over {aa['rounds']} rounds (noise ±{aa['spread_pct']:.0f}%)"
                f"{load}. No recommendation: re-run on a quieter machine (or with more rounds, --rounds){tail}")
        return {"name": None, "label": None, "text": text, "speedup": None, "speedup_ci": None, "apply": None,
                "evidence": False, "too_busy": True}
    if faster:
        best = max(faster, key=lambda c: c["speedup"])
        lo, hi = best["speedup_ci"]
        lo_s = f"{lo:.2f}" if round(lo, 2) > 1.0 else f"{lo:.3f}"  # never print a lower bound above 1.0 as "1.00"
        also = same_recipe_text([a["name"] for a in best.get("also") or []], best.get("precision"))
        hint = apply_hint(best, task)
        text = (f"fastest safe recipe here: {best['label']}{also} — {best['speedup']:.2f}x [{lo_s}–{hi:.2f}] the "
                f"baseline's speed ({'+'.join(best['models'])} step {best['step_ms']['median']:.1f} ms), "
                f"{_loss_words(best)}{tail}. Apply: {hint['code']}" + (f" or {hint['train']}" if hint["train"] else ""))
        if noise.get("too_busy"):
            text += (f" (a busy host: A/A noise ±{noise['aa']['spread_pct']:.0f}%; only differences beyond it are "
                     "called)")
        return {"name": best["name"], "label": best["label"], "text": text, "speedup": best["speedup"],
                "speedup_ci": best["speedup_ci"], "apply": hint, "evidence": True}
    best = max(measured, key=lambda c: c["speedup"]) if measured else None
    if best is None and not any(c["status"] == "ok" and c["baseline"] for c in configs):
        text = "no configuration completed safely: see the statuses above"
    else:
        lead = (f"; the best, {best['label']}, measured {best['speedup']:.2f}x [{best['speedup_ci'][0]:.2f}–"
                f"{best['speedup_ci'][1]:.2f}]" if best else "")
        floor = (noise.get("aa") or {}).get("spread_pct")
        need = f"above the A/A noise floor ±{floor:.1f}%" if floor is not None else "above 1.0"
        text = (f"no recipe was measurably faster than the baseline here{lead} (the interval must lie {need}): "
                f"{_why_no_evidence(best, schedule, configs)}. Keep plain PyTorch, or re-run with more rounds "
                f"(--rounds) on a quiet machine{tail}")
    return {"name": None, "label": None, "text": text, "speedup": None, "speedup_ci": None, "apply": None,
            "evidence": False}
