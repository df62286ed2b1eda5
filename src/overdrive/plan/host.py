"""The host-bound floor of an eager micro-batch: the GPU cannot run an op before Python has dispatched it.

Eager PyTorch (--no-compile on --stack pytorch) sends every ATen op through Python, the dispatcher and autograd
and then launches its kernel; that costs the host microseconds per op whatever the tensors' size. The host runs
ahead of the GPU while the GEMMs are long, so the cost hides, until a micro-batch's GPU work is shorter than its
dispatch: short sequences, LoRA (twice the ops, a third less GPU work), small models. Then the micro-batch takes
the host's time:

  t_mb = max(GPU time of the micro-batch, (blocks on this GPU × ops per block + ops outside the blocks) × µs per op)

The op counts are measured, not fitted: scripts/measure_host_ops.py counts the ops one forward + loss + backward
dispatches with Hugging Face transformers' Llama block, per block and outside them, with and without PEFT's LoRA
on every linear, with and without HF's gradient checkpointing, under torch.autocast or with the model in bf16
(benchmarks/results/cpu/2026-12-07-host-ops/host-ops.json). Autocast's casts are counted where the planner's
setup runs it: the model in fp32 masters without a sharded wrapper (`--sharding none`: DDP or one GPU under the
HF Trainer, Lightning or plain AMP); DeepSpeed and FSDP cast the parameters once per gather instead. An FP8 format's linears
cast their own inputs and weights in every call: counted as autocast's casts, fewer than they dispatch. Other
block code dispatches about as many ops per block (torchtune's and torchtitan's eager blocks are written the same
way); fused kernels (--fused-kernels: Liger, flash-attn's rotary, Triton norms) dispatch fewer, and their count
is not measured, so they are planned at the unfused block's.

DeepSpeed ZeRO-3 (--sharding zero3) hooks every submodule: the fetch and release of its parameters around each
forward and backward, each trained parameter's gradient into the reduce bucket, every micro-batch. That is Python
per module, timed by scripts/measure_zero3_host.py as the difference between the same Hugging Face Llama plain
and under deepspeed.initialize (benchmarks/results/cpu/2026-12-07-zero3-host/zero3-host.json): per block, in ops'
worth (its time over the same run's time per op), 539 plain and 612 checkpointed; with LoRA on every linear,
whose adapters are modules of their own (83 modules a block, not 13), 1,416 and 1,824. One rank over gloo: the
collectives, CUDA's events and stream waits are not in it, nor the hooks outside the blocks. Not counted:
FSDP's per-block hooks (one a block, not thirteen), DTensor's tensor-parallel dispatch.

nanotron's ZeRO-1 (--zero-sliced) slices every tensor over the data-parallel ranks and moves the slices in Python:
after the step its all-gather builds and flattens dp·T pieces (T tensors on this GPU) before the call and unflattens
and copies them back after it; after every backward its fp32 accumulator adds each gradient in, tensor by tensor.
scripts/measure_zero_sliced_host.py runs those loops op for op from nanotron's source, the collective stood in by what
ProcessGroupNCCL does around it (benchmarks/results/cpu/2026-12-07-zero-sliced-host/zero-sliced-host.json): 0.41 ops'
worth per rank and tensor before the call and 0.56 after it (through the origin over dp 8-128 and 16-200 tensors,
residuals -6% to +11%), 0.91 per tensor accumulating. The after-step loops run while the GPU all-reduces the
gradients and gathers the weights (nothing makes the host wait): the longer of the two is exposed (estimate.py); the
accumulation joins each micro-batch's host work.

The time per op is a GPU host's: stas00/ml-engineering publishes Hugging Face's Llama 3.2 1B stepping eager on
one B200 (torch 2.13.0+cu130, batch 1 x 512, bf16, checkpointed): 48.8 ms, where the step compiled and replayed as
CUDA graphs takes 8.1 ms, a lower bound on the eager step's GPU work, so the host bounds it (its one sync a forward
adds the last step's GPU tail: slightly high). scripts/host_us_published.py counts the ops that step dispatches
with today's transformers (5,685; the source names no version) and divides: 8.6 µs an op (its forward under
no_grad, without autograd's bookkeeping: 6.3; benchmarks/results/cpu/2026-12-07-host-us-published/host-us.json).
On this project's CPU host the same op costs 3.6 µs (measure_host_ops.py: no kernel launch, no caching allocator);
that is the clock the ops'-worth figures above were timed on, and a GPU host is assumed to pay them the same
multiple of its op, not measured. One host, one PyTorch set the figure; others differ either way (Qwen's 2023
A100 rows imply 6-7 µs with LoRA at 256 tokens and 12-18 under ZeRO-3: validation.implied_host_us), gpu_check.sh
times the GPU's host, and --host-us (TrainSetup.host_us) plans a host's own figure.
Compiled code (torch.compile) and the megatron stack (Transformer Engine's fused modules) dispatch a few ops per
block; no floor is planned for them, but for ZeRO-3's hooks.
"""

