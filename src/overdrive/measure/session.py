"""The one round driver: bench and tune are configurations of it, so a model gets the same verdict
from both.

    session = RoundSession(baseline=base, twin=twin, contenders=runs, turn=one_turn, stop=end_it,
                           config=RoundsConfig.within(max_rounds=32, max_s=60.0, settle="leader"))
    session.run()                  # rounds run; `session.stop_reason` says why they stopped there
    session.verdict(run)           # `Comparison` against the baseline: faster | slower | same | unknown
    session.too_busy()             # the A/A floor is too wide for any recommendation

A contender is anything with `name`, `rounds_ms` (per timed round, its step times), `emulated` and
`live`; the caller's `turn(run, k)` steps it once in round k and returns that turn's step times (None
when it failed: the caller has marked why), and `stop(run, reason)` ends one stopped for slowness.
Warm-up happens before: the driver only ever sees warmed-up contenders.

One rule for each thing bench and tune both decide:
- rounds: every live contender takes one turn per round in a seeded shuffled order
  (`measure.rounds.interleaved_rounds`), the baseline's A/A twin among them (this host's noise, now);
- stop after warm-up: a contender whose every warm-up step is `GROSS_SLOWDOWN` (5x) or more the
  slowest of the baseline's warm-up steps taken beside it (interleaved, or back to back), in wall time
  and in CPU time, is stopped before any timed round (`warmup_stop`): bf16 on a CPU without bf16 units
  (11-26x) no longer takes the rounds' wall time from the baseline, its A/A twin and the rest;
- early stop: a configuration is stopped for slowness only when a round is complete (mid-round the
  baseline may not have had its turn yet: the shuffled order would decide), on a paired interval over
  at least 3 rounds wholly below 1/slow_factor and beyond the A/A floor (`evidence_of_slowdown`);
- seeds: every bootstrap of a configuration is seeded by its name (`ci_seed`), so its early stop, its
  verdict and the interval a report prints agree wherever they are computed;
- emulated formats take no turn: their speed is no result, and on a busy host every turn goes to a
  contender. Their quality is the caller's (untimed steps);
- looks: the rounds may stop only at fixed looks, every interval at the looks' Bonferroni level; at a
  look they stop when the floor is narrow and every verdict that matters is settled (`ready_to_stop`:
  each contender against the baseline, or the leader against the baseline and the rest against the
  leader), when nothing is left to measure against the baseline, or at the last look;
- the bound: a round is not started when the last round's wall time says it would end past `max_s`
  (never below `min_rounds`); dropped contenders no longer count, and the wall clock still holds;
- too busy: the A/A interval wider than [1/1.15, 1.15] (`host_too_busy`).
"""

from __future__ import annotations

import statistics
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from overdrive.measure.rounds import interleaved_rounds
from overdrive.measure.stats import (Comparison, NoiseFloor, compare, evidence_of_slowdown, host_too_busy,
                                     look_rounds, noise_floor, ready_to_stop, round_medians)

__all__ = ["Contender", "GROSS_SLOWDOWN", "WARMUP_STOP_LABEL", "RoundsConfig", "RoundSession",
           "ci_seed", "floor_of", "judge", "slow_stop", "twin_name", "warmup_slowdown", "warmup_stop"]

GROSS_SLOWDOWN = 5.0
"""A contender is stopped before any timed round when its fastest warm-up step takes this many times the
slowest of the baseline's warm-up steps taken beside it, in wall time and in CPU time (its worker's, all
threads: the work a step does). Measured with two identical workers stepping in turn on a 2-core host
(`benchmarks/warmup_noise.py`, `benchmarks/results/cpu/2026-12-02-warmup-noise/`): a load of 5-20 timed
against one of them faked 11-31x in wall time, so no wall factor is proof alone, but at most 1.86x in CPU
time. bf16 and fp16 on an AVX2-only CPU: 11-14x in both (1 thread), 21-26x in wall time (2 threads: fp32
uses both, their slow path one)."""
WARMUP_STOP_LABEL = "stopped after warm-up"
"""How a contender stopped by `warmup_stop` is named wherever it is shown (its reason starts with it)."""


