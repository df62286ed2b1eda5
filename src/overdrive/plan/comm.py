"""Communication per step and how much of it compute cannot hide.

  data parallel   FSDP/ZeRO-3: all-gather the parameters in forward and again in backward (reshard after
                  forward; compute dtype, 1 byte with FP8 all-gather) and reduce-scatter fp32 gradients,
                  every micro-batch; ZeRO-1/2: reduce-scatter gradients + all-gather parameters once per
                  step; DDP: all-reduce (2× the gradient bytes) once per step. Each moves (S−1)/S of its
                  bytes per GPU (ring), at 80% of the link: NVLink within a node; across nodes one ring
                  per rail, so k group members per node share k NICs (min(NVLink, k × NIC)). HSDP: FSDP inside the node + an all-reduce of the shard across nodes. Hidden under
                  compute up to the overlap factor (FSDP prefetch, DDP buckets).
  tensor parallel with sequence parallelism, per block: all-gather + reduce-scatter of b·s·h 16-bit
                  activations twice in forward and twice in backward ((tp−1)/tp of them over NVLink), plus
                  the recomputed forward's; exposed unless overlapped (async TP, or --stack megatron's
                  tp_comm_overlap: 30% left).
  context parallel ring attention passes K and V around the cp ranks (backward: and their grads),
                  hidden under the attention compute.
  pipeline        the bubble (pp−1)/(vpp·micro-batches) of idle time, plus the activations sent between
                  stages.
"""

from __future__ import annotations

from overdrive.plan.setup import TrainSetup
from overdrive.plan.specs import ModelSpec

__all__ = ["comm_times", "LINK_EFF", "ASYNC_TP_EXPOSED"]

LINK_EFF = 0.8
ASYNC_TP_EXPOSED = 0.3


def _bw(s: TrainSetup, group: int) -> float:
    """Bytes/s per GPU for a ring over `group` GPUs laid out after the tp ranks. Across nodes NCCL runs one
    ring per rail (GPU i of every node talks through NIC i), so a group with k members per node moves
    its traffic over k NICs at once: min(NVLink, k × NIC)."""
    intra = (s.intra_gbs or s.gpu.nvlink_gbs) * 1e9
    if group * s.tp <= s.gpus_per_node:
        return LINK_EFF * intra
    per_node = max(1, s.gpus_per_node // s.tp)
    return LINK_EFF * min(intra, per_node * s.inter_gbs * 1e9)


def comm_times(m: ModelSpec, s: TrainSetup, attn_s: float) -> dict[str, float]:
    """Seconds: `dp` per step (to overlap with compute), `tp`, `cp`, `pp` exposed per micro-batch."""
    P = m.n_params() / (s.tp * s.pp)
    S = s.shards
    grad_b = 2 if (s.pure_bf16 or s.grad_dtype == "bf16") else 4
    gather_b = 1 if (s.fp8_all_gather and s.low_precision) else (4 if s.precision == "fp32" else 2)
    trained = P
    if s.lora_rank:
        from overdrive.plan.memory import lora_params

        trained = lora_params(m, s.lora_rank) / (s.tp * s.pp)
    dp = 0.0
    if s.sharding in ("fsdp", "hsdp") and S > 1:
        per_mb = (2 * P * gather_b + trained * grad_b) * (S - 1) / S / _bw(s, S)
        dp = s.grad_accum * per_mb
        if s.sharding == "hsdp" and s.nodes > 1:
            reps = s.dp * s.cp // S
            dp += 2 * (trained * grad_b / S) * (reps - 1) / reps / _bw(s, s.dp * s.cp) if reps > 1 else 0.0
    elif s.sharding in ("zero1", "zero2") and S > 1:
        dp = (trained * grad_b + P * 2) * (S - 1) / S / _bw(s, S)
    elif s.sharding == "none" and s.dp * s.cp > 1:
        W = s.dp * s.cp
        dp = 2 * trained * grad_b * (W - 1) / W / _bw(s, W)
    tp = 0.0
    if s.tp > 1:
        tokens = s.micro_batch * s.seq / s.cp
        colls = 8 + {"full": 4, "selective": 2}.get(s.checkpointing, 0)
        L = m.n_layer / s.pp
        tp = L * colls * tokens * m.hidden * 2 * (s.tp - 1) / s.tp / _bw(s, 1)
        tp *= ASYNC_TP_EXPOSED if s.tp_overlap else 1.0   # megatron's default: tp_comm_overlap
    cp = 0.0
    if s.cp > 1:
        tokens = s.micro_batch * s.seq / s.cp
        kv_bytes = 2 * tokens * m.kv_dim * 2 / s.tp
        ring = (m.n_layer / s.pp) * 3 * kv_bytes * (s.cp - 1) / _bw(s, s.cp)
        cp = max(0.0, ring - attn_s)
    pp = 0.0
    if s.pp > 1:
        # each of the vpp chunks sends its activations on and receives their gradients back
        pp = s.vpp * 2 * s.micro_batch * s.seq / s.cp * m.hidden * 2 / s.tp / _bw(s, s.pp * s.cp * s.dp)
    return {"dp": dp, "tp": tp, "cp": cp, "pp": pp}
