"""Step time on one GPU as a per-op roofline: GEMMs at a shape-dependent fraction of the precision's
peak, flash attention by its FLOPs, memory-bound ops (norms, RoPE, activations, residuals, FP8 casts,
the loss, the optimizer) by their bytes over HBM bandwidth.

  GEMM        each linear of a block and the output head, forward + input grad + weight grad
              (3 × 2·M·K·N FLOPs; LoRA's frozen base skips the weight grad), M = micro-batch tokens
              (/cp), K or N split by tp. Time = FLOPs / (peak × e × g), e = GEMM fraction of peak for the
              GPU generation (calibrated, `CALIBRATION`), g = d / (d + 128) with d the smallest of M, K, N:
              a 128-wide tile runs partly empty on thin matrices (why TP8 or a 1B model gets less of peak).
              FP8/MXFP8/NVFP4 run the block GEMMs at their own peak × `lowp_rel`; the output head stays bf16
              (torchtitan's and NVIDIA's recipes); NVFP4 keeps the last 16% of blocks in bf16 (NVIDIA's recipe).
  attention   causal flash attention: forward 4·b·s_q·s·h/tp FLOPs × 1/2 (causal), backward 2.5× forward
              (FlashAttention-2 recomputes the scores), in bf16 at e × `attn_rel` of the bf16 peak.
  memory      per token per block (12h + 2kv + 3F [SwiGLU] or 2F) elements × 2 bytes forward, ×3 with
              backward (norms, RoPE, residuals, activation); ×`nocompile` without fusion; low-precision
              casts read 2 and write 1 byte per element of each GEMM operand, forward and backward
              (3·(2MK + 2KN + MN) bytes); the loss 24 bytes per logit (compiled or fused: 8). At 80% of HBM bandwidth.
  recompute   full: another forward of every block (GEMM, attention, memory-bound); selective (every 2nd
              block): half of that; selective-op: every other block matmul and the memory-bound forward;
              Megatron --recompute-layers: the forward of the recomputed blocks; --recompute-modules: the MLP's
              forward GEMMs and activation (mlp), the attention forward (core_attn), the norms (layernorm).
  offload     activation offload: the offloaded blocks' bytes out and back over the host link (`HOST_GBS`),
              on a side stream: only what exceeds the micro-batch's compute is exposed.
  optimizer   AdamW over this GPU's shard: 32 bytes per parameter (read p, g, m, v; write p, m, v; the
              grad-norm pass), once per step. Offloaded: PCIe 6 bytes per parameter at 25 GB/s and a CPU
              step at 1e9 parameters/s per GPU.
"""

from __future__ import annotations

from overdrive.plan.memory import act_bytes_per_layer, recomputed_blocks
from overdrive.plan.setup import TrainSetup
from overdrive.plan.specs import ModelSpec

__all__ = ["CALIBRATION", "compute_times", "gemm_eff", "peak_tflops", "HBM_EFF", "TILE", "HOST_GBS"]

# Fitted by scripts/plan_calibrate.py on the calibration runs of src/overdrive/plan/published_runs.json
# (llm-foundry's H100/A100 table and the torchtitan/torchao runs); never on the validation runs.
CALIBRATION = {
    "gemm_eff": {8: 0.75, 9: 0.525, 10: 0.525},   # 10.x: no Blackwell run to calibrate on: Hopper's value
    "lowp_rel": 0.909,
    "rowwise_rel": 0.765,
    "attn_rel": 0.378,
    "nocompile": 1.4,
    "megatron_rel": 1.625,
}
HBM_EFF = 0.8
# Host link per GPU, one direction, GB/s, for activation offload: Grace parts reach the CPU over NVLink-C2C
# (900 GB/s both ways, NVIDIA GB200/GB300 datasheets); others over PCIe at the 25 GB/s used for optimizer offload.
HOST_GBS = {"gb200": 450.0, "gb300": 450.0, "pcie": 25.0}
TILE = 128
NVFP4_BF16_SHARE = 0.16
QUANT_BYTES = {"fp8": 1.0, "fp8-rowwise": 1.0, "mxfp8": 1.15, "nvfp4": 1.3}


def gemm_eff(s: TrainSetup, cal: dict | None = None) -> float:
    """GEMM fraction of peak for this GPU generation (or the user's --efficiency)."""
    cal = cal or CALIBRATION
    if s.efficiency is not None:
        return s.efficiency
    table = cal["gemm_eff"]
    e = table.get(s.gpu.sm[0], table[9])
    return min(1.0, e * cal["megatron_rel"]) if s.stack == "megatron" else e


def peak_tflops(s: TrainSetup, precision: str | None = None) -> float:
    p = precision or s.precision
    g = s.gpu
    if p == "fp32":
        return g.tf32_tflops
    if p == "nvfp4" and g.fp4_tflops:
        return g.fp4_tflops
    if p in ("fp8", "fp8-rowwise", "mxfp8", "nvfp4") and g.fp8_tflops:
        return g.fp8_tflops
    return g.bf16_tflops


