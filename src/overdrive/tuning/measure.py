"""Measure the candidates: each in its own process, warm-up apart, interleaved rounds, successive
halving, never past the budget.

The schedule, and why:
1. Stage 1 (presets) is spawned; the baseline warms up first. If the baseline cannot finish its
   warm-up and two rounds inside the budget, the user is told the budget is too small (exit 2).
2. Each candidate warms up one at a time (`tuning.warmup`: first step timed apart, safety steps, a
   gross slowdown stopped at once; emulated formats checked for safety, then stopped).
3. Stage 2 adds the knobs (compile, optimizer) on the precisions that survived; stage 3 adds
   activation checkpointing only when memory is the limit (an OOM, or > 85% of GPU memory).
4. Timed rounds: tune's configuration of the one round driver (`measure.session`, which bench
   configures too: the same early stop, seeds, looks and verdicts), a twin of the baseline among
   them (the A/A control); after rounds 2, 3, 4, 8, ... the slower half is dropped (successive
   halving) when the leader is surely faster on paired per-round ratios, or unconditionally from
   round 8 on, or from round 3 on when the time left fits fewer than 8 more rounds of the field.
5. The rounds stop early only on evidence, at fixed looks (rounds 4, 8, 16, 32), every interval at
   the looks' Bonferroni level: when the A/A floor is narrow enough to judge, the leader's verdict
   against the baseline is settled and every rival left is surely slower than the leader or the
   same within ±5%. Otherwise they go on until the budget (a busy host needs more rounds to judge,
   not a "too busy" after a few); why they stopped is recorded.
Threads per worker come from the cores, the workers stepping at once and the load (recorded).
Every call to a worker has a timeout that ends at the deadline, so the budget holds.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections.abc import Callable

from overdrive.env import EnvReport
from overdrive.errors import UserError
from overdrive.measure.launch import Failure, Launcher
from overdrive.measure.session import RoundsConfig, RoundSession, floor_of, judge, twin_name
from overdrive.measure.stats import LOOKS, look_rounds
from overdrive.measure.threads import host_load, plan_threads
from overdrive.recipes import resolve
from overdrive.tuning.candidates import (Candidate, checkpointing_candidates, knob_candidates, named_candidates,
                                       preset_candidates)
from overdrive.tuning.field import fit_emulated, fit_knobs, halve, prune
from overdrive.tuning.run import Run
from overdrive.tuning.safety import SafetyResult, Tolerance, check_safety
from overdrive.tuning.task import PROGRAM
from overdrive.tuning.warmup import GROSS_SLOWDOWN, WarmUps, compile_warmup_s
from overdrive.tuning.workload import Workload

__all__ = ["Run", "Session", "measure", "GROSS_SLOWDOWN", "compile_warmup_s"]

PRELOAD = ("torch", "overdrive.accelerated", "overdrive.tuning.task", "torchao.float8")
"""What tune's fork server imports before forking its workers (after `measure.fork_safe`)."""

LOOK_ROUNDS = look_rounds(4, 32, LOOKS)
"""The rounds after which tune may stop measuring (4, 8, 16, 32); the budget may end them sooner."""
TURN_S = 0.3
"""About this much of the baseline's step time per turn (at least one step): short turns give more
rounds, and the round, not the step, is the unit of evidence."""


