"""`overdrive.tune(...)`: measure the recipes on the user's own model, pick the fastest safe one.

    result = overdrive.tune("models.py:make_model", "models.py:batch", budget_s=150)
    print(result.summary)                      # why it won, by how much, with the interval
    acc = overdrive.accelerate(make_model(), recipe=result.best)
    # later, anywhere on this machine:
    acc = overdrive.accelerate(make_model(), recipe="tuned")

A winner needs its paired per-round interval (bootstrap over rounds) wholly above 1.0 against the
baseline (plain fp32 PyTorch) and a speedup beyond the A/A noise floor (the baseline against its own
twin, same rounds), and a safe loss curve; otherwise the baseline is kept, and the summary says so.
On a host too busy to judge (A/A spread over 15%) nothing is recommended, with the figures.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from overdrive.recipes.labels import ran_label, same_recipe_text, what_runs
from overdrive.env import EnvReport, get_env
from overdrive.errors import UserError
from overdrive.measure.stats import compare, host_too_busy, round_medians, summarize
from overdrive.recipes import Recipe
from overdrive.recipes.tuned import machine_fingerprint, save_tuned
from overdrive.tuning.candidates import baseline_recipe, describe, parse_name
from overdrive.tuning.measure import Run, measure
from overdrive.tuning.safety import Tolerance
from overdrive.tuning.workload import FileFn, Workload, hf_workload

__all__ = ["tune", "TuneResult", "TUNE_SCHEMA"]

TUNE_SCHEMA = "overdrive.tune/1"


@dataclass(kw_only=True)
class TuneResult:
    best: Recipe
    """The winner (the baseline when nothing beat it with confidence)."""
    rows: list[dict]
    """One per candidate: name, names, status, reason, ran, step_ms, speedup, speedup_ci, safe, ..."""
    summary: str
    """The winner's line: why it won, by how much, with the interval (or why the baseline stays)."""
    meta: dict = field(default_factory=dict)
    _lock: object = field(default=None, repr=False)

    @property
    def best_row(self) -> dict:
        return next(r for r in self.rows if r["name"] == self.best.name)

    def to_dict(self) -> dict:
        return {"schema": TUNE_SCHEMA, "best": self.best.name, "summary": self.summary, "recipe": self.best.to_dict(),
                "candidates": self.rows, **self.meta}

    def save(self, out: str) -> str:
        """Write results.json, recipe.json (the winner, for Recipe.load) and report.html into `out`."""
        from overdrive.measure.lock import claim_results_dir

        if self._lock is None:
            with claim_results_dir(out, what="overdrive tune"):
                return self._write(out)
        return self._write(out)

    def _write(self, out: str) -> str:
        from overdrive.io import write_atomic
        from overdrive.report.tune_view import write_report

        write_atomic(os.path.join(out, "results.json"), json.dumps(self.to_dict(), indent=2) + "\n")
        self.best.save(os.path.join(out, "recipe.json"))
        write_report(self.to_dict(), out)
        return out

    def table(self) -> str:
        """A plain-text table of every row (the CLI prints a rich one)."""
        lines = [f"{'candidate':44} {'status':10} {'step ms':>9} {'speedup [95% CI]':>22} {'loss Δ':>8}  ran"]
        for r in self.rows:
            lines.append(f"{r['label'][:44]:44} {r['status']:10} {_f(r['step_ms'], '{:.1f}'):>9} "
                         f"{speedup_text(r):>22} {_f(r['loss_delta_pct'], '{:+.2f}%'):>8}  {r['ran']}")
        return "\n".join(lines)


def _f(v, fmt: str) -> str:
    return "-" if v is None else fmt.format(v)


def speedup_text(r: dict) -> str:
    if r["emulated"]:
        return "emulated: no speedup"
    if r["speedup"] is None:
        return "-"
    if r["speedup_ci"] is None:
        return f"{r['speedup']:.2f}x"
    lo, hi = r["speedup_ci"]
    return f"{r['speedup']:.2f}x [{lo:.2f}-{hi:.2f}]"


