"""Benchmark suites: sizes and candidates per device.

Sizes follow the device: the CPU default finishes in about 3 minutes on 2 cores, `--quick`
in under a minute; the GPU suite (H100/H200) in about 6 minutes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from overdrive.recipes import Recipe

__all__ = ["Candidate", "Suite", "SUITES", "get_suite", "default_suite_name"]


@dataclass(frozen=True, kw_only=True)
class Candidate:
    name: str
    recipe: Recipe
    description: str
    baseline: bool = False
    lr_scale: float = 1.0
    """Multiplies the learning rate (tests use it to inject a diverging recipe)."""
    fail_at_step: int | None = None
    """Raise inside the worker at this step (tests use it to inject a backend failure)."""
    alloc_mb: int = 0
    """Allocate and free this much at setup (tests use it to show each process reports its own peak)."""
    options: dict = field(default_factory=dict)
    """Task-specific settings (recsys: embedding, optimizer, amp)."""

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["recipe"] = self.recipe.to_dict()
        return d


BASELINE = Candidate(name="baseline", baseline=True,
                     recipe=Recipe(name="baseline", precision="fp32", optimizer="for-loop", norm="torch"),
                     description="plain PyTorch: fp32, eager, AdamW for-loop, torch norms")
FUSED = Candidate(name="fp32-fused", recipe=Recipe(name="fp32-fused", precision="fp32"),
                  description="fp32 with the best AdamW and norms that work here")
BF16 = Candidate(name="amp-bf16", recipe=Recipe(name="amp-bf16", precision="bf16"),
                 description="bf16 autocast + best AdamW/norms")
FP16 = Candidate(name="amp-fp16", recipe=Recipe(name="amp-fp16", precision="fp16"),
                 description="fp16 autocast + GradScaler + best AdamW/norms")
FP8 = Candidate(name="fp8", recipe=Recipe(name="fp8", precision="fp8"),
                description="FP8 linears (TE or torchao; emulated without FP8 hardware)")


@dataclass(frozen=True, kw_only=True)
class Suite:
    name: str
    teacher: str
    """Reference GPT size of the teacher (overdrive.models.GPT_SIZES)."""
    student: str
    batch: int
    seq: int
    warmup: int
    """Untimed steps first (compile happens here; its time is reported apart)."""
    rounds: int
    """Interleaved rounds; each runs `steps_per_round` steps of every live configuration."""
    steps_per_round: int
    budget_s: float
    """Wall-clock budget for the timed rounds; fewer rounds run if the estimate exceeds it."""
    slow_factor: float = 3.0
    """A configuration this many times slower than the baseline after warm-up stops early."""
    data_tokens: int = 1 << 19
    micro: str = "cpu"
    """Micro-benchmark sizes: "cpu", "gpu" or "none"."""
    lr: float = 1e-3
    candidates: tuple[Candidate, ...] = field(default_factory=tuple)
    task: str = "gpt"
    """gpt (teacher + distilled student) or recsys (one click model)."""
    roles: tuple[str, ...] = ("teacher", "student")
    options: dict = field(default_factory=dict)
    """Task-specific sizes (recsys: rows scale, examples, ...)."""

    def with_candidates(self, cands: tuple[Candidate, ...]) -> "Suite":
        return dataclasses.replace(self, candidates=cands)


_compile = lambda base, name: Candidate(  # noqa: E731
    name=name, recipe=base.recipe.replace(name=name, compile="default"),
    description=base.description + " + torch.compile")

SUITES: dict[str, Suite] = {
    "cpu-quick": Suite(name="cpu-quick", teacher="cpu-teacher", student="cpu-student", batch=8, seq=64, warmup=2,
                       rounds=4, steps_per_round=3, budget_s=25, micro="cpu-quick",
                       candidates=(BASELINE, FUSED, BF16, FP16, FP8)),
    "cpu": Suite(name="cpu", teacher="cpu-teacher", student="cpu-student", batch=8, seq=128, warmup=3, rounds=8,
                 steps_per_round=4, budget_s=90, micro="cpu",
                 candidates=(BASELINE, FUSED, BF16, FP16, FP8, _compile(FUSED, "fp32-fused+compile"))),
    # H100/H200: ~0.4B teacher and 0.15B student (32K vocab, seq 2048). Every configuration
    # lives in its own process at once (that is what interleaving needs): 5 x ~18 GB fits 141 GB.
    # FP8 only with compile: torchao's FP8 needs it to be fast (pytorch/torchtitan docs/float8.md:
    # compile is "required for competitive performance"), and each compile costs a minute of
    # warm-up in a 6-minute budget.
    "gpu": Suite(name="gpu", teacher="gpt-350m", student="gpt-125m", batch=4, seq=2048, warmup=3, rounds=6,
                 steps_per_round=5, budget_s=90, slow_factor=4.0, data_tokens=1 << 22, micro="gpu", lr=3e-4,
                 candidates=(BASELINE, FUSED, BF16, _compile(BF16, "amp-bf16+compile"),
                             _compile(FP8, "fp8+compile"))),
}


def default_suite_name(has_gpu: bool, quick: bool, workload: str = "transformer") -> str:
    if workload == "recsys":
        return "recsys-gpu" if has_gpu else ("recsys-quick" if quick else "recsys")
    if has_gpu:
        return "gpu"
    return "cpu-quick" if quick else "cpu"


def get_suite(name: str) -> Suite:
    from overdrive.recsys.bench import RECSYS_SUITES  # the recsys workload registers its suites

    suites = {**SUITES, **RECSYS_SUITES}
    if name not in suites:
        raise ValueError(f"unknown suite '{name}': suites are {', '.join(suites)}")
    return suites[name]
