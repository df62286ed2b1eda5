"""Measure the candidates: each in its own process, warm-up apart, interleaved rounds, successive
halving, never past the budget.

The schedule, and why:
1. Stage 1 (presets) is spawned; the baseline warms up first. If the baseline cannot finish its
   warm-up and two rounds inside the budget, the user is told the budget is too small (exit 2).
2. Each candidate's first step is timed apart (it carries torch.compile and allocator growth: the
   "warm-up" column, counted against the budget, never in the step time); a few more untimed
   steps record its loss and grad norm for the safety check against the fp32 shadow (the
   baseline, same batches and seed). Far slower than the baseline (bf16 on a CPU without bf16
   units runs ~70x slower): stopped at once. Emulated FP8: checked for safety, then stopped.
3. Stage 2 adds the knobs (compile, optimizer) on the precisions that survived; stage 3 adds
   activation checkpointing only when memory is the limit (an OOM, or > 85% of GPU memory).
4. Timed rounds through `measure.rounds.interleaved_rounds` (rotating order, so a noisy shared host
   drifts on all alike), a twin of the baseline among them (the A/A control: this host's noise,
   measured now); after rounds 2, 3, 4, 8, ... the slower half is dropped (successive halving) when the
   leader is surely faster on paired per-round ratios, or unconditionally from round 8 on, or from
   round 3 on when the time left fits fewer than 8 more rounds of the field. An early
   stop for slowness needs at least 3 rounds (`measure.stats.evidence_of_slowdown`); during the
   warm-ups only a gross slowdown (over 10x, bf16 on a CPU without bf16 units runs ~70x) stops one.
5. The rounds stop early only on evidence, at fixed looks (rounds 4, 8, 16, 32: `measure.stats.look_rounds`),
   every interval at the looks' Bonferroni level: when the A/A floor is narrow enough to judge, the
   leader's verdict against the baseline is settled and every rival left is surely slower than the
   leader or the same within ±5%. Otherwise they go on until the budget (a busy host needs more
   rounds to judge, not a "too busy" after a few); why they stopped is recorded.
Threads per worker come from the cores, the workers stepping at once and the load (recorded).
Every call to a worker has a timeout that ends at the deadline, so the budget holds.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from overdrive.recipes.labels import low_precision_format
from overdrive.env import EnvReport
from overdrive.errors import UserError
from overdrive.measure.launch import Failure, Launcher, Worker
from overdrive.measure.rounds import interleaved_rounds
from overdrive.measure.stats import (LOOKS, compare, evidence_of_slowdown, look_rounds, noise_floor, ready_to_stop,
                                     round_medians)
from overdrive.measure.threads import host_load, plan_threads
from overdrive.recipes import resolve
from overdrive.tuning.candidates import (Candidate, checkpointing_candidates, knob_candidates, named_candidates,
                                       preset_candidates)
from overdrive.tuning.safety import SafetyResult, Tolerance, check_safety
from overdrive.tuning.task import PROGRAM
from overdrive.tuning.workload import Workload

__all__ = ["Run", "Session", "measure", "GROSS_SLOWDOWN"]

PRELOAD = ("torch", "overdrive.accelerated", "overdrive.tuning.task", "torchao.float8")
"""What tune's fork server imports before forking its workers (after `measure.fork_safe`)."""

GROSS_SLOWDOWN = 10.0
"""During the warm-ups, a candidate this many times slower on every step is stopped at once."""
LOOK_ROUNDS = look_rounds(4, 32, LOOKS)
"""The rounds after which tune may stop measuring (4, 8, 16, 32); the budget may end them sooner."""
COMPILE_MARGIN = 3.0
"""A compiled candidate's first step may take this many times the slowest compile measured so far for this
model (compiles of one model differ by precision and knobs; a shared host's load swings 3-16)."""
TURN_S = 0.3
"""About this much of the baseline's step time per turn (at least one step): short turns give more
rounds, and the round, not the step, is the unit of evidence."""


