"""Benchmark suites: sizes and candidates per device.

Candidates (the measurement core's `Candidate`) are recipe names from the one registry
(`overdrive.recipes.PRESETS` and its "+knob" grammar), so every name the bench prints is one
`accelerate(recipe=...)` and `train.recipe` accept.
Sizes follow the device: the CPU default finishes in about 3 minutes on 2 cores, `--quick` in
about a minute; the GPU suite (H100/H200) in about 6 minutes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from overdrive.measure.candidate import Candidate

__all__ = ["Candidate", "Suite", "SUITES", "candidates_from_names"]


@dataclass(frozen=True, kw_only=True)
class Suite:
    name: str
    teacher: str
    """Reference GPT size of the teacher (overdrive.models.GPT_SIZES)."""
    student: str
    batch: int
    seq: int
    warmup: int
    """Untimed steps first (compile happens here; its time is reported apart). The first is taken by every
    worker at once, the rest in interleaved rounds, one worker at a time: a contender far slower than the
    baseline in 2 of them or more is stopped there (`overdrive.measure.session.warmup_stop`)."""
    rounds: int
    """Interleaved rounds; each runs `steps_per_round` steps of every live configuration."""
    steps_per_round: int
    budget_s: float
    """Wall-clock budget for the timed rounds; fewer rounds (never under `min_rounds`) run past it."""
    parity_steps: int
    """Training steps every configuration completes before its quality is judged (loss curve, or
    held-out AUC), whatever the time budget: the safety verdict must not depend on the host's load."""
    max_rounds: int = 0
    """Adaptive rounds: past `rounds` (and past `budget_s`) the timed rounds go on, at the fixed looks of
    `overdrive.measure.stats.look_rounds`, up to this many while the A/A floor is too wide to judge or a
    verdict is not yet settled (0: `rounds`, no adaptation)."""
    max_budget_s: float = 0.0
    """The wall-time cap of adaptive rounds (0: `budget_s`): never measured on past it."""
    min_rounds: int = 3
    """A budget never cuts the timed rounds below this: a verdict and an early stop need rounds at
    3 different moments (`overdrive.measure.MIN_EVIDENCE_ROUNDS`)."""
    slow_factor: float = 3.0
    """Stop measuring a configuration once its whole speedup interval (timed rounds, never warm-up)
    says it is more than this many times slower than the baseline."""
    data_tokens: int = 1 << 19
    micro: str = "cpu"
    """Micro-benchmark sizes: "cpu", "gpu" or "none"."""
    lr: float = 1e-3
    candidates: tuple[Candidate, ...] = field(default_factory=tuple)
    task: str = "gpt"
    """The workload (a key of overdrive.bench.workloads.WORKLOADS)."""
    roles: tuple[str, ...] = ("teacher", "student")
    options: dict = field(default_factory=dict)
    """Task-specific sizes (recsys: rows scale, examples, ...)."""
    any_recipe: bool = True
    """`--configs` may name any registered recipe (a GPT suite), not only the suite's own candidates
    (a click-model suite, whose candidates are its own embedding x optimizer configurations)."""

    def with_candidates(self, cands: tuple[Candidate, ...]) -> "Suite":
        return dataclasses.replace(self, candidates=cands)


def _cands(*names: str) -> tuple[Candidate, ...]:
    return (Candidate.preset("baseline", baseline=True),) + tuple(Candidate.preset(n) for n in names)


SUITES: dict[str, Suite] = {
    "cpu-quick": Suite(name="cpu-quick", teacher="cpu-teacher", student="cpu-student", batch=8, seq=64, warmup=3,
                       rounds=8, steps_per_round=2, budget_s=30, parity_steps=24, micro="cpu-quick", min_rounds=4,
                       max_rounds=24, max_budget_s=120,
                       candidates=_cands("fp32-fused", "amp-bf16", "amp-fp16", "fp8")),
    "cpu": Suite(name="cpu", teacher="cpu-teacher", student="cpu-student", batch=8, seq=128, warmup=3, rounds=8,
                 steps_per_round=4, budget_s=90, parity_steps=40, micro="cpu", max_rounds=24, max_budget_s=240,
                 candidates=_cands("fp32-fused", "amp-bf16", "amp-fp16", "fp8", "fp32-fused+compile")),
    # H100/H200: ~0.4B teacher and 0.15B student (32K vocab, seq 2048). Every configuration
    # lives in its own process at once (that is what interleaving needs): 5 x ~18 GB fits 141 GB.
    # FP8 only with compile: torchao's FP8 needs it to be fast (pytorch/torchtitan docs/float8.md:
    # compile is "required for competitive performance"), and each compile costs a minute of
    # warm-up in a 6-minute budget.
    "gpu": Suite(name="gpu", teacher="gpt-350m", student="gpt-125m", batch=4, seq=2048, warmup=3, rounds=6,
                 steps_per_round=5, budget_s=90, parity_steps=30, slow_factor=4.0, data_tokens=1 << 22, micro="gpu",
                 lr=3e-4, candidates=_cands("fp32-fused", "amp-bf16", "amp-bf16+compile", "fp8+compile")),
}


def candidates_from_names(suite: Suite, names: list[str]) -> tuple[Candidate, ...]:
    """The baseline plus the named candidates: a suite's own names, or (`Suite.any_recipe`) any registered
    recipe name, e.g. fp8-rowwise or bf16+compile. ValueError names the bad one and the choices."""
    known = {c.name: c for c in suite.candidates}
    out = [c for c in suite.candidates if c.baseline]
    for n in names:
        if n in known:
            c = known[n]
        elif suite.any_recipe:
            try:
                c = Candidate.preset(n)
            except ValueError as e:
                raise ValueError(f"--configs {n}: {e}") from None
            c = known.get(c.name, c)
        else:
            raise ValueError(f"unknown config '{n}' in suite {suite.name}: choose from {', '.join(known)}")
        if all(c.name != o.name for o in out):
            out.append(c)
    return tuple(out)
