"""Tune's warm-ups, one candidate at a time, before the timed rounds (`measure.session`).

A candidate's first step is timed apart (it carries torch.compile and allocator growth: the
"warm-up" column, counted against the budget, never in the step time), within a timeout scaled by
the baseline's step (eager) or by this model's compiles so far (compiled); a few more untimed steps
record its loss and grad norm for the safety check against the fp32 shadow (the baseline). Emulated
formats get three more steps for that check and are then stopped: they take no timed turn (the round
driver's rule). Only a gross slowdown stops a candidate here: every warm-up step 5x or more the slowest
of the baseline's steps taken back to back with them, in wall time and in CPU time
(`measure.session.warmup_stop`, bench's rule too).
"""

from __future__ import annotations

import math

from overdrive.errors import UserError
from overdrive.measure.session import GROSS_SLOWDOWN, warmup_stop
from overdrive.recipes.labels import low_precision_format
from overdrive.tuning.run import Run

__all__ = ["WarmUps", "compile_warmup_s", "GROSS_SLOWDOWN", "COMPILE_MARGIN"]

COMPILE_MARGIN = 3.0
"""A compiled candidate's first step may take this many times the slowest compile measured so far for this
model (compiles of one model differ by precision and knobs; a shared host's load swings 3-16)."""


def compile_warmup_s(left_s: float, compiles_s: list[float]) -> tuple[float, str]:
    """(seconds a compiled candidate's first step may take, why): COMPILE_MARGIN x the slowest compile of this
    model measured so far (at least 5 s), within the warm-up time left; all of it for the first compile."""
    if not compiles_s:
        return left_s, "the warm-up time left: the first compile of this model, nothing measured yet"
    need = max(5.0, COMPILE_MARGIN * max(compiles_s))
    return min(left_s, need), f"{COMPILE_MARGIN:g}x this model's slowest compile here so far ({max(compiles_s):.0f} s)"


class WarmUps:
    """The warm-up half of tune's `Session` (its worker plumbing, budget and records are the session's)."""

    def _warm(self, run: Run, base: Run | None) -> None:
        """Warm `run` up; `base` is the warmed-up baseline (None: this is the baseline, or its twin)."""
        if not run.live:
            return
        if base is not None and self.left(self.warm_deadline) <= 0:
            self._end(run, "skipped", f"the budget ({self.total_budget_s:g} s) was spent before its warm-up")
            return
        eager = run.cand.resolved.compile == "off"
        t, why = self._first_step_s(run, base, eager)
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
        # Emulated formats never reach the timed rounds: give their safety check a few more steps here.
        n = self.warmup_steps - 1 + (3 if run.cand.emulated else 0)
        t = self.left(self.warm_deadline if base else self.deadline)
        if base is not None:
            t = min(t, max(5.0, 3 * n * self.slow_factor * (base.steady_ms() or 0) / 1e3))
        reply = self._call(run, ("run", n, True), t, f"its warm-up steps did not finish within {t:.0f} s")
        if reply is None:
            return
        self._record(run, reply["steps"], timed=False)
        run.memory = reply.get("memory")
        if base is not None:
            self._judge_warm(run, base)

    def _first_step_s(self, run: Run, base: Run | None, eager: bool) -> tuple[float, str]:
        """(how long its first step may take, why)."""
        t = self.left(self.warm_deadline if base else self.deadline)
        if base is None:
            return t, "the budget"
        if eager:
            return min(t, max(5.0, 30 * (base.steady_ms() or 0) / 1e3)), "over 30x the baseline's step"
        # Compilation is paid from the budget, by what this model's compiles took here, not by a fixed share
        # of it: a third of 120 s (24 s once set-ups had run) dropped a winner whose compile took 30 s under
        # load. The first compile has nothing to scale from: it may use the warm-up time left.
        return compile_warmup_s(t, [r.warmup_ms[0] / 1e3 for r in self.runs
                                    if r is not run and r.warmup_ms and r.cand.resolved.compile != "off"])

    def _judge_warm(self, run: Run, base: Run) -> None:
        """After its warm-up: unsafe, emulated (checked for safety only) or grossly slower: ended here."""
        run.safety = self._safety(run, base)
        if run.safety.safe is False:
            self._end(run, "unsafe", run.safety.reason, collect=True)
            return
        if run.cand.emulated:
            fmt = low_precision_format(run.cand.resolved.fp8_scaling)
            self._end(run, "emulated", f"{fmt.upper()} emulated (no {fmt.upper()} hardware here): checked for "
                      "safety only, never reported as a speedup", collect=True)
            return
        # Paired check: the baseline steps right now, so a load swing of the shared host (5-10x
        # seen) hits both sides of the comparison alike.
        ref_s = (base.steady_ms() or 0) / 1e3
        reply = self._call(base, ("run", 2, True), max(1.0, min(self.left(), 20 * ref_s + 5)),
                           "the baseline's reference steps did not finish")
        if reply is None:
            raise UserError(f"the baseline stopped during the warm-ups: {base.reason}")
        self._record(base, reply["steps"], timed=False)
        # The one rule of bench and tune (`measure.session.warmup_stop`): every warm-up step 5x the
        # baseline's slowest beside it in wall time and in CPU time; a shared host's load stretches a step's
        # wall time 11-31x from one moment to the next, so the wall time alone is no evidence.
        why = warmup_stop([s["ms"] for s in reply["steps"]], run.warmup_ms[1:],
                          base_cpu_ms=[s.get("cpu_ms") for s in reply["steps"]], run_cpu_ms=run.warmup_cpu_ms[1:])
        if why:
            self._end(run, "stopped", why, collect=True)