class Contender(Protocol):
    """What the driver needs of a measured configuration (bench's `ConfigRun`, tune's `Run`)."""

    rounds_ms: list[list[float]]

    @property
    def name(self) -> str: ...

    @property
    def emulated(self) -> bool: ...

    @property
    def live(self) -> bool: ...


def ci_seed(name: str) -> int:
    """The bootstrap seed of a configuration: the same in the early stop, the verdict and the report,
    so a stopped configuration's reported interval is the one it was stopped on."""
    return zlib.crc32(name.encode())


def twin_name(name: str) -> str:
    """The A/A twin of the baseline `name`: the baseline once more, in its own worker."""
    return f"{name} (A/A twin)"


def floor_of(base: Contender | None, twin: Contender | None, *, looks: int = 1) -> NoiseFloor | None:
    """The A/A noise floor so far: the baseline against its twin, at the looks' level (None without a
    twin or before 2 rounds)."""
    if base is None or twin is None:
        return None
    return noise_floor(round_medians(base.rounds_ms), round_medians(twin.rounds_ms), looks=looks)


def judge(base: Contender, run: Contender, floor: NoiseFloor | None, *, looks: int | None = None) -> Comparison:
    """The verdict on `run` against the baseline, its interval seeded by its name."""
    return compare(round_medians(base.rounds_ms), round_medians(run.rounds_ms), floor, seed=ci_seed(run.name),
                   looks=looks)


def slow_stop(base: Contender, run: Contender, floor: NoiseFloor | None, slow_factor: float) -> str | None:
    """Why `run` is stopped for slowness (the paired interval over >= 3 rounds wholly below
    1/slow_factor, and beyond the floor), or None. Never an emulated format, the baseline or its twin."""
    if run is base or run.emulated:
        return None
    c = round_medians(run.rounds_ms)
    ci = evidence_of_slowdown(round_medians(base.rounds_ms), c, slow_factor, seed=ci_seed(run.name), floor=floor)
    if ci is None:
        return None
    return (f"{1 / ci[0]:.1f}x slower than the baseline over {len(c)} paired rounds (speedup {ci[0]:.2f}x, "
            f"interval [{ci[1]:.2f}–{ci[2]:.2f}] entirely below 1/{slow_factor:g}): not measured further")


def warmup_stop(base_ms: Sequence[float], run_ms: Sequence[float], *, base_cpu_ms: Sequence[float | None] = (),
                run_cpu_ms: Sequence[float | None] = (), factor: float = GROSS_SLOWDOWN,
                base_name: str = "the baseline", min_steps: int = 2) -> str | None:
    """Why a contender is stopped on its warm-up, before any timed round, or None. `base_ms`: the
    baseline's warm-up steps (and its twin's) taken beside the contender's `run_ms`, interleaved or back to
    back, never first steps (they carry compilation); `*_cpu_ms`: the CPU time of the same steps. Stopped
    when its fastest step is `factor` times the baseline's slowest in wall time and in CPU time, over at
    least `min_steps` steps a side: a load that stretches one side's steps moves the wall time, not the
    work. Without CPU times: never. The one rule of bench and tune."""
    b, c = [x for x in base_ms if x > 0], list(run_ms)
    bc, cc = [x for x in base_cpu_ms if x is not None and x > 0], [x for x in run_cpu_ms if x is not None]
    if len(b) < min_steps or len(c) < min_steps or len(bc) != len(b) or len(cc) != len(c):
        return None
    wall, cpu = min(c) / max(b), min(cc) / max(bc)
    if wall < factor or cpu < factor:
        return None
    mb, mc = statistics.median(b), statistics.median(c)
    return (f"{WARMUP_STOP_LABEL}: {warmup_slowdown(b, c):.0f}x slower than {base_name} in its warm-up steps ({mc:,.0f} vs "
            f"{mb:,.0f} ms median; its fastest {wall:.0f}x the baseline's slowest in wall time and {cpu:.0f}x in CPU "
            f"time, over {factor:g}x), not timed")