@dataclass(eq=False)
class Run:
    cand: Candidate
    status: str = "pending"
    """ok | eliminated (successive halving) | stopped (too slow / budget) | unsafe | emulated |
    skipped (budget spent, or FP8 filter found no winning layer) | failed | oom | crashed"""
    reason: str = ""
    setup_s: float | None = None
    warmup_ms: list[float] = field(default_factory=list)
    ms: list[float] = field(default_factory=list)
    rounds_ms: list[list[float]] = field(default_factory=list)
    """The timed steps per round (paired with the baseline's round by round)."""
    loss: list[float] = field(default_factory=list)
    gnorm: list[float | None] = field(default_factory=list)
    conversions: dict = field(default_factory=dict)
    signature: str | None = None
    fp8_filter: dict | None = None
    memory: dict | None = None
    safety: SafetyResult | None = None
    worker: Worker | None = None
    threads: int | None = None
    """The torch threads its worker stepped with (the plan's, unless the user's model set its own)."""

    @property
    def live(self) -> bool:
        return self.status == "pending" and self.worker is not None

    def steady_ms(self) -> float | None:
        xs = self.ms or self.warmup_ms[1:]
        return statistics.median(xs) if xs else None


class Session:
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
            run.loss.append(s["loss"])
            run.gnorm.append(s["gnorm"])

    def _warm(self, run: Run, base: Run | None) -> None:
        if not run.live:
            return
        if base is not None and self.left(self.warm_deadline) <= 0:
            self._end(run, "skipped", f"the budget ({self.total_budget_s:g} s) was spent before its warm-up")
            return
        eager = run.cand.resolved.compile == "off"
        ref_s = (base.steady_ms() or 0) / 1e3 if base else 0.0
        t = self.left(self.warm_deadline if base else self.deadline)
        if base is not None and eager:
            t, why = min(t, max(5.0, 30 * ref_s)), "over 30x the baseline's step"
        elif base is not None:
            # Compilation is paid from the budget, by what this model's compiles took here, not by a fixed share
            # of it: a third of 120 s (24 s once set-ups had run) dropped a winner whose compile took 30 s under
            # load. The first compile has nothing to scale from: it may use the warm-up time left.
            t, why = compile_warmup_s(t, [r.warmup_ms[0] / 1e3 for r in self.runs
                                          if r is not run and r.warmup_ms and r.cand.resolved.compile != "off"])
        else:
            why = "the budget"
        self.say(f"warm-up {run.cand.label}" + ("" if eager else " (compiling)"))
        reply = self._call(run, ("run", 1, True), t, f"its first step (warm-up{'' if eager else ', compiling'}) "
                           f"did not finish within {t:.0f} s ({why})")
        if reply is None:
            return
        self._record(run, reply["steps"], timed=False)
        if base is not None and eager and run.warmup_ms[0] > 15 * (base.steady_ms() or math.inf):
            self._end(run, "stopped", f"{run.warmup_ms[0] / base.steady_ms():.0f}x the baseline's step on its first "
                      "step: not measured further")
            return
        # Emulated FP8 never reaches the timed rounds: give its safety check a few more steps here.
        n = self.warmup_steps - 1 + (3 if run.cand.emulated else 0)
        t = self.left(self.warm_deadline if base else self.deadline)
        if base is not None:
            t = min(t, max(5.0, 3 * n * self.slow_factor * ref_s))
        reply = self._call(run, ("run", n, True), t, f"its warm-up steps did not finish within {t:.0f} s")
        if reply is None:
            return
        self._record(run, reply["steps"], timed=False)
        run.memory = reply.get("memory")
        if base is None:
            return
        run.safety = self._safety(run, base)
        if run.safety.safe is False:
            self._end(run, "unsafe", run.safety.reason, collect=True)
        elif run.cand.emulated:
            fmt = low_precision_format(run.cand.resolved.fp8_scaling)
            self._end(run, "emulated", f"{fmt.upper()} emulated (no {fmt.upper()} hardware here): checked for "
                      "safety only, never reported as a speedup", collect=True)
        else:
            # Paired check: the baseline steps right now, so a load swing of the shared host (5-10x
            # seen) hits both sides of the comparison alike.
            reply = self._call(base, ("run", 2, True), max(1.0, min(self.left(), 20 * ref_s + 5)),
                               "the baseline's reference steps did not finish")
            if reply is None:
                raise UserError(f"the baseline stopped during the warm-ups: {base.reason}")
            self._record(base, reply["steps"], timed=False)
            ref = statistics.median(s["ms"] for s in reply["steps"])
            mine = statistics.median(run.warmup_ms[1:])
            # Only a gross slowdown stops a candidate here, before any timed round: a shared host
            # swings 5-10x from one moment to the next, so 3x from one window is no evidence.
            if mine > GROSS_SLOWDOWN * ref and run.warmup_ms[0] > GROSS_SLOWDOWN * ref:
                self._end(run, "stopped", f"{mine / ref:.0f}x slower than the baseline on every warm-up step ({mine:.1f} "
                          f"vs {ref:.1f} ms, measured back to back; over {GROSS_SLOWDOWN:g}x): not measured further",
                          collect=True)

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
        if self.twin is None:
            return None
        return noise_floor(round_medians(base.rounds_ms), round_medians(self.twin.rounds_ms), looks=len(self.looks))

    def _timed(self, base: Run, reserve_s: float) -> None:
        live = [r for r in self.runs if r.live] + ([self.twin] if self.twin is not None and self.twin.live else [])
        step_s = {id(r): (r.steady_ms() or 1.0) / 1e3 for r in live}
        spr = max(1, min(8, round(TURN_S / max(1e-3, step_s[id(base)]))))
        budget = self.left() - reserve_s
        # What cannot fit twice in the time left is dropped now, slowest first (the baseline stays).
        while len(live) > 1 and 2 * spr * sum(step_s[id(r)] for r in live) > budget:
            rivals = [r for r in live if r is not base and r is not self.twin]
            if not rivals:  # only the baseline and its twin left: the twin goes last
                worst = self.twin
            else:
                worst = max(rivals, key=lambda r: step_s[id(r)])
            self._end(worst, "skipped", "too little budget left for timed rounds after the warm-ups", collect=True)
            live.remove(worst)
        by_id = {id(r): r for r in live}

        def run_one(key: int, k: int) -> bool:
            run = by_id[key]
            if not run.live:
                return False
            t = self.left() - reserve_s / 2
            reply = self._call(run, ("run", spr, False), t, "the budget ran out during its round")
            if reply is None:
                return False
            self._record(run, reply["steps"], timed=True)
            run.rounds_ms.append([s["ms"] for s in reply["steps"]])
            if run is not base and run is not self.twin:
                ci = evidence_of_slowdown(round_medians(base.rounds_ms), round_medians(run.rounds_ms),
                                          self.slow_factor, floor=self.floor(base))
                if ci is not None:
                    self._end(run, "stopped", f"{1 / ci[0]:.1f}x slower than the baseline over "
                              f"{len(run.rounds_ms)} paired rounds (interval [{ci[1]:.2f}–{ci[2]:.2f}] entirely "
                              f"below 1/{self.slow_factor:g}): not measured further", collect=True)
                    return False
            return True

        def halve(done: int, _total: int) -> None:
            self.rounds = done
            self.say(f"round {done}: " + ", ".join(f"{r.cand.name} {statistics.median(r.ms):.1f} ms"
                                                    for r in live if r.live and r.ms))
            now = time.perf_counter()
            per_round, t_round[0] = now - t_round[0], now
            if done != 3 and done & (done - 1):  # rungs at rounds 2, 3 (the first with evidence), 4, 8, ...
                return
            rivals = sorted((r for r in live if r.live and r is not base and r is not self.twin and r.ms),
                            key=lambda r: statistics.median(r.ms))
            if len(rivals) < 2 or done < 2:
                return
            # Squeezed: the time left fits fewer than 8 more rounds of this field (a slow model on a busy
            # host, 3 rounds in 150 s with 9 rivals): halve on the paired medians of >= 3 rounds rather
            # than end with too few rounds to judge anything.
            squeezed = done >= 3 and (self.left() - reserve_s) < 8 * per_round
            leader, keep = rivals[0], math.ceil(len(rivals) / 2)
            for r in rivals[keep:]:
                sure = compare(round_medians(r.rounds_ms), round_medians(leader.rounds_ms),
                               self.floor(base)).verdict == "faster"
                if sure or done >= 8 or squeezed:
                    self._end(r, "eliminated", f"successive halving after round {done}: median "
                              f"{statistics.median(r.ms):.1f} ms vs {leader.cand.name} {statistics.median(leader.ms):.1f}"
                              " ms" + (" (surely slower)" if sure else " (too little budget left for this many)"
                                       if squeezed and done < 8 else ""), collect=True)

        def until(done: int) -> bool:
            if done not in self.looks:
                return False
            if done == self.looks[-1]:
                self.stop_reason = f"the last look ({done} rounds)"
                return True
            why = self._evidence_in(base, [r for r in live if r.live and r is not base and r is not self.twin])
            if why:
                self.stop_reason = why
            return why is not None

        self.load.append(host_load())
        t_round = [time.perf_counter()]
        n = interleaved_rounds([id(r) for r in live], run_one, rounds=self.looks[-1], budget_s=budget, min_rounds=1,
                               on_round=halve, shuffle_seed=self.seed, until=until)
        if not self.stop_reason:
            self.stop_reason = f"the budget ({self.total_budget_s:g} s) after {n} rounds"
        self.load.append(host_load())

    def _evidence_in(self, base: Run, rivals: list[Run]) -> str | None:
        """At a look: the floor narrow, the leader settled against the baseline, every other rival
        surely slower than the leader or the same within ±5% (`measure.stats.ready_to_stop`)."""
        rivals = [r for r in rivals if r.ms]
        if not rivals:
            return None
        floor = self.floor(base)
        leader = min(rivals, key=lambda r: statistics.median(r.ms))
        lead = round_medians(leader.rounds_ms)
        cmps = [compare(round_medians(base.rounds_ms), lead, floor)]
        cmps += [compare(round_medians(r.rounds_ms), lead, floor) for r in rivals if r is not leader]
        why = ready_to_stop(floor, cmps)
        return f"{why}; leader {leader.cand.name}" if why else None