from __future__ import annotations

from overdrive.plan.memory import recomputed_blocks
from overdrive.plan.pipeline import stage_imbalance, zero_sliced_tensors
from overdrive.plan.setup import TrainSetup
from overdrive.plan.specs import ModelSpec

__all__ = ["HOST_US_PER_OP", "HOST_US_PER_OP_CPU", "OPS_PER_BLOCK", "OPS_OUTSIDE_BLOCKS", "ZERO3_OPS_PER_BLOCK",
           "eager_ops", "zero3_ops", "host_time", "host_note", "ZERO_SLICED_PRE", "ZERO_SLICED_POST",
           "ZERO_SLICED_ACCUMULATE", "zero_sliced_ops", "accumulate_ops", "host_us", "host_us_source"]

# scripts/measure_host_ops.py, 2026-12-07, torch 2.13.0 (CPU), transformers 5.25.0, peft 0.22.0:
# benchmarks/results/cpu/2026-12-07-host-ops/host-ops.json. Keys: (LoRA, checkpointed, autocast).
OPS_PER_BLOCK = {
    (False, False, False): 227, (False, False, True): 253, (False, True, False): 350, (False, True, True): 386,
    (True, False, False): 464, (True, False, True): 494, (True, True, False): 716, (True, True, True): 766,
}
OPS_OUTSIDE_BLOCKS = 80   # embedding, final norm, head and loss, forward and backward (72-86 measured; LoRA 8-76)
# the same run's fastest of 200 micro-steps over their ops (4 checkpointed blocks, fp32), 2-core AMD EPYC, load 0.2:
# the clock the ops'-worth figures below are in
HOST_US_PER_OP_CPU = 3.6
# a GPU host's: scripts/host_us_published.py, a published B200 eager step / its 5,685 ops
# (benchmarks/results/cpu/2026-12-07-host-us-published/host-us.json)
HOST_US_PER_OP = 8.6
# scripts/measure_zero3_host.py, 2026-12-07, deepspeed 0.19.8, torch 2.13.0 (CPU), transformers 5.25.0, peft 0.22.0:
# benchmarks/results/cpu/2026-12-07-zero3-host/zero3-host.json, ops' worth per block. Keys: (LoRA, checkpointed).
ZERO3_OPS_PER_BLOCK = {(False, False): 539, (False, True): 612, (True, False): 1416, (True, True): 1824}
# scripts/measure_zero_sliced_host.py, 2026-12-07, torch 2.13.0 (CPU), nanotron @ c252843's loops:
# benchmarks/results/cpu/2026-12-07-zero-sliced-host/zero-sliced-host.json, ops' worth per rank and tensor before and
# after the all-gather's call, and per tensor of the fp32 accumulation after each backward
ZERO_SLICED_PRE = 0.41
ZERO_SLICED_POST = 0.56
ZERO_SLICED_ACCUMULATE = 0.91


def host_us(s: TrainSetup) -> float:
    """µs per eager op on this plan's host: --host-us, else `HOST_US_PER_OP` (a published B200 host's)."""
    return s.host_us or HOST_US_PER_OP


def host_us_source(s: TrainSetup) -> str:
    return "--host-us" if s.host_us else "a B200 host's eager step"


