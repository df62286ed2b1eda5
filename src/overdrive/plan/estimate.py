"""Memory per GPU and step time for one training configuration. Every formula says where it comes from.

Memory (bytes per GPU), mixed precision as FSDP2 runs it (fp32 sharded master weights, bf16 compute):
  params      4·P / S             fp32 master weights, sharded over S (S = world for FSDP, GPUs per node
                                  for HSDP, 1 for DDP)
  grads       4·P / S             fp32 gradients (reduce-scattered into the shards)
  optimizer   (2 moments)·b·P / S AdamW m and v, b = 4 (fp32), 2 (bf16) or 1 (8-bit) bytes each
  activations per layer, 16-bit, no dropout, flash attention (so no s² score matrix) — the accounting
              of Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer
              Models", eq. 1 gives 34·s·b·h + 5·a·s²·b with dropout and materialised scores), recounted
              tensor by tensor for what autograd saves:
                s·b·(h [norm1 in] + h [qkv in] + (h + 2·kv) [q, k, v] + h [attention out]
                     + h [norm2 in] + h [mlp in] + F·(2 if gated else 1) [fc outs] + F [activation out])
              × 2 bytes (4 under fp32). GPT shapes (F = 4h, kv = h): 16·s·b·h × 2 = 32·s·b·h, vs 34 in the
              paper (which adds two dropout masks of 1 byte per element).
              Checkpointing keeps each checkpointed block's input (2·s·b·h) and recomputes the rest one
              block at a time: full = L inputs + 1 block; selective (every k-th) = L/k of them.
  logits      b·s·V·(2 [bf16 logits] + 4 [fp32 copy for the loss] + 4 [its gradient]): ~10 GB for V = 128K,
              s = 8192, b = 1 — why long-context runs on big vocabularies OOM at the head.
  fsdp        two blocks' parameters all-gathered at once (the current one and the prefetched next) in the
              compute dtype (bf16: 2 bytes; FP8 all-gather: 1) + one block's gradients before reduce-scatter
              (fp32) — FSDP2's default of resharding after forward.
  other       CUDA context and library workspaces (1 GiB) + 8% allocator fragmentation over the rest; without
              FSDP under bf16 autocast, the 16-bit weight copies autocast keeps for backward (2·P).

Step time:
  FLOPs per token 6·N + 12·L·H·Q·T (overdrive.bench.flops); checkpointing recomputes the forward of the
  checkpointed blocks: + 2·N_blocks·(fraction checkpointed) + the attention forward (1/3 of its term).
  compute     = FLOPs / (peak × efficiency); efficiency (hardware FLOP utilisation) calibrated on torchtitan's
              Llama-3.1-8B on 8×H100 (FSDP, bf16, compile: 6,667 tok/s/GPU = 39% MFU) — see
              docs/plan-validation.md; `--calibrate RESULTS.json` replaces it with our own bench's MFU.
  FP8         speeds up the GEMM share only (6N; attention stays bf16), by an effective GEMM speedup
              calibrated on the published end-to-end gains: tensorwise 1.40x (torchao +25%, torchtitan
              +28% on Llama-3-8B), rowwise 1.13x (torchao +10%).
  comm        FSDP: all-gather parameters in forward and in backward (2 × P × 2 bytes, 1 with FP8
              all-gather) and reduce-scatter fp32 gradients (P × 4 bytes), each moving (S−1)/S of it
              over the per-GPU link; DDP: all-reduce 2 × P × 4 × (W−1)/W; HSDP: FSDP within the node plus
              an all-reduce of the gradient shard across nodes on the inter-node link.
  step        = compute + max(0, comm − overlap × compute): FSDP prefetching hides communication under
              compute up to the overlap factor (default 0.9).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from overdrive.env.catalog import GpuSpec
from overdrive.plan.specs import ModelSpec

__all__ = ["TrainSetup", "Estimate", "estimate", "DEFAULT_EFFICIENCY", "FP8_GEMM_SPEEDUP", "GIB"]

GIB = 2**30
DEFAULT_EFFICIENCY = 0.39    # torchtitan Llama-3.1-8B, 8×H100, FSDP + compile, bf16: 39% MFU
FP8_GEMM_SPEEDUP = {"fp8": 1.40, "fp8-rowwise": 1.13, "mxfp8": 1.40}
OPT_BYTES = {"fp32": 4, "bf16": 2, "8bit": 1}
CONTEXT_BYTES = 1 * GIB
FRAGMENTATION = 0.08


@dataclass(frozen=True, kw_only=True)
class TrainSetup:
    gpu: GpuSpec
    gpus_per_node: int = 8
    nodes: int = 1
    seq: int = 4096
    micro_batch: int = 1
    precision: str = "bf16"
    """fp32 | bf16 | fp8 (tensorwise) | fp8-rowwise | mxfp8."""
    sharding: str = "fsdp"
    """none (DDP) | fsdp | hsdp."""
    checkpointing: str = "none"
    """none | selective (every 2nd block) | full."""
    optimizer_dtype: str = "fp32"
    fp8_all_gather: bool = False
    efficiency: float = DEFAULT_EFFICIENCY
    overlap: float = 0.9
    intra_gbs: float | None = None
    """Per-GPU intra-node bandwidth, GB/s (default: the GPU's NVLink)."""
    inter_gbs: float = 50.0
    """Per-GPU inter-node bandwidth, GB/s (400 Gb/s InfiniBand or RoCE per GPU)."""

    @property
    def world(self) -> int:
        return self.gpus_per_node * self.nodes


@dataclass(kw_only=True)
class Estimate:
    setup: TrainSetup
    breakdown_gib: dict[str, float]
    memory_gib: float
    capacity_gib: float
    fits: bool
    step_s: float
    compute_s: float
    comm_s: float
    tokens_per_s_per_gpu: float
    mfu: float
    notes: list[str] = field(default_factory=list)

    @property
    def headroom_gib(self) -> float:
        return self.capacity_gib - self.memory_gib


def _shards(s: TrainSetup) -> int:
    return {"none": 1, "fsdp": s.world, "hsdp": s.gpus_per_node}[s.sharding]


def _act_bytes_per_layer(m: ModelSpec, s: TrainSetup) -> float:
    h, F = m.hidden, m.ffn
    elems = h + h + (h + 2 * m.kv_dim) + h + h + h + F * (2 if m.gated_mlp else 1) + F
    width = 4 if s.precision == "fp32" else 2
    return s.seq * s.micro_batch * elems * width


def memory_breakdown(m: ModelSpec, s: TrainSetup) -> dict[str, float]:
    P, S = m.n_params(), _shards(s)
    out = {"params": 4 * P / S, "grads": 4 * P / S, "optimizer": 2 * OPT_BYTES[s.optimizer_dtype] * P / S}
    per_layer = _act_bytes_per_layer(m, s)
    block_input = s.seq * s.micro_batch * m.hidden * (4 if s.precision == "fp32" else 2)
    L = m.n_layer
    if s.checkpointing == "none":
        acts = L * per_layer
    elif s.checkpointing == "full":
        acts = L * block_input + per_layer
    else:  # selective: every 2nd block checkpointed
        k = L // 2
        acts = k * block_input + (L - k) * per_layer + per_layer
    logits = s.micro_batch * s.seq * m.vocab * (12 if s.precision == "fp32" else 10)
    out["activations"] = acts + logits
    other = 0.0
    if s.sharding == "none" and s.precision != "fp32":
        other += 2 * P  # torch.autocast's bf16 copies of the fp32 weights, kept for backward (no FSDP to hold them)
    if s.sharding in ("fsdp", "hsdp") and S > 1:
        gather_bytes = 1 if (s.fp8_all_gather and s.precision.startswith(("fp8", "mx"))) else 2
        other += 2 * m.layer_params() * gather_bytes + m.layer_params() * 4
    subtotal = sum(out.values()) + other
    other += CONTEXT_BYTES + FRAGMENTATION * subtotal
    out["other"] = other
    return {k: v / GIB for k, v in out.items()}


def _flops(m: ModelSpec, s: TrainSetup) -> tuple[float, float, float]:
    """(model FLOPs per token, hardware FLOPs per token incl. recompute, GEMM share of hardware FLOPs)."""
    model = m.flops_per_token(s.seq)
    gemm = 6 * m.n_params_matmul()
    attn = model - gemm
    frac = {"none": 0.0, "selective": 0.5, "full": 1.0}[s.checkpointing]
    block_gemm = 6 * m.n_layer * m.layer_params()
    recompute = frac * (block_gemm / 3 + attn / 3)  # one more forward of the checkpointed blocks
    hw = model + recompute
    gemm_hw = gemm + frac * block_gemm / 3
    return model, hw, gemm_hw / hw


def _comm_s(m: ModelSpec, s: TrainSetup) -> float:
    P = m.n_params()
    intra = (s.intra_gbs or s.gpu.nvlink_gbs) * 1e9
    inter = s.inter_gbs * 1e9
    link = intra if s.nodes == 1 else min(intra, inter)
    if s.sharding == "none":
        return 2 * P * 4 * (s.world - 1) / s.world / link if s.world > 1 else 0.0
    S = _shards(s)
    gather_bytes = 1 if (s.fp8_all_gather and s.precision.startswith(("fp8", "mx"))) else 2
    moved = (2 * P * gather_bytes + P * 4) * (S - 1) / S
    if s.sharding == "fsdp":
        return moved / link
    t = moved / intra  # hsdp: within the node ...
    if s.nodes > 1:   # ... plus all-reduce of each GPU's gradient shard across nodes
        t += 2 * (P * 4 / S) * (s.nodes - 1) / s.nodes / inter
    return t


def estimate(m: ModelSpec, s: TrainSetup) -> Estimate:
    bd = memory_breakdown(m, s)
    total = sum(bd.values())
    tokens = s.micro_batch * s.seq
    model_f, hw_f, gemm_share = _flops(m, s)
    g = s.gpu
    notes = []
    if s.precision == "fp32":
        peak = g.fp32_tflops * 1e12
    else:
        peak = g.bf16_tflops * 1e12
    compute = tokens * hw_f / (peak * s.efficiency)
    if s.precision in FP8_GEMM_SPEEDUP:
        if not g.fp8_tflops:
            notes.append(f"{g.name} has no FP8 tensor cores")
        else:
            compute *= (1 - gemm_share) + gemm_share / FP8_GEMM_SPEEDUP[s.precision]
    comm = _comm_s(m, s)
    step = compute + max(0.0, comm - s.overlap * compute)
    if comm > s.overlap * compute:
        notes.append(f"communication-bound: {comm * 1e3:.0f} ms of comm vs {compute * 1e3:.0f} ms of compute")
    tps = tokens / step
    return Estimate(setup=s, breakdown_gib=bd, memory_gib=total, capacity_gib=g.mem_gib, fits=total <= g.mem_gib,
                    step_s=step, compute_s=compute, comm_s=comm, tokens_per_s_per_gpu=tps,
                    mfu=tps * model_f / (g.bf16_tflops * 1e12), notes=notes)