class Session(WarmUps):
    """One tune run: its workers, budget and records; warm-ups from `WarmUps`, timed rounds by the
    round driver."""

    def __init__(self, workload: Workload, env: EnvReport, *, budget_s: float, seed: int = 0, lr: float = 3e-4,
                 threads: int | None = None, tol: Tolerance = Tolerance(), warmup_steps: int = 3,
                 slow_factor: float = 3.0, progress: Callable[[str], None] | None = None,
                 total_budget_s: float | None = None) -> None:
        self.wl, self.env, self.budget_s, self.seed, self.lr, self.threads = workload, env, budget_s, seed, lr, threads
        self.tol, self.warmup_steps, self.slow_factor = tol, max(2, warmup_steps), slow_factor
        self.say = progress or (lambda s: None)
        self.total_budget_s = total_budget_s or budget_s
        """The user's --budget-s (what messages quote); `budget_s` is what was left of it here."""
        self.t0 = time.perf_counter()
        self.deadline = self.t0 + budget_s
        self.warm_deadline = self.t0 + 0.65 * budget_s  # the rest is for the timed rounds
        self.runs: list[Run] = []
        self.rounds = 0
        self.filters: dict[tuple, dict] = {}
        self.memory_note: str | None = None
        """Why activation checkpointing was tried (memory was the limit), or None."""
        # Warm-ups and timed turns step one worker at a time; the load counts the other tenants.
        self.plan = plan_threads(active=1, user=threads, own_running=1)
        self.threads = self.plan.threads
        # Forked from a server that has only imported torch and Overdrive (torchao too, where installed).
        self.launcher = Launcher(PROGRAM, plan=self.plan, grace_s=0.5, travels=(workload.model_fn, workload.batch_fn,
                                                                                 workload.loss_fn),
                                 preload=PRELOAD)
        self.twin: Run | None = None
        """The baseline's A/A twin: in the timed rounds, never a candidate."""
        self.load: list[float | None] = []
        self.looks: list[int] = list(LOOK_ROUNDS)
        self.stop_reason = ""
        """Why the timed rounds stopped where they did."""

    def left(self, until: float | None = None) -> float:
        return (until or self.deadline) - time.perf_counter()

    # -- worker plumbing ------------------------------------------------------------------
    def _call(self, run: Run, msg: tuple, timeout: float, on_timeout: str) -> dict | None:
        reply = run.worker.call(msg, timeout)
        if isinstance(reply, Failure):
            self._failed(run, reply, on_timeout)
            return None
        return reply

    def _failed(self, run: Run, f: Failure, on_timeout: str = "") -> None:
        if f.kind == "timeout":
            self._end(run, "stopped", on_timeout or f.reason)
        else:
            self._end(run, {"oom": "oom", "user": "user", "crashed": "crashed"}.get(f.kind, "failed"), f.reason)

    def _end(self, run: Run, status: str, reason: str, *, collect: bool = False) -> None:
        """Stop a run's worker (asking it for its peak memory first when it is healthy)."""
        w = run.worker
        if collect and w is not None and w.conn is not None:
            reply = w.call(("finish",), min(30.0, max(1.0, self.left())))
            if not isinstance(reply, Failure):
                run.memory = reply.get("memory")
        run.status, run.reason = status, reason
        if w is not None:
            w.stop()
        run.worker = None

    def close(self) -> None:
        for r in self.runs + ([self.twin] if self.twin else []):
            if r.worker is not None:
                self._end(r, r.status if r.status != "pending" else "stopped", r.reason or "tune ended")

    # -- stages ---------------------------------------------------------------------------
    def _spec(self, cand: Candidate) -> dict:
        return {"workload": self.wl, "recipe": cand.recipe.to_dict(), "env_facts": self.env.facts,
                "seed": self.seed, "lr": self.lr, "threads": self.threads}

    def _apply_fp8_filter(self, cand: Candidate) -> str | None:
        """Real FP8: measure which Linears win, put them in the recipe; None or why it is skipped."""
        r = cand.resolved
        if not r.fp8_backend or r.emulated or r.recipe.fp8_shapes:
            return None
        key = (r.fp8_backend, r.fp8_scaling, r.compile != "off")
        if key not in self.filters:
            self.say(f"measuring the per-layer FP8 filter ({r.fp8_backend} {r.fp8_scaling}"
                     f"{', compiled' if key[2] else ''})")
            w = self.launcher.start(("fp8_filter", dict(self._spec(cand), backend=r.fp8_backend,
                                                         scaling=r.fp8_scaling, compile=key[2],
                                                         convert_head=r.fp8_convert_head)))
            reply = w.receive(self.left(self.warm_deadline))
            if isinstance(reply, Failure):
                why = {"timeout": "the per-layer FP8 timing did not finish within the budget",
                       "crashed": f"the per-layer FP8 timing process died (exit code {reply.exitcode})"}
                reply = {"error": why.get(reply.kind, reply.reason)}
            w.stop(grace_s=1)
            self.filters[key] = reply
        f = self.filters[key]
        if "error" in f:
            return f"per-layer FP8 filter failed: {f['error']}"
        if not f["shapes"]:
            return f"measured per-layer FP8 filter: no Linear is faster in FP8 here ({f['summary']})"
        cand.recipe = dataclasses.replace(cand.recipe, fp8_shapes=f["shapes"])
        cand.resolved = resolve(cand.recipe, self.env)
        return None

    def _spawn(self, cands: list[Candidate]) -> list[Run]:
        new = []
        for c in cands:
            run = Run(cand=c)
            self.runs.append(run)
            new.append(run)
            why = self._apply_fp8_filter(c)
            if run.cand.resolved.recipe.fp8_shapes or c.resolved.fp8_backend:
                run.fp8_filter = self.filters.get((c.resolved.fp8_backend, c.resolved.fp8_scaling,
                                                   c.resolved.compile != "off"))
            if why:
                run.status, run.reason = "skipped", why
                continue
            run.worker = self.launcher.start(("setup", self._spec(c)))
        for run in new:  # set-ups ran concurrently; collect them
            if run.worker is not None:
                self._collect_setup(run)
                self.say(f"set up {run.cand.label}")
        return new

    def _collect_setup(self, run: Run) -> None:
        reply = run.worker.receive(self.left())
        if isinstance(reply, Failure):
            if reply.kind == "crashed":
                reply = Failure("crashed", "worker died during set-up")
            self._failed(run, reply, "set-up did not finish within the budget")
        else:
            run.setup_s, run.conversions = reply["setup_s"], reply.get("conversions", {})
            run.threads = reply.get("threads")
            run.signature = reply.get("signature")

    def _record(self, run: Run, steps: list[dict], *, timed: bool) -> None:
        for s in steps:
            (run.ms if timed else run.warmup_ms).append(s["ms"])
            if not timed:
                run.warmup_cpu_ms.append(s.get("cpu_ms"))
            run.loss.append(s["loss"])
            run.gnorm.append(s["gnorm"])

    def finish(self, base: Run) -> None:
        """End the timed rounds: every run is judged on ALL its losses, the ones dropped mid-rounds
        (eliminated, stopped) included: a loss that turned NaN after the warm-up was called safe on the
        warm-up's few steps. A baseline with a non-finite loss anywhere leaves nothing to judge against."""
        if self.twin is not None and self.twin.live:
            self._end(self.twin, "ok", "", collect=False)
        bad = [i for i, v in enumerate(base.loss) if not math.isfinite(v)]
        if bad:
            for r in self.runs:
                if r.live:
                    self._end(r, "stopped", "the baseline's loss turned non-finite", collect=False)
            raise UserError(f"the baseline (plain fp32 PyTorch) gives a non-finite loss ({base.loss[bad[0]]} at step "
                            f"{bad[0]}, {len(bad)} of {len(base.loss)} steps): nothing can be judged safe against it "
                            "and nothing is cached; check the model, the batches and the loss function")
        for r in self.runs:
            if r is base or not (r.live or r.safety is not None):
                continue
            r.safety = self._safety(r, base)
            if r.live:
                unsafe = r.safety is not None and r.safety.safe is False
                self._end(r, "unsafe" if unsafe else "ok", r.safety.reason if unsafe else "", collect=True)
            elif r.safety.safe is False and r.status != "unsafe":
                r.reason = f"{r.safety.reason} (it had been {r.status}: {r.reason})"
                r.status = "unsafe"
        base.safety = self._safety(base, base)
        if base.live:
            self._end(base, "ok", "", collect=True)

    def _safety(self, run: Run, base: Run) -> SafetyResult:
        return check_safety(run.loss, base.loss, gnorm=run.gnorm, ref_gnorm=base.gnorm,
                            scaler=run.cand.resolved.grad_scaler, tol=self.tol,
                            precision=run.cand.resolved.precision, is_baseline=run is base)

    def _memory_limited(self) -> str | None:
        if any(r.status == "oom" for r in self.runs):
            return "a candidate ran out of memory"
        for r in self.runs:
            m = r.memory or {}
            if m.get("total_mb") and m.get("peak_mb", 0) > 0.85 * m["total_mb"]:
                return f"{r.cand.name} peaked at {m['peak_mb']:.0f} of {m['total_mb']:.0f} MB"
        return None

    # -- timed rounds ---------------------------------------------------------------------
    def floor(self, base: Run):
        """The A/A noise floor so far (None without a twin or before 2 rounds)."""
        return floor_of(base, self.twin, looks=len(self.looks))

    def _fit(self, base: Run, spr: int, budget: float) -> list[Run]:
        """The runs for the timed rounds: what cannot fit twice in the time left is dropped now, slowest
        first (the baseline stays; with only the baseline and its twin left, the twin goes last)."""
        live = [r for r in self.runs if r.live] + ([self.twin] if self.twin is not None and self.twin.live else [])
        step_s = {id(r): (r.steady_ms() or 1.0) / 1e3 for r in live}
        while len(live) > 1 and 2 * spr * sum(step_s[id(r)] for r in live) > budget:
            rivals = [r for r in live if r is not base and r is not self.twin]
            worst = max(rivals, key=lambda r: step_s[id(r)]) if rivals else self.twin
            self._end(worst, "skipped", "too little budget left for timed rounds after the warm-ups", collect=True)
            live.remove(worst)
        return live

    def _timed(self, base: Run, reserve_s: float) -> None:
        """The timed rounds: tune's configuration of the one round driver (`measure.session`): which
        one wins (the leader settled against the baseline, every other rival against the leader),
        within the budget, halving the field at rounds 2, 3, 4, 8, ..."""
        spr = max(1, min(8, round(TURN_S / max(1e-3, (base.steady_ms() or 1.0) / 1e3))))
        budget = self.left() - reserve_s
        live = self._fit(base, spr, budget)
        cfg = RoundsConfig(looks=tuple(self.looks), max_s=budget, slow_factor=self.slow_factor, settle="leader",
                           seed=self.seed, bound_text=f"the budget ({self.total_budget_s:g} s)")

        def turn(run: Run, k: int) -> list[float] | None:
            reply = self._call(run, ("run", spr, False), self.left() - reserve_s / 2,
                               "the budget ran out during its round")
            if reply is None:
                return None
            self._record(run, reply["steps"], timed=True)
            return [s["ms"] for s in reply["steps"]]

        session = RoundSession(baseline=base, twin=self.twin, contenders=live, turn=turn, config=cfg,
                               stop=lambda run, why: self._end(run, "stopped", why, collect=True),
                               on_round=lambda done: self._rung(session, done, reserve_s))
        self.load.append(host_load())
        self.rounds = session.run()
        self.stop_reason = session.stop_reason
        self.load.append(host_load())

    def _rung(self, session: RoundSession, done: int, reserve_s: float) -> None:
        """After round `done`: progress, and successive halving at rounds 2, 3 (the first with evidence),
        4, 8, ...: the slower half goes when the leader is surely faster, or unconditionally from round 8,
        or from round 3 when the time left fits fewer than 8 more rounds of this field (a slow model on a
        busy host, 3 rounds in 150 s with 9 rivals): better than ending with too few rounds to judge."""
        self.rounds = done
        self.say(f"round {done}: " + ", ".join(f"{r.cand.name} {statistics.median(r.ms):.1f} ms"
                                                for r in [session.base, *session.runs, session.twin]
                                                if r is not None and r.live and r.ms))
        rivals = sorted((r for r in session.rivals() if r.ms), key=lambda r: statistics.median(r.ms))
        if (done != 3 and done & (done - 1)) or len(rivals) < 2 or done < 2:
            return
        squeezed = done >= 3 and (self.left() - reserve_s) < 8 * session.last_round_s
        leader, keep, floor = rivals[0], math.ceil(len(rivals) / 2), session.floor()
        for r in rivals[keep:]:
            sure = judge(r, leader, floor).verdict == "faster"
            if sure or done >= 8 or squeezed:
                self._end(r, "eliminated", f"successive halving after round {done}: median "
                          f"{statistics.median(r.ms):.1f} ms vs {leader.cand.name} {statistics.median(leader.ms):.1f}"
                          " ms" + (" (surely slower)" if sure else " (too little budget left for this many)"
                                   if squeezed and done < 8 else ""), collect=True)


