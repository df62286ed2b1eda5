"""What the engines keep on the GPU beyond the model's own count: Transformer Engine's cached FP8 weights, the
gathered GEMM inputs PyTorch's tensor parallelism saves, and NCCL's communicator buffers.

Megatron-Core's Transformer Engine layers pass `is_first_microbatch` to every TE module (`TELinear.forward`:
`None if self.disable_parameter_transpose_cache else self.is_first_microbatch`; the schedule sets it True on a
step's first micro-batch). With it TE caches each quantised weight under the key "weight"
(`TransformerEngineBaseModule.get_fp8_workspace(cache_name="weight")` stores the workspace in
`self._fp8_workspaces`, TE 1.x; TE 2.x keeps the quantizer's output the same way) and, while gradients are on,
its transpose for the backward's data-gradient GEMM (`with_transpose`/columnwise usage). The cache is allocated
once and kept across steps: bytes of the quantised weight, per copy, for every linear of the stage's blocks (the
output layer is Megatron's own ColumnParallelLinear, not a TE module, so not quantised). PyTorch stacks (torchao
Float8Linear, te.Linear without `is_first_microbatch`) cast every call and keep nothing between them. With
Megatron's --fp8-param-gather (`--fp8-all-gather` here) the parameter itself is the quantised tensor: its copies
take the place of the 16-bit weight, and nothing is cached beside them.

PyTorch's tensor parallelism (DTensor, torchtitan's plan: `PrepareModuleInput(input_layouts=Shard(1),
desired_input_layouts=Replicate())` ahead of `attention` and `feed_forward`) all-gathers the sequence-sharded norm
output before wq/wk/wv and w1/w3, and `F.linear` saves that whole tensor for its weight gradient: every TP rank
keeps those GEMM inputs for all the sequence. Megatron's sequence parallelism saves the shard and gathers again
in the backward (Korthikanti et al. 2022, §4.2.2; `--sequence-parallel regather`, what the megatron stack does).
With torchao's float8 tensor parallelism (tensorwise scaling: `Float8ColwiseParallel`, `PrepareFloat8ModuleInput`)
the input is cast before the gather, so the saved whole tensor is one byte an element.

NCCL allocates its connection buffers with cudaMalloc/cuMem, outside PyTorch's caching allocator: they are not in
`max_memory_allocated` or `max_memory_reserved`, but they are in nvidia-smi and they take room a run needs. One
communicator per process group (`collectives.communicator_bytes`): the default group every launcher's start-up
barrier uses, the data-parallel group the gradients go over (data × context ranks; under HSDP its shard group and
its replicate group), the tensor-parallel and the context-parallel group; a group as large as the world is the
default one. Pipeline send/receive buffers (4 MiB a peer and channel) are left out.
"""

from __future__ import annotations

from overdrive.formats import planned_format
from overdrive.plan.collectives import PCIE_GBS, communicator_bytes, group_layout
from overdrive.plan.pipeline import stage_blocks
from overdrive.plan.setup import TrainSetup
from overdrive.plan.specs import ModelSpec

__all__ = ["te_weight_cache_bytes", "weight_copies", "linear_params", "nccl_groups",
           "nccl_buffer_bytes", "GATHERED", "gathered_tp_bytes"]


def linear_params(m: ModelSpec) -> int:
    """Weights of one block's linears (Q, K, V, O and the MLP), norms and biases aside."""
    h = m.hidden
    return 2 * h * m.q_dim + 2 * h * m.kv_dim + (3 if m.gated_mlp else 2) * h * m.ffn


def weight_copies(s: TrainSetup) -> int:
    """Quantised copies of each weight TE keeps while training: the rowwise one for the forward and a columnwise one
    for the data gradient. Per-tensor FP8 on Blackwell needs no transpose (its tensor cores take the other layouts:
    TE's `is_non_tn_fp8_gemm_supported`); MXFP8, NVFP4 and row-wise FP8 scale along the reduction dimension, so the
    columnwise copy has scales of its own everywhere (one scale per tensor is the only kind a transpose shares)."""
    f = planned_format(s.precision)
    return 1 if (f.tensor_scale and s.gpu.sm[0] >= 10) else 2


def te_weight_cache_bytes(m: ModelSpec, s: TrainSetup, rank: int = 0) -> float:
    """Bytes of Transformer Engine's cached quantised weights on pipeline rank `rank` (module docstring); 0 where
    nothing caches them (not Megatron, not low precision). A LoRA's frozen base is cached too: its forward and
    the input gradient through it use the FP8 weight and transpose all the same."""
    if s.stack != "megatron" or not s.low_precision:
        return 0.0
    per_element = planned_format(s.precision).stored_bytes * weight_copies(s)   # `Format.stored_bytes`
    if s.fp8_all_gather:
        # --fp8-param-gather (NeMo's fp8_params, Megatron-Bridge's perf recipes): the weight itself is quantised, so
        # its copies replace the 16-bit compute weight the states count (2 bytes); never below 0 (NVFP4 saves a
        # little more, not counted)
        per_element = max(0.0, per_element - 2)
    return per_element * linear_params(m) * stage_blocks(m, s)[rank] / s.tp


GATHERED = ("qkv_in", "mlp_in", "norm1_out", "norm2_out")
"""The saved tensors (`memory.act_tensors` / `eager_act_tensors` names) that are a norm's output and a GEMM's
input: the ones DTensor TP gathers before the GEMM saves them."""


def gathered_tp_bytes(m: ModelSpec, s: TrainSetup, t: dict[str, float]) -> float:
    """Bytes per local token that the whole gathered GEMM inputs add to a block's saved tensors `t` in place of
    their sequence shards (module docstring); 0 unless `s.keeps_gathered`."""
    if not s.keeps_gathered:
        return 0.0
    kept = [t[k] for k in GATHERED if t.get(k)]
    f = planned_format(s.precision)
    if f is not None and f.fsdp_float8_all_gather:   # float8 TP: cast, then gathered (and saved) in float8
        return sum(s.tp * m.hidden * 1.0 - shard for shard in kept)
    return sum((s.tp - 1) * shard for shard in kept)


def nccl_groups(s: TrainSetup) -> dict[str, tuple[int, int]]:
    """The process groups with an NCCL communicator on each GPU: name → (ranks, nodes spanned)."""
    groups = {"world": (s.world, s.nodes)}
    data = [("data", s.dp * s.cp, s.tp)]
    if s.sharding == "hsdp" and 1 < s.shards < s.dp * s.cp:
        # HSDP's 2-D mesh: the gathers and reduce-scatters go over the shard group, the all-reduce of the shards'
        # gradients over the replicate group (comm.py), each a communicator of its own
        data = [("shard", s.shards, s.tp), ("replicate", s.dp * s.cp // s.shards, s.tp * s.shards)]
    for name, size, inner in (*data, ("tensor", s.tp, 1), ("context", s.cp, s.tp)):
        if 1 < size < s.world:
            groups[name] = (size, group_layout(s, size, inner)[0])
    return {k: v for k, v in groups.items() if v[0] > 1}


def nccl_buffer_bytes(s: TrainSetup) -> float:
    """Bytes of NCCL connection buffers on one GPU, all its communicators together (module docstring)."""
    nvlink = s.gpu.nvlink_gbs > PCIE_GBS
    return sum(communicator_bytes(n, nodes, s.gpu.sm[0], nvlink=nvlink) for n, nodes in nccl_groups(s).values())
