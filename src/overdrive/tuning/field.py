"""Which contenders `tune` warms up: the budget goes to timed rounds, not to warm-ups.

A warm-up costs a set-up, a first step (compilation, allocator growth) and a few untimed steps,
and on a busy host it is the same price as the rounds that decide. Beside two CPU hogs, 13
contenders' warm-ups took ~65% of a 150 s budget and left 4 rounds (a 3-layer d=512 model on a
2-core AVX2 host: bf16 and fp16 alone took 70 s to be stopped for slowness). So, before anything
is set up:

1. The doctor's measured priors prune what cannot win here (`prior`, `prune`): on a CPU, an
   autocast precision whose matmul the doctor measured `PRUNE_FACTOR`x or more slower than fp32
   (bf16 1.3 vs fp32 93 GFLOP/s on an AVX2 core), and fp16 where the CPU lists no fp16 units
   (AVX512-FP16, AMX-FP16: measured 12-70x slower on the AVX2 and AVX512-BF16 kinds). Each pruned
   contender keeps a row with that evidence. A name the user asked for is never pruned.
2. Successive halving before the knobs (`halve`): the knobs (optimizer, compile) are expanded only
   on the faster half of the precisions that warmed up, and only within 2x of the fastest.
3. The knobs are set up only while the budget left after their warm-ups still holds `ROUNDS_KEPT`
   timed rounds of the whole field (`fit_knobs`: the warm-ups' cost is predicted from the presets'
   measured ones): the rest get a row that says so.
4. Emulated formats (a safety check, never a speedup) are set up only when the warm-up share of
   the budget still holds their predicted cost (`fit_emulated`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from overdrive.env import EnvReport
from overdrive.measure.candidate import Candidate

__all__ = ["Prior", "PRUNE_FACTOR", "prior", "prune", "halve", "fit_knobs", "fit_emulated", "EMULATED_COST",
           "ROUNDS_KEPT"]

PRUNE_FACTOR = 3.0
"""A contender whose prior says its matmuls run this many times slower than fp32 is not warmed up
(tune's slow-stop factor: what the timed rounds would stop it for)."""
ROUNDS_KEPT = 8
"""The knobs are warmed up only while the budget left still holds this many timed rounds of the whole
field (the second look: `measure.stats.look_rounds`), so the rounds, not the warm-ups, get the budget."""
EMULATED_COST = 4.0
"""Predicted step time of an emulated low-precision format, in baseline steps (torchao's emulation
quantizes every GEMM's operands in software: 3-5x the fp32 step was seen on CPU)."""


@dataclass(frozen=True)
class Prior:
    """What the doctor's measurements predict for a contender's speed here, before any step."""

    slower: float | None
    """Its matmuls' time over fp32's, as measured (None: no measurement)."""
    prune: bool
    """Not worth a warm-up: it cannot be the fastest here."""
    evidence: str
    """The measurement or the listed units this rests on, in words ('' when there is none)."""


_NONE = Prior(slower=None, prune=False, evidence="")


def prior(c: Candidate, env: EnvReport) -> Prior:
    """The prior for `c` on this machine: only CPU autocast precisions have one (a GPU's tensor
    cores are judged by resolve; FP8 and emulation by their own checks)."""
    r = c.resolved
    if r is None or env.gpus or r.emulated or r.autocast_dtype not in ("bfloat16", "float16"):
        return _NONE
    cpu = env.platform.get("cpu") or {}
    rates, flags = cpu.get("matmul_gflops") or {}, cpu.get("flags") or {}
    key = "bf16" if r.autocast_dtype == "bfloat16" else "fp16"
    fp32, mine = rates.get("fp32"), rates.get(key)
    if fp32 and mine:
        k = fp32 / mine
        return Prior(slower=k, prune=k >= PRUNE_FACTOR,
                     evidence=f"the doctor measured {key} matmul {mine:.3g} vs fp32 {fp32:.3g} GFLOP/s on one core "
                              f"here ({k:.1f}x {'slower' if k >= 1 else 'faster'})")
    if key == "fp16" and flags and not (flags.get("avx512_fp16") or flags.get("amx_fp16")):
        return Prior(slower=None, prune=True,
                     evidence="this CPU lists no fp16 units (AVX512-FP16, AMX-FP16): fp16 matmuls run in slow code "
                              "here (12-70x slower than fp32 on the CPUs measured)")
    return _NONE


def prune(cands: list[Candidate], env: EnvReport) -> tuple[list[Candidate], list[tuple[Candidate, str]]]:
    """(the contenders to warm up, [(pruned contender, why)]). The baseline is never pruned."""
    kept, pruned = [], []
    for c in cands:
        p = prior(c, env)
        if p.prune and not c.baseline:
            pruned.append((c, f"not warmed up: {p.evidence}; it cannot be the fastest here (prior from `overdrive "
                              "doctor`; name it in --configs to measure it anyway)"))
        else:
            kept.append(c)
    return kept, pruned


def halve(runs: list, *, within: float = 2.0) -> list:
    """Successive halving on the warm-ups: of the live, real (not emulated), non-baseline runs, the
    faster half by their warm-up steps (at least one), and only those within `within`x of the fastest.
    `runs`: anything with `cand`, `live` and `steady_ms()` (tune's `Run`)."""
    alive = [r for r in runs if r.live and not r.cand.baseline and not r.cand.emulated
             and r.steady_ms() is not None]
    alive.sort(key=lambda r: r.steady_ms())
    if not alive:
        return []
    best = alive[0].steady_ms()
    return [r for r in alive[:math.ceil(len(alive) / 2)] if r.steady_ms() <= within * best]


def fit_knobs(cands: list[Candidate], *, warm_s: float, step_ms: float | None, live: int, left_s: float,
              turn_s: float = 0.0, rounds: int = ROUNDS_KEPT) -> tuple[list[Candidate], list[tuple[Candidate, str]]]:
    """(the knobs to warm up, [(one left out, why)]): the first k (in the given order) such that after k
    warm-ups of `warm_s` each, `left_s` still holds `rounds` rounds of `live` + k contenders, each turn
    `turn_s` of steps of `step_ms` (at least one step, at most 8: tune's turns). `live`: the contenders
    already in the rounds, the A/A twin included."""
    ms = step_ms or 0.0
    step_s = ms / 1e3 * max(1, min(8, round(turn_s * 1e3 / ms))) if ms > 0 else 0.0
    k = len(cands)
    while k and left_s - k * warm_s < rounds * (live + k) * step_s:
        k -= 1
    if k == len(cands):
        return cands, []
    need = rounds * (live + k + 1) * step_s
    why = (f"not set up: its warm-up (~{warm_s:.0f} s, as the presets' took here) would leave less than {rounds} timed "
           f"rounds of the field ({need:.0f} s at {step_ms or 0:.0f} ms a step) in the {max(0.0, left_s):.0f} s left: "
           "the budget goes to the rounds that decide")
    return cands[:k], [(c, why) for c in cands[k:]]


def fit_emulated(cands: list[Candidate], *, base_setup_s: float | None, base_step_ms: float | None, steps: int,
                 left_s: float) -> tuple[list[Candidate], list[tuple[Candidate, str]]]:
    """(the emulated formats to set up, [(one left out, why)]): all of them when their safety checks
    fit in `left_s` of warm-up time, none otherwise. Predicted: their set-ups run concurrently (one
    baseline set-up), then `steps` steps each at `EMULATED_COST` baseline steps."""
    setup, n = base_setup_s or 0.0, len(cands)
    need = setup + n * steps * EMULATED_COST * (base_step_ms or 0.0) / 1e3
    if not cands or need <= left_s:
        return cands, []
    why = (f"not set up: its safety check would not fit the warm-up share of the budget ({need:.0f} s predicted "
           f"for {n} emulated formats x {steps} steps at ~{EMULATED_COST:g}x the baseline's {(base_step_ms or 0):.0f} ms, "
           f"after a {setup:.0f} s set-up, against {max(0.0, left_s):.0f} s left); emulated formats are never timed")
    return [], [(c, why) for c in cands]
