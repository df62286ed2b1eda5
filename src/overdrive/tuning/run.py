"""One candidate's record in `overdrive.tune`: its worker, its warm-up and timed steps, its losses and
what the safety check said."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from overdrive.measure.launch import Worker
from overdrive.tuning.candidates import Candidate
from overdrive.tuning.safety import SafetyResult

__all__ = ["Run"]


@dataclass(eq=False)
class Run:
    cand: Candidate
    status: str = "pending"
    """ok | eliminated (successive halving) | stopped (too slow / budget) | unsafe | emulated |
    skipped (budget spent, or FP8 filter found no winning layer) | failed | oom | crashed"""
    reason: str = ""
    setup_s: float | None = None
    warmup_ms: list[float] = field(default_factory=list)
    warmup_cpu_ms: list[float | None] = field(default_factory=list)
    """The CPU time of each warm-up step in its worker (None where the worker did not say)."""
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
    def name(self) -> str:
        return self.cand.name

    @property
    def emulated(self) -> bool:
        return self.cand.emulated

    @property
    def live(self) -> bool:
        return self.status == "pending" and self.worker is not None

    def steady_ms(self) -> float | None:
        xs = self.ms or self.warmup_ms[1:]
        return statistics.median(xs) if xs else None