def warmup_slowdown(base_ms: Sequence[float], run_ms: Sequence[float]) -> float:
    """How many times slower a contender's warm-up steps ran than the baseline's beside them: the ratio of
    the medians, the figure `warmup_stop` names and a stopped run reports (`warmup_slowdown` in JSON)."""
    return statistics.median(run_ms) / statistics.median([x for x in base_ms if x > 0])


@dataclass(frozen=True, kw_only=True)
class RoundsConfig:
    """How one tool measures: the bound, the early-stop factor and what must settle."""

    looks: tuple[int, ...]
    """The rounds after which the rounds may stop (fixed before timing: `measure.stats.look_rounds`);
    Every interval is at level 1 - 0.05/len(looks)."""
    max_rounds: int | None = None
    """The most rounds run (None: the last look)."""
    max_s: float | None = None
    """Wall-clock bound on the timed rounds (None: none)."""
    min_rounds: int = 1
    """The time bound never cuts the rounds below this."""
    stop_at_look: bool = False
    """At a look whose next look cannot be reached within `max_s`, stop there (bench: its rounds end
    at a look, its cap is generous) rather than measure on to the bound (tune: a hard budget)."""
    slow_factor: float = 3.0
    """Stop a contender whose whole paired interval says it is more than this many times slower."""
    settle: Literal["each", "leader"] = "each"
    """What must be settled to stop at a look: each contender against the baseline (bench), or the
    fastest against the baseline and every other against the fastest (tune: which one wins)."""
    seed: int = 0
    """Seeds the order of the turns in each round."""
    bound_text: str = "the time bound"
    """How the stop reason names `max_s` ("the budget (150 s)")."""

    @classmethod
    def within(cls, *, max_rounds: int, max_s: float | None = None, first_look: int = 4, **kw) -> RoundsConfig:
        """Measure on within a stated bound until the looks settle: looks at `first_look`, twice that, ...
        up to `max_rounds` (at most `measure.stats.LOOKS` of them, at least 3 rounds each), never past
        `max_s` seconds; `kw`: the other fields."""
        return cls(looks=tuple(look_rounds(first_look, max_rounds)), max_s=max_s, **kw)