def _checkpointed_share(m: ModelSpec, s: TrainSetup) -> float:
    """Share of this GPU's blocks whose forward runs twice (the memory model's choice of blocks)."""
    L = m.n_layer / s.pp
    if s.recompute_layers:
        return recomputed_blocks(m, s) / L
    # selective-op reruns every other matmul and the memory-bound forward: about half a forward's ops
    return {"full": 1.0, "selective": (L // 2) / L if L >= 2 else 0.0, "selective-op": 0.5}.get(s.checkpointing, 0.0)


def _casts(s: TrainSetup) -> bool:
    """Per-op casts: autocast's (bf16/fp16 over fp32 masters, no sharded wrapper), or a low-precision format's
    own (torchao's float8 linears cast their input and weight in every call: at least autocast's count)."""
    if s.precision in ("bf16", "fp16"):
        return s.master_weights == "fp32" and s.sharding == "none"
    return s.precision != "fp32"


def eager_ops(m: ModelSpec, s: TrainSetup) -> float:
    """ATen ops one micro-batch dispatches on the busiest pipeline rank (its blocks, as `stage_imbalance` counts
    them, and the head's and the loss's, which the last rank holds)."""
    lora, cast = s.lora_rank > 0, _casts(s)
    f = _checkpointed_share(m, s)
    per_block = (1 - f) * OPS_PER_BLOCK[(lora, False, cast)] + f * OPS_PER_BLOCK[(lora, True, cast)]
    return m.n_layer / s.pp * stage_imbalance(m, s) * per_block + OPS_OUTSIDE_BLOCKS


def zero3_ops(m: ModelSpec, s: TrainSetup) -> float:
    """DeepSpeed ZeRO-3's hooks on the busiest rank's blocks, in ops' worth per micro-batch (0 without ZeRO-3)."""
    if s.sharding != "zero3":
        return 0.0
    # selective-op reruns every block's forward (saving some ops' outputs): every module's hooks fire again
    lora, f = s.lora_rank > 0, 1.0 if s.checkpointing == "selective-op" else _checkpointed_share(m, s)
    per_block = (1 - f) * ZERO3_OPS_PER_BLOCK[(lora, False)] + f * ZERO3_OPS_PER_BLOCK[(lora, True)]
    return m.n_layer / s.pp * stage_imbalance(m, s) * per_block


def zero_sliced_ops(s: TrainSetup, tensors: int) -> tuple[float, float]:
    """(ops' worth before the after-step all-gather's call, after it) of nanotron's sliced ZeRO-1 for `tensors`
    parameter tensors on this GPU; (0, 0) without --zero-sliced or with one rank (nothing to gather)."""
    n = s.shards
    if not s.zero_sliced or n <= 1:
        return 0.0, 0.0
    return ZERO_SLICED_PRE * n * tensors, ZERO_SLICED_POST * n * tensors


def accumulate_ops(m: ModelSpec, s: TrainSetup) -> float:
    """nanotron's fp32 accumulation after each backward (--zero-sliced), ops' worth per micro-batch: one per tensor."""
    if not s.zero_sliced:
        return 0.0
    return ZERO_SLICED_ACCUMULATE * len(zero_sliced_tensors(m, s))


def host_time(m: ModelSpec, s: TrainSetup) -> float:
    """Seconds the host needs to dispatch one micro-batch; 0 where no floor is planned (compiled code without
    ZeRO-3, megatron). DeepSpeed runs its hooks eagerly around a compiled module (`compiler.disable`)."""
    if s.stack != "pytorch":
        return 0.0
    return ((0.0 if s.compile else eager_ops(m, s)) + zero3_ops(m, s) + accumulate_ops(m, s)) * host_us(s) * 1e-6


def host_note(m: ModelSpec, s: TrainSetup, host: float, gpu: float) -> str:
    """The plan's note when the host's `host` seconds per micro-batch exceed its `gpu` seconds of GPU work."""
    z3, eager = zero3_ops(m, s), 0.0 if s.compile else eager_ops(m, s)
    parts = ([f"eager PyTorch dispatches about {eager:,.0f} ops"] if eager else []) + (
        [f"DeepSpeed ZeRO-3's module hooks cost about {z3:,.0f} ops' worth"] if z3 else [])
    fused = " (counted unfused: --fused-kernels dispatch fewer)" if s.fused_kernels and eager else ""
    fix = "more tokens per micro-batch amortise it" + ("" if s.compile else ", torch.compile the eager ops") + (
        ", FSDP hooks a block where ZeRO-3 hooks each module" if z3 else "")
    return (f"host-bound: {' and '.join(parts)} per micro-batch{fused}, at least {host * 1e3:.1f} ms on the host "
            f"({host_us(s):g} µs per op, {host_us_source(s)}) vs {gpu * 1e3:.1f} ms of GPU work: the GPU waits "
            f"({fix})")