def _fn(x, what: str) -> Callable | None:
    if x is None or callable(x):
        return x
    if isinstance(x, str):
        from overdrive.tuning.workload import load_file_fn

        load_file_fn(x, what)  # fail here, in one line, not in every worker
        return FileFn(x, what)
    raise UserError(f"{what} must be a function or 'file.py:function', not {type(x).__name__}")


def tune(model_fn: Callable | str | None = None, batch_fn: Callable | str | None = None, *,
         loss_fn: Callable | str | None = None, hf: str | None = None, budget_s: float = 120.0,
         candidates: list[str] | str | None = None, out: str | None = None, lr: float = 3e-4, seed: int = 0,
         threads: int | None = None, tolerance: Tolerance = Tolerance(), progress: Callable[[str], None] | None = None,
         env: EnvReport | None = None, cache: bool = True) -> TuneResult:
    """Measure the candidate recipes on `model_fn()` trained on `batch_fn(step)`; return the winner.

    model_fn/batch_fn/loss_fn: module-level functions or "file.py:function" (each candidate runs in
    a fresh process). `hf`: a transformers config folder or .json instead of model_fn (random token
    batches unless batch_fn is given). `candidates`: recipe names to try (default: every preset
    that is distinct here, then the knobs). `budget_s` bounds the whole run, probing included.
    The winner is cached for `accelerate(model, recipe="tuned")` unless cache=False.
    """
    t0 = time.perf_counter()
    if not (budget_s and budget_s > 0):
        raise UserError(f"--budget-s must be a positive number of seconds, got {budget_s}")
    lock = None
    if out:
        from overdrive.measure.lock import claim_results_dir

        lock = claim_results_dir(out, what="overdrive tune")  # now, not after the whole run
    try:
        return _tune(model_fn, batch_fn, loss_fn=loss_fn, hf=hf, budget_s=budget_s, candidates=candidates, out=out,
                     lr=lr, seed=seed, threads=threads, tolerance=tolerance, progress=progress, env=env, cache=cache,
                     t0=t0, lock=lock)
    finally:
        if lock is not None:
            lock.release()