def measure(workload: Workload, env: EnvReport, *, budget_s: float, names: list[str] | None = None,
            **kw) -> Session:
    """Run the whole schedule; returns the session (its `runs` hold every candidate's record)."""
    s = Session(workload, env, budget_s=budget_s, **kw)
    try:
        first, pruned = (named_candidates(names, env), []) if names else prune(preset_candidates(env), env)
        runs = s._spawn(first[:1])
        base = runs[0]
        if base.status in ("user", "failed", "crashed", "oom"):
            raise UserError(base.reason if base.status == "user" else
                            f"the baseline (plain fp32 PyTorch) fails on this model: {base.reason}")
        s._warm(base, None)
        if base.status != "pending":
            if base.status == "stopped":
                raise UserError(_too_small(s, base))
            raise UserError(base.reason if base.status == "user" else
                            f"the baseline (plain fp32 PyTorch) fails on this model: {base.reason}")
        bad = [v for v in base.loss if not math.isfinite(v)]
        if bad:
            raise UserError(f"the baseline (plain fp32 PyTorch) gives a non-finite loss ({bad[0]} in "
                            f"{len(bad)} of {len(base.loss)} warm-up steps): nothing can be judged safe against it; "
                            "check the model, the batches and the loss function")
        if s.left() < 2 * 3 * (base.steady_ms() or 0) / 1e3 + 2:
            raise UserError(_too_small(s, base))
        # The A/A twin: the baseline once more, in its own worker, timed in the same rounds.
        twin_cand = dataclasses.replace(base.cand, name=twin_name(base.cand.name))
        s.twin = Run(cand=twin_cand)
        s.twin.worker = s.launcher.start(("setup", s._spec(twin_cand)))
        s._collect_setup(s.twin)
        s._warm(s.twin, None)
        # Emulated FP8 is checked for safety only, after everything that can win has warmed up.
        emulated = [c for c in first[1:] if c.emulated]
        t_stage, stage = time.perf_counter(), s._spawn([c for c in first[1:] if not c.emulated])
        for r in stage:
            s._warm(r, base)
        _noted(s, pruned, "pruned")
        if not names:
            for r in s._spawn(_knobs(s, env, base, warm_s=(time.perf_counter() - t_stage) / max(1, len(stage)))):
                s._warm(r, base)
            why = s._memory_limited()
            if why:
                s.say(f"memory is the limit ({why}): adding activation checkpointing")
                survivors = [r.cand for r in s.runs if r.live or r.status == "oom"]
                s.memory_note = why
                for r in s._spawn(checkpointing_candidates(survivors, env, [r.cand for r in s.runs])):
                    s._warm(r, base)
            emulated, late = fit_emulated(emulated, base_setup_s=base.setup_s, base_step_ms=base.steady_ms(),
                                          steps=s.warmup_steps + 3, left_s=s.left(s.warm_deadline))
            _noted(s, [], "", late)  # (the user's own names are set up whatever the estimate)
        for r in s._spawn(emulated):
            s._warm(r, base)
        s._timed(base, reserve_s=min(5.0, 0.05 * budget_s) + 0.2 * sum(1 for r in s.runs if r.live))
        s.finish(base)
        return s
    finally:
        s.close()


