"""`overdrive.tune(...)`: measure the recipes on the user's own model, pick the fastest safe one.

    result = overdrive.tune("models.py:make_model", "models.py:batch", budget_s=150)
    print(result.summary)                      # why it won, by how much, with the interval
    acc = overdrive.accelerate(make_model(), recipe=result.best)
    # later, anywhere on this machine:
    acc = overdrive.accelerate(make_model(), recipe="tuned")

A winner needs the lower end of its 95% bootstrap interval above 1.0 against the baseline (plain
fp32 PyTorch), and a safe loss curve; otherwise the baseline is kept, and the summary says so.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from overdrive.bench.labels import ran_label
from overdrive.bench.timing import speedup_ci, summarize, verdict
from overdrive.env import EnvReport, get_env
from overdrive.errors import UserError
from overdrive.recipes import Recipe
from overdrive.recipes.tuned import machine_fingerprint, save_tuned
from overdrive.tune.candidates import baseline_recipe, describe, parse_name
from overdrive.tune.measure import Run, measure
from overdrive.tune.safety import Tolerance
from overdrive.tune.workload import FileFn, Workload, hf_workload

__all__ = ["tune", "TuneResult"]


@dataclass(kw_only=True)
class TuneResult:
    best: Recipe
    """The winner (the baseline when nothing beat it with confidence)."""
    rows: list[dict]
    """One per candidate: name, names, status, reason, ran, step_ms, speedup, speedup_ci, safe, ..."""
    summary: str
    """The winner's line: why it won, by how much, with the interval (or why the baseline stays)."""
    meta: dict = field(default_factory=dict)

    @property
    def best_row(self) -> dict:
        return next(r for r in self.rows if r["name"] == self.best.name)

    def to_dict(self) -> dict:
        return {"best": self.best.name, "summary": self.summary, "recipe": self.best.to_dict(),
                "candidates": self.rows, **self.meta}

    def save(self, out: str) -> str:
        """Write results.json, recipe.json (the winner, for Recipe.load) and report.html into `out`."""
        from overdrive.io import write_atomic
        from overdrive.tune.report import write_report

        if os.path.exists(out) and not os.path.isdir(out):
            raise UserError(f"--out {out} is a file: pass a folder (it is created if missing)")
        os.makedirs(out, exist_ok=True)
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
        from overdrive.tune.workload import load_file_fn

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
    bf, lf = _fn(batch_fn, "--batch"), _fn(loss_fn, "--loss")
    if hf:
        wl = hf_workload(hf, batch_fn=bf, loss_fn=lf)
    else:
        if model_fn is None:
            raise UserError("no model: pass FILE.py:FACTORY (a function returning a fresh nn.Module) or --hf CONFIG")
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
            raise UserError(f"--candidates: {e}") from None
    if env is None:
        if progress:
            progress("probing this machine (cached for a day after the first time)")
        env = get_env()
    spent = time.perf_counter() - t0
    if spent > 1.0 and budget_s - spent < 5:
        raise UserError(f"--budget-s {budget_s:g} is too small: probing this machine alone took {spent:.0f} s "
                        "(it is cached afterwards: run `overdrive doctor` once, or raise --budget-s)")
    s = measure(wl, env, budget_s=budget_s - spent, names=names, seed=seed, lr=lr, threads=threads, tol=tolerance,
                progress=progress, total_budget_s=budget_s)
    base = s.runs[0]
    rows = [_row(r, base, env) for r in s.runs]
    best, summary = _pick(rows, s.runs)
    meta = {"device": env.device, "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "workload": wl.label, "budget_s": budget_s, "elapsed_s": round(time.perf_counter() - t0, 2),
            "rounds": s.rounds, "baseline": base.cand.name, "signature": base.signature,
            "fingerprint": machine_fingerprint(env), "tolerance": tolerance.describe(),
            "memory_limit": s.memory_note, "cpu": env.platform.get("cpu", {}).get("model"),
            "gpu": env.gpus[0].name if env.gpus else None}
    res = TuneResult(best=best, rows=rows, summary=summary, meta=meta)
    if cache and base.signature:
        meta["cached_at"] = save_tuned(best, signature=base.signature, fingerprint=meta["fingerprint"],
                                       summary=summary)
    if out:
        res.save(out)
    return res


def _row(r: Run, base: Run, env: EnvReport) -> dict:
    c = r.cand
    st = summarize(r.ms)
    ci = speedup_ci(base.ms, r.ms) if r is not base else None
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
        "verdict": "baseline" if r is base else ("emulated" if emu else verdict(ci)),
        "warmup_first_step_ms": r.warmup_ms[0] if r.warmup_ms else None,
        "warmup_steps_ms": list(r.warmup_ms), "setup_s": r.setup_s,
        "safe": True if r is base else (sf.safe if sf else None),
        "safety": "the fp32 shadow itself" if r is base else (sf.reason if sf else "not checked"),
        "loss_delta_pct": 0.0 if r is base else (sf.delta_pct if sf else None),
        "loss_delta_nats": 0.0 if r is base else (sf.delta_nats if sf else None),
        "losses": list(r.loss), "resolved": c.resolved.to_dict(), "recipe": c.recipe.to_dict(),
        "conversions": r.conversions, "fp8_filter": r.fp8_filter, "memory": r.memory,
    }


def _pick(rows: list[dict], runs: list[Run]) -> tuple[Recipe, str]:
    base = rows[0]
    ok = [r for r in rows[1:] if r["status"] in ("ok", "eliminated") and r["safe"] and not r["emulated"]
          and r["speedup_ci"] is not None]
    winners = [r for r in ok if r["speedup_ci"][0] > 1.0]
    n_base = base["n"]
    if winners:
        w = max(winners, key=lambda r: r["speedup"])
        lo, hi = w["speedup_ci"]
        run = next(x for x in runs if x.cand.name == w["name"])
        also = f" (also named {', '.join(w['names'][1:])})" if len(w["names"]) > 1 else ""
        text = (f"Winner: {w['name']}{also}: {w['speedup']:.2f}x the baseline ({base['name']}, plain fp32 PyTorch), "
                f"95% CI {lo:.2f}-{hi:.2f}, over {w['n']} vs {n_base} interleaved timed steps "
                f"({w['step_ms']:.1f} vs {base['step_ms']:.1f} ms/step); it runs {w['ran']}; loss "
                f"{w['loss_delta_pct']:+.2f}% ({w['loss_delta_nats']:+.4f} nats) vs the fp32 shadow.")
        return run.cand.recipe, text
    if ok:
        b = max(ok, key=lambda r: r["speedup"])
        lo, hi = b["speedup_ci"]
        text = (f"Nothing beat the baseline with confidence: the best, {b['name']}, ran {b['speedup']:.2f}x "
                f"(95% CI {lo:.2f}-{hi:.2f}, which includes or falls below 1.0). Keeping the baseline "
                f"({base['name']}: {base['ran']}).")
    else:
        text = (f"No other candidate finished a safe timed measurement: keeping the baseline ({base['name']}: "
                f"{base['ran']}).")
    return baseline_recipe(), text