def _tune(model_fn, batch_fn, *, loss_fn, hf, budget_s, candidates, out, lr, seed, threads, tolerance, progress, env,
          cache, t0, lock) -> TuneResult:
    bf, lf = _fn(batch_fn, "--batch"), _fn(loss_fn, "--loss-fn")
    if hf:
        wl = hf_workload(hf, batch_fn=bf, loss_fn=lf)
    else:
        if model_fn is None:
            raise UserError("no model: pass --model FILE.py:FACTORY (a function returning a fresh nn.Module) or --model CONFIG")
        if bf is None:
            raise UserError("no batches: pass --batch FILE.py:FN (FN(step) returns a tensor, tuple or dict)")
        mf = _fn(model_fn, "model factory")
        wl = Workload(model_fn=mf, batch_fn=bf, loss_fn=lf, label=str(getattr(mf, "__qualname__", mf)))
    wl.check_picklable()
    names = [c.strip() for c in candidates.split(",") if c.strip()] if isinstance(candidates, str) else candidates
    for n in names or []:
        try:
            parse_name(n)
        except ValueError as e:
            raise UserError(f"--configs: {e}") from None
    if env is None:
        if progress:
            progress("probing this machine (cached for a day after the first time)")
        env = get_env()
    from overdrive.tuning.flops import count_step_flops

    flops = count_step_flops(wl.model_fn, wl.batch_fn, wl.loss_fn, seed=seed)  # on meta; one CPU step if that fails
    spent = time.perf_counter() - t0
    if spent > 1.0 and budget_s - spent < 5:
        raise UserError(f"--budget-s {budget_s:g} is too small: probing this machine alone took {spent:.0f} s "
                        "(it is cached afterwards: run `overdrive doctor` once, or raise --budget-s)")
    s = measure(wl, env, budget_s=budget_s - spent, names=names, seed=seed, lr=lr, threads=threads, tol=tolerance,
                progress=progress, total_budget_s=budget_s)
    base = s.runs[0]
    floor = s.floor(base)
    rows = [_row(r, base, env, floor) for r in s.runs]
    from overdrive.tuning.flops import add_rates

    add_rates(rows, flops, env)
    busy = host_too_busy(floor)
    best, summary, confident = _pick(rows, s.runs, floor=floor, busy=busy, load=s.load, cores=s.plan.cores)
    meta = {"device": env.device, "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "workload": wl.label, "budget_s": budget_s, "elapsed_s": round(time.perf_counter() - t0, 2),
            "rounds": s.rounds, "looks": list(s.looks), "level": 1 - 0.05 / len(s.looks),
            "rounds_stop": s.stop_reason, "baseline": base.cand.name, "signature": base.signature,
            "fingerprint": machine_fingerprint(env), "tolerance": tolerance.describe(),
            "memory_limit": s.memory_note, "cpu": env.platform.get("cpu", {}).get("model"),
            "gpu": env.gpus[0].name if env.gpus else None, "threads": _threads_ran(s),
            "torch": env.torch.get("version"), "confident": confident, "flops": flops.to_dict(),
            "noise": {"aa": floor.to_dict() if floor else None, "too_busy": busy,
                      "load_1min": max((x for x in s.load if x is not None), default=None), "cores": s.plan.cores,
                      "twin": None if s.twin is None else {"status": s.twin.status, "reason": s.twin.reason}}}
    res = TuneResult(best=best, rows=rows, summary=summary, meta=meta, _lock=lock)
    if cache and base.signature and rows[0]["safe"] is not False:  # an unsafe baseline is never cached
        try:
            path, written = save_tuned(best, signature=base.signature, fingerprint=meta["fingerprint"],
                                       summary=summary, threads=s.plan.threads, confident=confident, env=env)
            meta["cached_at"] = path
            if not written:
                meta["cache_note"] = (f"this run was inconclusive: the confident winner cached at {path} was kept")
        except OSError as e:  # a read-only cache folder must not cost the whole measurement
            meta["cache_note"] = (f"not cached ({e.strerror or type(e).__name__}: {e.filename or ''}): "
                                  "accelerate(model, recipe=\"tuned\") will not find it; make that folder writable or "
                                  "set XDG_CACHE_HOME (the results are written as usual)")
    if out:
        res.save(out)
    return res


def _threads_ran(s) -> dict:
    """The thread plan, with the count the workers really stepped with when the model set its own."""
    t = s.plan.to_dict()
    ran = s.runs[0].threads if s.runs else None
    if isinstance(ran, int) and ran != t["threads"]:
        t.update(threads=ran, planned=t["threads"], source="the model (it sets torch's threads when built)")
    return t


def _row(r: Run, base: Run, env: EnvReport, floor=None) -> dict:
    c = r.cand
    st = summarize(r.ms)
    cmp = compare(round_medians(base.rounds_ms), round_medians(r.rounds_ms), floor) if r is not base else None
    ci = (cmp.speedup, *cmp.ci) if cmp is not None and cmp.ci else None
    emu = c.emulated
    speed = 1.0 if r is base else (ci[0] if ci else None)
    sf = r.safety
    return {
        "name": c.name, "names": list(c.names), "label": ran_label(c.label, c.resolved, env), "baseline": r is base,
        "stage": c.stage,
        "status": r.status, "reason": r.reason, "ran": describe(c.resolved), "emulated": emu,
        "step_ms": None if emu else st["median"], "step_ms_p10": None if emu else st["p10"],
        "step_ms_p90": None if emu else st["p90"], "n": st["n"],
        "speedup": None if emu else speed, "speedup_ci": None if (emu or not ci) else [ci[1], ci[2]],
        "verdict": "baseline" if r is base else ("emulated" if emu else cmp.verdict), "rounds": len(r.rounds_ms),
        "warmup_first_step_ms": r.warmup_ms[0] if r.warmup_ms else None,
        "warmup_steps_ms": list(r.warmup_ms), "setup_s": r.setup_s,
        "safe": sf.safe if sf else None,
        "safety": sf.reason if sf else "not checked",
        "loss_delta_pct": 0.0 if r is base else (sf.delta_pct if sf else None),
        "loss_delta_nats": 0.0 if r is base else (sf.delta_nats if sf else None),
        "losses": list(r.loss), "resolved": c.resolved.to_dict(), "recipe": c.recipe.to_dict(),
        "conversions": r.conversions, "fp8_filter": r.fp8_filter, "memory": r.memory,
    }