def _knobs(s: Session, env: EnvReport, base: Run, *, warm_s: float) -> list[Candidate]:
    """The knobs worth warming up: on the faster half of the precisions in the race (`tuning.field.halve`),
    not pruned by a prior, and only while the rounds keep their share of the budget (`fit_knobs`)."""
    knobs, pruned = prune(knob_candidates([r.cand for r in halve(s.runs)], env, [r.cand for r in s.runs]), env)
    knobs, late = fit_knobs(knobs, warm_s=warm_s, left_s=s.left(), step_ms=base.steady_ms(),
                            live=1 + sum(r.live for r in s.runs), turn_s=TURN_S)
    _noted(s, pruned, "pruned", late)
    return knobs


def _noted(s: Session, pairs: list[tuple[Candidate, str]], status: str,
           skipped: list[tuple[Candidate, str]] = ()) -> None:
    """Rows for contenders never set up (pruned by a prior, or `skipped`: no warm-up time), with why."""
    s.runs += [Run(cand=c, status=status, reason=why) for c, why in pairs]
    s.runs += [Run(cand=c, status="skipped", reason=why) for c, why in skipped]


def _too_small(s: Session, base: Run) -> str:
    took = time.perf_counter() - s.t0
    step = base.steady_ms()
    need = math.ceil((s.total_budget_s - s.budget_s + max(2 * took, took + 40 * (step or 0) / 1e3)) / 10) * 10
    return (f"--budget-s {s.total_budget_s:g} is too small for even the baseline: its set-up and warm-up took "
            f"{took:.0f} s"
            + (f" and a step {step:.0f} ms" if step else "") + f"; use --budget-s {max(need, 30):.0f} or more")
