"""What bench keeps of one configuration (`ConfigRun`: its worker, status, warm-up and timed steps,
losses) and of the schedule it ran (`Schedule`); `bench.runner` fills them, `bench.analysis` reads them."""

from __future__ import annotations

from dataclasses import dataclass, field

from overdrive.bench.suites import Candidate
from overdrive.measure.launch import Worker
from overdrive.measure.threads import ThreadPlan

__all__ = ["ConfigRun", "Schedule"]


@dataclass
class ConfigRun:
    cand: Candidate
    roles: tuple[str, ...] = ("teacher", "student")
    """What one step trains, timed apart: a teacher and a student (GPT), or one model (recsys)."""
    resolved: dict | None = None
    label: str = ""
    """What ran: the name, or `name → what ran (fallback: cause)`."""
    also: list[dict] = field(default_factory=list)
    """Other candidates that resolved to the same effective recipe: [{"name", "label"}]."""
    status: str = "pending"
    """ok | stopped (slower than the budget allows) | failed | oom | crashed | unavailable"""
    reason: str = ""
    setup_s: float | None = None
    applied: dict | None = None
    """Per role, the resolved recipe after the applier (what really ran: e.g. bf16 where no layer converted)."""
    first_step_s: float | None = None
    warmup_ms: list[float] = field(default_factory=list)
    warmup_cpu_ms: list[float | None] = field(default_factory=list)
    """The CPU time of each warm-up step in its worker (None where the worker did not say)."""
    ms: dict[str, list[float]] = field(default_factory=dict)
    loss: dict[str, list[float]] = field(default_factory=dict)
    skipped: dict[str, list[bool]] = field(default_factory=dict)
    """Per step: the optimizer step was skipped (GradScaler found inf/nan)."""
    rounds_ms: list[list[float]] = field(default_factory=list)
    """Per round: the combined step times (all roles), for paired comparisons."""
    round_t: list[float] = field(default_factory=list)
    """When each of this run's timed rounds started (s since the first), for the record."""
    twin: bool = False
    """The baseline's A/A twin: timed in the rounds, never a result of its own."""
    memory: dict | None = None
    stopped_at: str | None = None
    warmup_slowdown: float | None = None
    """Its median warm-up step over the baseline's, when stopped after warm-up (what its row shows)."""
    """Where a stopped run was stopped: "warm-up" (`measure.session.warmup_stop`: never timed) or "rounds"."""
    parity_skipped: str | None = None
    """Why this run's quality was not assessed though it ran (far slower than the baseline here)."""
    final: dict | None = None
    """Held-out metrics the task reports at the parity step (e.g. AUC and log-loss for recsys)."""
    worker: Worker | None = None

    def __post_init__(self) -> None:
        for r in self.roles:
            self.ms.setdefault(r, [])
            self.loss.setdefault(r, [])
            self.skipped.setdefault(r, [])
        self.label = self.label or self.cand.name

    @property
    def live(self) -> bool:
        return self.status == "pending" and self.worker is not None and self.worker.conn is not None

    @property
    def name(self) -> str:
        return self.cand.name

    @property
    def emulated(self) -> bool:
        """Runs an emulated low-precision format: no timed turn, only its quality is a result."""
        return bool((self.resolved or {}).get("emulated"))

    @property
    def steps(self) -> int:
        return len(self.loss[self.roles[0]])

    def step_ms(self) -> list[float]:
        return [sum(v) for v in zip(*(self.ms[r] for r in self.roles))]


@dataclass
class Schedule:
    """What the scheduler did: rounds planned and run, and why fewer."""
    rounds_planned: int
    rounds_run: int = 0
    budget_s: float = 0.0
    parity_steps: int = 0
    cut_by_budget: bool = False
    threads: ThreadPlan | None = None
    load: list[float | None] = field(default_factory=list)
    """The host's 1-minute load average at the start and at the end of the timed rounds."""
    twin: ConfigRun | None = None
    looks: list[int] = field(default_factory=list)
    """The rounds after which the run could stop (fixed before timing; every interval is at level
    1 - 0.05/len(looks))."""
    wall_cap_s: float = 0.0
    """The adaptive rounds' wall-time cap."""
    stop_reason: str = ""
    """Why the timed rounds stopped where they did."""
