"""Typed views of the results files for the report: each record is built once from a document its
kind's reader has checked (`overdrive.results`), so the renderers read attributes, not `.get` chains,
and a field an older writer did not write has one default here, not one per renderer."""

from __future__ import annotations

from dataclasses import dataclass, field

from overdrive.measure.session import WARMUP_STOP_LABEL

__all__ = ["AARecord", "NoiseRecord", "TuneRow", "TuneRecord", "Recommendation", "ConfigRecord", "BenchRecord"]


@dataclass(frozen=True, kw_only=True)
class AARecord:
    """The A/A control: the baseline against its own twin."""
    rounds: int
    ratio: float
    ci: tuple[float, float]
    spread_pct: float

    @classmethod
    def of(cls, d: dict | None) -> AARecord | None:
        if not d:
            return None
        return cls(rounds=d["rounds"], ratio=d["ratio"], ci=(d["ci"][0], d["ci"][1]), spread_pct=d["spread_pct"])


@dataclass(frozen=True, kw_only=True)
class NoiseRecord:
    """How noisy the host was: the A/A interval, whether it was too busy to judge, its load."""
    aa: AARecord | None = None
    too_busy: bool = False
    load_1min: float | None = None
    cores: int | None = None
    note: str | None = None

    @classmethod
    def of(cls, d: dict | None) -> NoiseRecord | None:
        if d is None:
            return None
        return cls(aa=AARecord.of(d.get("aa")), too_busy=bool(d.get("too_busy")), load_1min=d.get("load_1min"),
                   cores=d.get("cores"), note=d.get("note"))


@dataclass(frozen=True, kw_only=True)
class TuneRow:
    """One candidate of a tune run, as measured and judged."""
    name: str
    label: str
    baseline: bool
    status: str
    reason: str
    ran: str
    safety: str
    safe: bool | None
    step_ms: float | None
    speedup: float | None
    speedup_ci: tuple[float | None, float | None] | None
    warmup_first_step_ms: float | None
    loss_delta_pct: float | None
    loss_delta_nats: float | None
    losses: tuple[float, ...]
    emulated: bool = False
    tflops: float | None = None
    mfu: float | None = None
    fp8_layers: tuple[dict, ...] = ()
    """The per-layer FP8 filter's decisions (fqn, shape, tokens, bf16_ms, fp8_ms, reason), if it ran."""

    @classmethod
    def of(cls, r: dict) -> TuneRow:
        ci = r["speedup_ci"]
        return cls(name=r["name"], label=r["label"], baseline=r["baseline"], status=r["status"], reason=r["reason"],
                   ran=r["ran"], safety=r["safety"], safe=r["safe"], step_ms=r["step_ms"], speedup=r["speedup"],
                   speedup_ci=None if ci is None else (ci[0], ci[1]), losses=tuple(r["losses"]),
                   warmup_first_step_ms=r["warmup_first_step_ms"], loss_delta_pct=r["loss_delta_pct"],
                   loss_delta_nats=r["loss_delta_nats"], emulated=bool(r.get("emulated")), tflops=r.get("tflops"),
                   mfu=r.get("mfu"), fp8_layers=tuple(((r.get("fp8_filter") or {}).get("layers")) or ()))

    @property
    def speedup_text(self) -> str:
        if self.emulated:
            return "emulated: no speedup"
        if self.speedup is None:
            return "-"
        if self.speedup_ci is None:
            return f"{self.speedup:.2f}x"
        lo, hi = self.speedup_ci
        return f"{self.speedup:.2f}x [{lo:.2f}-{hi:.2f}]"


@dataclass(frozen=True, kw_only=True)
class TuneRecord:
    """A tune run (`overdrive.tune/1`): the winner, every candidate, and how it was measured."""
    best: str
    summary: str
    workload: str | None
    device: str | None
    """The GPU's name, else the CPU's."""
    created: str
    budget_s: float
    elapsed_s: float
    rounds: int
    tolerance: str
    baseline: str
    rows: tuple[TuneRow, ...]
    noise: NoiseRecord | None = None
    threads: int | None = None
    threads_source: str | None = None
    memory_limit: str | None = None
    cache_note: str | None = None
    cached_at: str | None = None
    doc: dict = field(default_factory=dict, repr=False, compare=False)
    """The document as read (for the few lines written by the measuring side, e.g. `tune.flops.flops_line`)."""

    @classmethod
    def of(cls, d: dict) -> TuneRecord:
        """From a checked tune document (`results.load_tune`) or `TuneResult.to_dict()`."""
        t = d.get("threads") or {}
        return cls(best=d["best"], summary=d["summary"], workload=d["workload"], device=d.get("gpu") or d.get("cpu"),
                   created=d["created"], budget_s=d["budget_s"], elapsed_s=d["elapsed_s"], rounds=d["rounds"],
                   tolerance=d["tolerance"], baseline=d["baseline"], rows=tuple(TuneRow.of(r) for r in d["candidates"]),
                   noise=NoiseRecord.of(d.get("noise")), threads=t.get("threads"), threads_source=t.get("source"),
                   memory_limit=d.get("memory_limit"), cache_note=d.get("cache_note"), cached_at=d.get("cached_at"),
                   doc=d)

    @property
    def answered(self) -> bool:
        """False when the host was too busy to judge and nothing won: no verdict, never drawn as one."""
        return not (self.noise is not None and self.noise.too_busy and not self.summary.startswith("Winner"))