def measure(workload: Workload, env: EnvReport, *, budget_s: float, names: list[str] | None = None,
            **kw) -> Session:
    """Run the whole schedule; returns the session (its `runs` hold every candidate's record)."""
    s = Session(workload, env, budget_s=budget_s, **kw)
    try:
        first = named_candidates(names, env) if names else preset_candidates(env)
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
        twin_cand = dataclasses.replace(base.cand, name=f"{base.cand.name} (A/A twin)")
        s.twin = Run(cand=twin_cand)
        s.twin.worker = s.launcher.start(("setup", s._spec(twin_cand)))
        s._collect_setup(s.twin)
        s._warm(s.twin, None)
        # Emulated FP8 is checked for safety only, after everything that can win has warmed up.
        emulated = [c for c in first[1:] if c.emulated]
        for r in s._spawn([c for c in first[1:] if not c.emulated]):
            s._warm(r, base)
        if not names:
            # Knobs for the precisions that are in the race, fastest first (the budget may end mid-stage).
            alive = sorted((r for r in s.runs if r.live), key=lambda r: r.steady_ms() or math.inf)
            best = alive[0].steady_ms() if alive else None
            survivors = [r.cand for r in alive if best and (r.steady_ms() or math.inf) <= 2 * best]
            for r in s._spawn(knob_candidates(survivors, env, [r.cand for r in s.runs])):
                s._warm(r, base)
            why = s._memory_limited()
            if why:
                s.say(f"memory is the limit ({why}): adding activation checkpointing")
                survivors = [r.cand for r in s.runs if r.live or r.status == "oom"]
                s.memory_note = why
                for r in s._spawn(checkpointing_candidates(survivors, env, [r.cand for r in s.runs])):
                    s._warm(r, base)
        for r in s._spawn(emulated):
            s._warm(r, base)
        s._timed(base, reserve_s=min(5.0, 0.05 * budget_s) + 0.2 * sum(1 for r in s.runs if r.live))
        s.finish(base)
        return s
    finally:
        s.close()


def compile_warmup_s(left_s: float, compiles_s: list[float]) -> tuple[float, str]:
    """(seconds a compiled candidate's first step may take, why): COMPILE_MARGIN x the slowest compile of this
    model measured so far (at least 5 s), within the warm-up time left; all of it for the first compile."""
    if not compiles_s:
        return left_s, "the warm-up time left: the first compile of this model, nothing measured yet"
    need = max(5.0, COMPILE_MARGIN * max(compiles_s))
    return min(left_s, need), f"{COMPILE_MARGIN:g}x this model's slowest compile here so far ({max(compiles_s):.0f} s)"


def _too_small(s: Session, base: Run) -> str:
    took = time.perf_counter() - s.t0
    step = base.steady_ms()
    need = math.ceil((s.total_budget_s - s.budget_s + max(2 * took, took + 40 * (step or 0) / 1e3)) / 10) * 10
    return (f"--budget-s {s.total_budget_s:g} is too small for even the baseline: its set-up and warm-up took "
            f"{took:.0f} s"
            + (f" and a step {step:.0f} ms" if step else "") + f"; use --budget-s {max(need, 30):.0f} or more")