class RoundSession:
    """Timed rounds over warmed-up contenders until the looks settle or the bound comes.

    `on_round(done)` is called after every complete round (after the early stops: progress, tune's
    successive halving); `on_look(done)` at every look before it is judged (bench's partial results)."""

    def __init__(self, *, baseline: Contender | None, twin: Contender | None, contenders: Sequence[Contender],
                 turn: Callable[[Contender, int], list[float] | None], stop: Callable[[Contender, str], None],
                 config: RoundsConfig, on_round: Callable[[int], None] | None = None,
                 on_look: Callable[[int], None] | None = None, clock: Callable[[], float] = time.perf_counter) -> None:
        self.base, self.twin, self.cfg = baseline, twin, config
        self.runs = [r for r in contenders if r is not baseline and r is not twin]
        """The contenders measured against the baseline (emulated ones included, never timed)."""
        self.turn, self.stop, self.on_round, self.on_look, self.clock = turn, stop, on_round, on_look, clock
        self.rounds = 0
        self.stop_reason = ""
        """Why the timed rounds stopped where they did."""
        self.last_round_s = 0.0
        """Wall time of the last complete round (what the next one is expected to take)."""
        self.t0 = self._t_last = clock()

    @property
    def looks(self) -> int:
        return len(self.cfg.looks)

    def floor(self) -> NoiseFloor | None:
        return floor_of(self.base, self.twin, looks=self.looks)

    def verdict(self, run: Contender) -> Comparison:
        return judge(self.base, run, self.floor(), looks=self.looks)

    def too_busy(self) -> bool:
        return host_too_busy(self.floor())

    def rivals(self) -> list[Contender]:
        """The contenders still timed against the baseline."""
        return [r for r in self.runs if r.live and not r.emulated]

    def elapsed(self) -> float:
        return self.clock() - self.t0

    def run(self) -> int:
        """Run the timed rounds; returns how many ran (also `self.rounds`)."""
        keys = [r for r in (self.base, *self.runs, self.twin) if r is not None and r.live and not r.emulated]
        self.t0 = self._t_last = self.clock()
        self.rounds = interleaved_rounds(keys, self._one, rounds=self.cfg.max_rounds or self.cfg.looks[-1],
                                         on_round=self._end_of_round, shuffle_seed=self.cfg.seed, until=self._until)
        if not self.stop_reason:
            self.stop_reason = (f"the most rounds planned ({self.rounds})" if any(r.live for r in keys) else
                                f"every configuration stopped after {self.rounds} rounds")
        return self.rounds

    def _one(self, run: Contender, k: int) -> bool:
        if not run.live:
            return False
        steps = self.turn(run, k)
        if steps is None:
            return False
        run.rounds_ms.append(list(steps))
        return run.live

    def _end_of_round(self, done: int, _planned: int) -> None:
        self.rounds = done
        now = self.clock()
        self.last_round_s, self._t_last = now - self._t_last, now
        floor = self.floor()
        for run in self.rivals():
            why = slow_stop(self.base, run, floor, self.cfg.slow_factor) if self.base is not None else None
            if why:
                self.stop(run, why)
        if self.on_round is not None:
            self.on_round(done)

    def _until(self, done: int) -> bool:
        why = self._at_look(done) if done in self.cfg.looks else None
        cfg, spent = self.cfg, self.elapsed()
        if why is None and cfg.max_s is not None and done >= cfg.min_rounds and spent + self.last_round_s > cfg.max_s:
            why = f"{cfg.bound_text} after {done} rounds"
        if why:
            self.stop_reason = why
        return why is not None

    def _at_look(self, done: int) -> str | None:
        if self.on_look is not None:
            self.on_look(done)
        if not self.rivals():
            return f"no configuration left to measure against the baseline after {done} rounds"
        if done == self.cfg.looks[-1]:
            return f"the last look ({done} rounds)"
        why = self.evidence_in()
        if why or not self.cfg.stop_at_look or self.cfg.max_s is None:
            return why
        nxt, spent = self.cfg.looks[self.cfg.looks.index(done) + 1], self.elapsed()
        if spent + self.last_round_s * (nxt - done) > self.cfg.max_s:
            return (f"{self.cfg.bound_text}: {nxt} rounds would not fit in {self.cfg.max_s:g} s "
                    f"({spent:.0f} s for {done}), evidence still out")
        return None

    def leader(self) -> Contender | None:
        """The fastest contender still timed (median of its timed steps)."""
        timed = [r for r in self.rivals() if r.rounds_ms]
        return min(timed, key=lambda r: statistics.median(x for t in r.rounds_ms for x in t), default=None)

    def evidence_in(self) -> str | None:
        """Why the rounds may stop now on evidence (`measure.stats.ready_to_stop`), or None. Without a
        twin there is no floor: never."""
        if self.twin is None or self.base is None:
            return None
        floor = self.floor()
        if self.cfg.settle == "each":
            return ready_to_stop(floor, [self.verdict(r) for r in self.rivals()])
        lead = self.leader()
        if lead is None:
            return None
        cmps = [self.verdict(lead)] + [judge(r, lead, floor, looks=self.looks) for r in self.rivals()
                                        if r is not lead and r.rounds_ms]
        why = ready_to_stop(floor, cmps)
        return f"{why}; leader {lead.name}" if why else None