@dataclass(frozen=True, kw_only=True)
class Recommendation:
    """The bench's verdict: the recommended configuration (None: nothing measurably faster) and why."""
    text: str = "-"
    name: str | None = None
    too_busy: bool = False
    """The host was too busy to tell the configurations apart: no verdict at all."""

    @classmethod
    def of(cls, d: dict | None) -> Recommendation:
        d = d or {}
        return cls(text=d.get("text", "-"), name=d.get("name"), too_busy=bool(d.get("too_busy")))

    @property
    def verdict(self) -> str:
        """The text without its trailing "Apply: ..." (the next step says that, once)."""
        return self.text.split(". Apply: ")[0]

    @property
    def answered(self) -> bool:
        """False for "too busy to judge" and "nothing completed": never drawn in the green of a result."""
        return not self.too_busy and not self.text.startswith("no configuration completed")


@dataclass(frozen=True, kw_only=True)
class ConfigRecord:
    """One configuration of a bench run; `models` are its per-model rows as written (their fields are
    the workload's: `Workload.quality_cell` reads them)."""
    name: str
    label: str
    status: str
    reason: str | None
    precision: str
    emulated: bool
    baseline: bool
    safe: bool | None
    also: tuple[str, ...]
    """The labels of the candidates that resolved to the same thing here."""
    models: dict
    speedup: float | None = None
    peak_mb: float | None = None
    memory_saved_pct: float | None = None
    unsafe_reason: str | None = None
    not_assessed_reason: str | None = None
    fp8_scaling: str | None = None
    stopped_at: str | None = None
    """Where a stopped configuration was stopped: "warm-up" (never timed), "rounds", or None (older files)."""
    doc: dict = field(default_factory=dict, repr=False, compare=False)
    """The configuration as written (what a workload's apply hint reads: recipe, options)."""

    FAILED = ("failed", "oom", "crashed", "unavailable")

    @classmethod
    def of(cls, c: dict) -> ConfigRecord:
        return cls(name=c["name"], label=c.get("label") or c["name"], status=c["status"], reason=c["reason"],
                   precision=c["precision"], emulated=c["emulated"], baseline=bool(c.get("baseline")), safe=c["safe"],
                   also=tuple(a.get("label", a.get("name")) for a in c.get("also") or []), models=c["models"],
                   speedup=c.get("speedup"), peak_mb=c.get("peak_mb"), memory_saved_pct=c.get("memory_saved_pct"),
                   unsafe_reason=c.get("unsafe_reason"), not_assessed_reason=c.get("not_assessed_reason"),
                   fp8_scaling=(c.get("resolved") or {}).get("fp8_scaling"), stopped_at=c.get("stopped_at"), doc=c)

    @property
    def failed(self) -> bool:
        return self.status in self.FAILED

    @property
    def stopped_words(self) -> str:
        """What a stopped configuration's speed cell says: "stopped after warm-up" (never timed), or
        "stopped early" (after some timed rounds)."""
        if self.stopped_at != "warm-up":
            return "stopped early"
        x = self.doc.get("warmup_slowdown")
        return f"{WARMUP_STOP_LABEL} ({x:.0f}x slower)" if isinstance(x, (int, float)) else WARMUP_STOP_LABEL


@dataclass(frozen=True, kw_only=True)
class BenchRecord:
    """A bench run (`overdrive.bench/1`) as the report reads it."""
    device: str
    created: str | None
    git_commit: str | None
    torch: str | None
    suite: dict
    roles: tuple[str, ...]
    configs: tuple[ConfigRecord, ...]
    recommendation: Recommendation
    noise: NoiseRecord | None
    threads: dict | None
    micro: tuple[dict, ...]
    env_verdict: tuple[str, ...]
    best_precision: str | None
    best_precision_why: str
    doc: dict = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def of(cls, d: dict) -> BenchRecord:
        """From a document the bench wrote (or `results.load_bench` read back: fields newer than the
        file get their defaults here)."""
        sched, env = d.get("schedule") or {}, d.get("env") or {}
        bp = env.get("best_precision") or {}
        return cls(device=d["device"], created=d.get("created"), git_commit=d.get("git_commit"),
                   torch=(d.get("versions") or {}).get("torch"), suite=d["suite"],
                   roles=tuple(d["suite"].get("roles") or ("teacher", "student")),
                   configs=tuple(ConfigRecord.of(c) for c in d["configs"]),
                   recommendation=Recommendation.of(d["recommendation"]), noise=NoiseRecord.of(sched.get("noise")),
                   threads=sched.get("threads"), micro=tuple(d.get("micro") or ()),
                   env_verdict=tuple(env.get("verdict") or ()), best_precision=bp.get("precision"),
                   best_precision_why=bp.get("reason", ""), doc=d)

    def role_order(self, cfg: ConfigRecord) -> list[str]:
        """The run's model order (teacher before student), whatever order the JSON keys came back in."""
        return [r for r in self.roles if r in cfg.models] + [r for r in cfg.models if r not in self.roles]

    @property
    def winner(self) -> ConfigRecord | None:
        """The recommended configuration; the baseline when nothing was measurably faster but the
        baseline ran; None when nothing completed."""
        name = self.recommendation.name
        if name is None:
            return next((c for c in self.configs if c.baseline and c.status == "ok"), None)
        return next((c for c in self.configs if c.name == name), None)