def _block_gemms(m: ModelSpec, s: TrainSetup, M: float) -> list[tuple[float, float, float]]:
    h, q, kv, F, t = m.hidden, m.q_dim, m.kv_dim, m.ffn, s.tp
    mlp = [(M, h, F / t)] * (2 if m.gated_mlp else 1) + [(M, F / t, h)]
    return [(M, h, q / t), (M, h, kv / t), (M, h, kv / t), (M, q / t, h)] + mlp


def _gemm_s(shapes, peak_tf: float, eff: float, passes: float) -> float:
    t = 0.0
    for M, K, N in shapes:
        d = min(M, K, N)
        t += passes * 2 * M * K * N / (peak_tf * 1e12 * eff * d / (d + TILE))
    return t


def compute_times(m: ModelSpec, s: TrainSetup, cal: dict | None = None) -> dict[str, float]:
    """Seconds per micro-batch on the busiest GPU (the last pipeline stage), by op class; plus
    `optimizer` seconds per step."""
    cal = cal or CALIBRATION
    e = gemm_eff(s, cal)
    bf16_peak = peak_tflops(s, "fp32" if s.precision == "fp32" else "bf16")
    M = s.micro_batch * s.seq / s.cp          # tokens through each GEMM (sequence-parallel gathered)
    tok = M / s.tp                            # tokens per GPU in the memory-bound ops
    L = m.n_layer / s.pp
    passes = 2.0 if s.lora_rank else 3.0
    block = _block_gemms(m, s, M)
    t_bf16 = _gemm_s(block, bf16_peak, e, passes)
    lowp_share, t_block, quant_b = 0.0, t_bf16, 0.0
    if s.low_precision:
        rel = cal["lowp_rel"] * (cal["rowwise_rel"] if s.precision == "fp8-rowwise" else 1.0)
        t_lowp = _gemm_s(block, peak_tflops(s), e * rel, passes)
        lowp_share = 1 - NVFP4_BF16_SHARE if s.precision == "nvfp4" else 1.0
        t_block = lowp_share * t_lowp + (1 - lowp_share) * t_bf16
        quant_b = lowp_share * QUANT_BYTES[s.precision] * sum(3 * (2 * a * k + 2 * k * n + a * n) for a, k, n in block)
    gemm_block = L * t_block
    head = _gemm_s([(M, m.hidden, m.vocab / s.tp)], bf16_peak, e, 3.0)
    attn_fwd = 4 * s.micro_batch * (s.seq / s.cp) * s.seq * (m.n_head * m.head_dim) / s.tp * 0.5
    attn = L * 3.5 * attn_fwd / (bf16_peak * 1e12 * e * cal["attn_rel"])
    act = 3 * m.ffn if m.gated_mlp else 2 * m.ffn
    width = 4 if s.precision == "fp32" else 2
    ew_bytes = L * tok * 3 * (12 * m.hidden + 2 * m.kv_dim + act) * width
    if not s.compile:
        ew_bytes *= cal["nocompile"]
    hbm = s.gpu.hbm_tbs * 1e12 * HBM_EFF
    memory = (ew_bytes + L * quant_b + tok * m.vocab * (24 if s.loss == "standard" else 8)) / hbm
    # selective: the L // 2 blocks memory.py checkpoints (none with one block per stage)
    frac_fwd = {"none": 0.0, "selective": (L // 2) / L, "full": 1.0, "selective-op": 0.0}[s.checkpointing]
    if s.recompute_layers:
        frac_fwd = recomputed_blocks(m, s) / L
    recompute = frac_fwd * (gemm_block / passes + attn / 3.5 + (ew_bytes / 3 + L * quant_b / 3) / hbm)
    if s.checkpointing == "selective-op":
        recompute = 0.5 * gemm_block / passes + ew_bytes / 3 / hbm
    if "mlp" in s.recompute_modules:   # the MLP's forward GEMMs and activation again
        n_mlp = 3 if m.gated_mlp else 2
        recompute += gemm_block / passes * _gemm_s(block[-n_mlp:], bf16_peak, e, 1) / _gemm_s(block, bf16_peak, e, 1)
        recompute += L * tok * act * width / hbm
    if "core_attn" in s.recompute_modules:
        recompute += attn / 3.5
    if "layernorm" in s.recompute_modules:
        recompute += L * tok * 4 * m.hidden * width / hbm   # two norms: read h, write h
    offload = 0.0
    if s.offload_activations:
        # out after the forward, back before the backward, on a side stream (exposed beyond compute: estimate.py)
        moved = min(s.offload_activations, L) * act_bytes_per_layer(m, s)
        offload = 2 * moved / (HOST_GBS.get(s.gpu.key, HOST_GBS["pcie"]) * 1e9)
    P_shard = m.n_params() / (s.tp * s.pp) / (s.shards if s.sharding != "none" else 1)
    if s.lora_rank:
        from overdrive.plan.memory import lora_params

        P_shard = lora_params(m, s.lora_rank) / (s.tp * s.pp)
    if s.offload != "none":
        opt = 6 * P_shard / 25e9 + P_shard / 1e9
    else:
        opt = 32 * P_shard / hbm
    return {"gemm": gemm_block + head, "attention": attn, "memory": memory, "recompute": recompute,
            "optimizer": opt, "lowp_share": lowp_share, "offload": offload}