def _pick(rows: list[dict], runs: list[Run], *, floor=None, busy: bool = False, load: list | None = None,
          cores: int | None = None) -> tuple[Recipe, str, bool]:
    """(the recipe, the summary, whether it is a confident result): a winner, or a baseline kept
    because nothing was measurably faster on a host quiet enough to say so."""
    base = rows[0]
    ok = [r for r in rows[1:] if r["status"] in ("ok", "eliminated") and r["safe"] and not r["emulated"]
          and r["speedup_ci"] is not None]
    winners = [r for r in ok if r["verdict"] == "faster"]
    # Too busy to judge: nothing cleared the A/A floor. A difference larger than the host's noise is
    # still judged (and said to be from a busy host), never a smaller one.
    if busy and not winners:
        peak = max((x for x in (load or []) if x is not None), default=None)
        at = f", load average {peak:.1f} on {cores} cores" if peak is not None and cores else ""
        return baseline_recipe(), (
            f"The host was too busy to judge: the baseline against its own twin (A/A) measured {floor.ratio:.2f}x "
            f"(95% CI {floor.lo:.2f}-{floor.hi:.2f}, noise ±{floor.spread_pct:.0f}%) over {floor.rounds} rounds{at}. "
            f"No recommendation; keeping the baseline ({base['name']}). Re-run on a quieter machine."), False
    floor_txt = f", beyond the A/A noise floor ±{floor.spread_pct:.1f}%" if floor else ""
    n_base = base["n"]
    if winners:
        w = max(winners, key=lambda r: r["speedup"])
        lo, hi = w["speedup_ci"]
        run = next(x for x in runs if x.cand.name == w["name"])
        also = same_recipe_text(w["names"][1:], what_runs(run.cand.resolved))
        text = (f"Winner: {w['name']}{also}: {w['speedup']:.2f}x the baseline ({base['name']}, plain fp32 PyTorch), "
                f"95% CI {lo:.2f}-{hi:.2f}{floor_txt}, over {w['rounds']} paired rounds ({w['n']} vs {n_base} "
                f"timed steps) "
                f"({w['step_ms']:.1f} vs {base['step_ms']:.1f} ms/step); it runs {w['ran']}; loss "
                f"{w['loss_delta_pct']:+.2f}% ({w['loss_delta_nats']:+.4f} nats) vs the fp32 shadow.")
        if busy:
            text += (f" The host was busy (A/A ±{floor.spread_pct:.0f}%): only a difference beyond that noise is "
                     "called, and this one is not cached over a winner from a quieter run.")
        return run.cand.recipe, text, not busy
    if ok:
        b = max(ok, key=lambda r: r["speedup"])
        lo, hi = b["speedup_ci"]
        text = (f"Nothing beat the baseline with confidence: the best, {b['name']}, ran {b['speedup']:.2f}x "
                f"(95% CI {lo:.2f}-{hi:.2f}{floor_txt}: {b['verdict']}). Keeping the baseline "
                f"({base['name']}: {base['ran']}).")
    else:
        text = (f"No other candidate finished a safe timed measurement: keeping the baseline ({base['name']}: "
                f"{base['ran']}).")
    # Confident only when every rival was judged on enough rounds (a "same" or "slower" verdict).
    confident = bool(ok) and all(r["verdict"] in ("same", "slower") for r in ok)
    return baseline_recipe(), text, confident
