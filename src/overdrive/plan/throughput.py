"""Step time on one GPU as a per-op roofline: GEMMs at a shape-dependent fraction of the precision's
peak, flash attention by its FLOPs, memory-bound ops (norms, RoPE, activations, residuals, FP8 casts,
the loss, the optimizer) by their bytes over HBM bandwidth.

  GEMM        each linear of a block and the output head, forward + input grad + weight grad
              (3 × 2·M·K·N FLOPs; LoRA's frozen base skips the weight grad), M = micro-batch tokens
              (/cp), K or N split by tp. Each of the three passes is its own GEMM shape: forward writes M×N
              over an inner K, the input grad M×K over N, the weight grad K×N over M. Time = FLOPs / (peak × e
              × q × k), e = the stack's GEMM fraction of peak for the GPU generation (calibrated, `CALIBRATION`),
              q = tile and wave quantization: the output is cut into tiles (128×256, 128×128 or 64×128, the best
              for the shape, smaller tiles at a lower rate), padded to whole tiles, and the tiles run in waves
              over the GPU's SMs (`SMS`), so a last partial wave idles the rest; k = K/(K + `gemm_k0`): a short
              inner dimension spends more of each tile on loading and the epilogue. Narrow models and
              TP-sliced dimensions (hidden 2304, or 8192/8) get less of peak this way, wide ones nearly all.
              FP8/MXFP8/NVFP4 run the block GEMMs at their own peak × `lowp_rel`; the output head stays bf16
              (torchtitan's and NVIDIA's recipes); NVFP4 keeps the last 16% of blocks in bf16 (NVIDIA's recipe).
  attention   causal flash attention: forward 4·b·s_q·s·h/tp FLOPs × 1/2 (causal; packed documents of d tokens,
              --doc-len: 4·b·s_q·d·h/tp × 1/2 at the kernel's rate for d tokens), backward 2.5× forward
              (FlashAttention-2 recomputes the scores), in bf16 at the kernel's published share of the bf16 peak
              on this GPU generation (attention.py's `ATTN_PEAK_SHARE`: FlashAttention-2 reaches a third of an H100, cuDNN's and
              FlashAttention-3's Hopper-native kernels half), × its sequence roll-off (`ATTN_SEQ_RATE`, from the
              same benchmarks) × the head dim over the one the kernel pads it to (`head_dim_padding`: 96 runs
              128-wide tiles in the Triton kernel) × `attn_rel`, what a model's attention keeps of the kernel
              benchmark. The kernel is `attention_kernel`'s: --attention, or the stack's own.
  stack       pytorch: memory-bound ops fused by torch.compile (× `nocompile` in eager), the loss as --loss
              says; megatron (Megatron-Core + Transformer Engine): fused kernels always, TP communication
              overlapped with the GEMMs (comm.py), and GEMM efficiencies of its own per generation. The loss
              is --loss's on either stack: 36 bytes per logit for PyTorch's fp32 cross-entropy (standard, hf), 8 for
              a fused one (compiled, inplace, fused); standard on the megatron stack is Megatron-Core's vocab-parallel
              cross-entropy, 52 bytes per logit counted from its kernels (`MEGATRON_CE_BYTES`).
  unfused     --attention unfused (before flash attention: Megatron 2021, eager attention): the scores go
              through HBM: two batched GEMMs per head over the full s × s at their shape's efficiency, plus
              `UNFUSED_ATTN_BYTES` per score of softmax and mask traffic (+ `UNFUSED_DROPOUT_BYTES` with --dropout).
  memory      per token per block (12h + 2kv + 3F [SwiGLU] or 2F) elements × 2 bytes forward, ×3 with
              backward (norms, RoPE, residuals, activation); ×`nocompile` without fusion; low-precision
              casts by the format's scaling (`Format.cast_bytes`, `_cast_bytes`: an amax pass before each cast
              with current scaling, none with Transformer Engine's delayed scaling, whose norms write FP8 and
              whose weights Megatron casts once a step); a squared ReLU on the megatron stack unfused (+8F
              elements per token, `SRELU_UNFUSED_ELEMS`); --unfused-ops, what pre-TE Megatron-LM runs eagerly
              (`unfused.py`); the loss by `loss_bytes_per_logit` (PyTorch's fp32 one 36, Megatron's 52,
              fused 8). At 80% of HBM bandwidth.
  recompute   full: another forward of every block (GEMM, attention, memory-bound); selective (every 2nd
              block): half of that; selective-op: every other block matmul and the memory-bound forward;
              Megatron --recompute-layers: the forward of the recomputed blocks; --recompute-modules: the MLP's
              forward GEMMs and activation (mlp), the attention forward (core_attn), the norms (layernorm).
  offload     activation offload: the offloaded blocks' bytes out and back over the host link (`HOST_GBS`),
              on a side stream: only what exceeds the micro-batch's compute is exposed.
  optimizer   AdamW over this GPU's shard: 32 bytes per parameter (read p, g, m, v; write p, m, v; the
              grad-norm pass), once per step. --deepspeed-pipeline with bf16: DeepSpeed's BF16_Optimizer also
              adds every micro-batch's bf16 gradients into fp32 ones (`BF16_ACCUM_BYTES` per parameter of the
              stage, in the micro-batch time); so does nanotron's ZeRO-1 (--zero-sliced, `NANOTRON_ACCUM_BYTES`).
              Offloaded: PCIe 6 bytes per parameter at 25 GB/s and a CPU
              step at 1e9 parameters/s per GPU.
"""

from __future__ import annotations

from overdrive.formats import planned_format
from overdrive.plan.attention import attention_override, attention_share, head_dim_padding
from overdrive.plan.choices import NO_STEP
from overdrive.plan.memory import act_bytes_per_layer, recomputed_blocks
from overdrive.plan.pipeline import stage_imbalance
from overdrive.plan.setup import OPTIMIZER_STATES, TrainSetup
from overdrive.plan.specs import ModelSpec
from overdrive.plan.unfused import unfused_bytes

__all__ = ["CALIBRATION", "compute_times", "gemm_eff", "gemm_shape_eff", "peak_tflops", "HBM_EFF", "SMS", "TILES",
           "HOST_GBS", "MEGATRON_CE_BYTES", "UNFUSED_DROPOUT_BYTES", "BF16_ACCUM_BYTES",
           "NANOTRON_ACCUM_BYTES", "LOSS_BYTES", "loss_bytes_per_logit", "Z_LOSS_BYTES", "SRELU_UNFUSED_ELEMS"]

# Fitted by scripts/plan_calibrate.py on the calibration runs of src/overdrive/plan/published_runs.json only
# (docs/plan-validation.md lists which run fitted which constant); never on the validation runs.
CALIBRATION = {
    "gemm_eff": {"pytorch": {8: 0.77, 9: 0.613, 10: 0.613}, "megatron": {8: 0.77, 9: 0.647, 10: 0.631}},
    "gemm_k0": 128.0,
    "lowp_rel": 0.857,
    "rowwise_rel": 0.697,
    "attn_rel": 0.966,
    "nocompile": 3.584,
}
# Streaming multiprocessors per GPU (NVIDIA's architecture whitepapers and datasheets), for wave quantization.
SMS = {"a100-40": 108, "a100-80": 108, "a800": 108, "h800": 132, "h100-sxm": 132, "h100-96gb": 132, "h100-nvl": 132,
       "h100-pcie": 114, "h200": 132, "h200-nvl": 132, "b200": 148, "gb200": 148, "b300": 160, "gb300": 160, "l40s": 142, "l4": 58,
       "rtx4090": 128}
# (rows, cols, rate relative to the big tile): what cuBLAS/CUTLASS heuristics choose between for a shape
TILES = ((128, 256, 1.0), (128, 128, 0.92), (64, 128, 0.8))
HBM_EFF = 0.8
# Host link per GPU, one direction, GB/s, for activation and optimizer offload: Grace parts reach the CPU over
# NVLink-C2C (900 GB/s both ways, NVIDIA GB200/GB300 datasheets); others over PCIe at 25 GB/s.
HOST_GBS = {"gb200": 450.0, "gb300": 450.0, "pcie": 25.0}
UNFUSED_ATTN_BYTES = 10.0
"""HBM bytes per attention score without flash attention beyond what the two GEMMs write and read (their
short inner dimension already costs them): forward, Megatron's fused causal scale-softmax reads the 16-bit
scores and writes the probabilities (4); backward, softmax's read of probabilities and gradient and its write
(6). With --dropout, `UNFUSED_DROPOUT_BYTES` more."""
UNFUSED_DROPOUT_BYTES = 10.0
"""Attention dropout over the unfused scores: forward, it reads the probabilities and writes the result and a
1-byte mask (5); backward, it reads the gradient and the mask and writes its result (5)."""


MEGATRON_CE_BYTES = 52.0
"""HBM bytes per logit of Megatron-Core's unfused vocab-parallel cross-entropy
(megatron/core/tensor_parallel/cross_entropy.py, core_v0.8.0; the same kernels in Megatron-LM 2021's mpu), counted
from its kernels on 16-bit logits: forward .float() (read 2, write 4), max (4), in-place subtract (8), exp (8), sum
(4), in-place divide (8); backward the in-place multiply by the incoming gradient (8) and the cast back to 16 bits
(6)."""
LOSS_BYTES = {"standard": 36.0, "hf": 36.0, "compiled": 8.0, "inplace": 8.0, "fused": 8.0, "compiled-fp32": 26.0,
              "chunked": 8.0}
"""HBM bytes per logit of each --loss, forward and backward. standard/hf, F.cross_entropy(logits.float()) counted by
kernel: the cast (read 2, write 4), log_softmax (8), the zero-filled fp32 gradient nll_loss's backward scatters into
(4), log_softmax's backward (read 8, write 4) and the cast back (6). A first count of 24 left out the zero fill, the
cast back and one read; the calibration fitted the same constants with either (no calibration run's error moved by
more than a fraction of a point). The fused kernels read the 16-bit logits and write their 16-bit gradient, with
the max/sum pass: 8 (chunked, torchtune's compiled per-chunk loss on 16-bit chunks, too). compiled-fp32: the
model's eager `.float()` (read 2, write 4), the compiled loss reading the fp32 logits forward (4) and backward (4)
and writing an fp32 gradient (4), the eager cast back (read 4, write 2), and the 16-bit head output (2): 26."""


SRELU_UNFUSED_ELEMS = 8.0
"""Extra elements moved per MLP activation element (per token, F/tp of them) when Megatron-Core runs a squared ReLU:
its MLP fuses only GeLU and SwiGLU (megatron/core/transformer/mlp.py: "Only support fusion of gelu and swiglu"),
so squared_relu (megatron/core/activations.py, torch.pow(F.relu(x), 2)) runs as eager kernels: forward relu and
pow (read and write each: 4), backward pow's grad·(2·x^1) (x^1 a copy: 2, the scale: 2, the multiply: 3) and
relu's threshold_backward (3): 14 elements, against the 6 (2 forward, ×3) a fused activation is counted at."""

Z_LOSS_BYTES = 12.0
"""PaLM's z-loss beside an unfused cross-entropy: logsumexp over the fp32 logits again (read 4), and in backward
its gradient added to the logits' (read 4, write 4). A fused loss kernel computes it in the same pass (0)."""


def loss_bytes_per_logit(s: TrainSetup) -> float:
    """HBM bytes per logit the cross-entropy moves, forward and backward (see LOSS_BYTES, MEGATRON_CE_BYTES)."""
    if s.loss == "megatron-v07" or s.loss == "standard" and s.stack == "megatron":
        return MEGATRON_CE_BYTES   # the out-of-place subtract writes what the in-place one overwrites: same bytes
    return LOSS_BYTES[s.loss]


def gemm_eff(s: TrainSetup, cal: dict | None = None) -> float:
    """The stack's GEMM fraction of peak on this GPU generation, before shape effects (or the user's --efficiency)."""
    cal = cal or CALIBRATION
    if s.efficiency is not None:
        return s.efficiency
    table = cal["gemm_eff"][s.stack]
    return table.get(s.gpu.sm[0], table[9])


def _quant(rows: float, cols: float, sms: int) -> float:
    """Share of the tensor cores an output of rows × cols keeps busy: tile padding × wave quantization, with
    the tile the shape does best with."""
    best = 0.0
    for tr, tc, rate in TILES:
        nr, nc = -(-rows // tr), -(-cols // tc)
        tiles = nr * nc
        waves = -(-tiles // sms)
        best = max(best, rate * rows * cols / (nr * tr * nc * tc) * tiles / (waves * sms))
    return best


def gemm_shape_eff(rows: float, cols: float, inner: float, sms: int, k0: float) -> float:
    """Shape factor of one GEMM (output rows × cols over `inner`): quantization × inner/(inner + k0)."""
    return _quant(rows, cols, sms) * inner / (inner + k0)


def peak_tflops(s: TrainSetup, precision: str | None = None) -> float:
    p = precision or s.precision
    g = s.gpu
    if p == "fp32":
        return g.tf32_tflops
    f = planned_format(p)
    if f is not None and f.bits == "fp4" and g.fp4_tflops:
        return g.fp4_tflops
    if f is not None and g.fp8_tflops:
        return g.fp8_tflops
    return g.bf16_tflops


def _block_gemms(m: ModelSpec, s: TrainSetup, M: float) -> list[tuple[float, float, float]]:
    h, q, kv, F, t = m.hidden, m.q_dim, m.kv_dim, m.ffn, s.tp
    mlp = [(M, h, F / t)] * (2 if m.gated_mlp else 1) + [(M, F / t, h)]
    return [(M, h, q / t), (M, h, kv / t), (M, h, kv / t), (M, q / t, h)] + mlp


def _gemm_s(shapes, peak_tf: float, eff: float, passes: float, sms: int = 132, k0: float = 128.0) -> float:
    """Seconds for `shapes` (M, K, N): forward (M×N over K), input grad (M×K over N), weight grad (K×N over M);
    passes = 3 (training), 2 (frozen weights: no weight grad) or 1 (a forward alone)."""
    t = 0.0
    for M, K, N in shapes:
        f = 2 * M * K * N / (peak_tf * 1e12 * eff)
        outs = ((M, N, K), (M, K, N), (K, N, M))[:int(passes)]
        t += sum(f / gemm_shape_eff(r, c, i, sms, k0) for r, c, i in outs)
    return t


def _ctx(m: ModelSpec, s: TrainSetup, cal: dict) -> dict:
    """What every term below shares: the GEMM efficiency, SMs, k0, the bf16 peak, HBM bytes/s, blocks per stage
    (the busiest pipeline rank's, `stage_imbalance`)."""
    return {"e": gemm_eff(s, cal), "sms": SMS.get(s.gpu.key, 132), "k0": cal["gemm_k0"],
            "bf16_peak": peak_tflops(s, "fp32" if s.precision == "fp32" else "bf16"),
            "hbm": s.gpu.hbm_tbs * 1e12 * HBM_EFF, "L": m.n_layer / s.pp * stage_imbalance(m, s)}


def _gemm_terms(m: ModelSpec, s: TrainSetup, cal: dict, c: dict, block, passes: float):
    """The blocks' GEMMs (bf16, or the low-precision share at its peak), the head's, and the cast bytes."""
    e, sms, k0, bf16_peak = c["e"], c["sms"], c["k0"], c["bf16_peak"]
    t_bf16 = _gemm_s(block, bf16_peak, e, passes, sms, k0)
    lowp_share, t_block, quant_b = 0.0, t_bf16, (0.0, 0.0)
    if s.low_precision:
        fmt = planned_format(s.precision)
        rel = cal["lowp_rel"] * (cal[fmt.plan_rel] if fmt.plan_rel else 1.0)
        t_lowp = _gemm_s(block, peak_tflops(s), e * rel, passes, sms, k0)
        lowp_share = 1 - fmt.keep_last_fraction  # the layers the format keeps in bf16 (NVFP4: its last 16%)
        t_block = lowp_share * t_lowp + (1 - lowp_share) * t_bf16
        quant_b = tuple(lowp_share * x for x in _cast_bytes(s, fmt, block))
    M = s.micro_batch * s.seq / s.cp
    head = _gemm_s([(M, m.hidden, m.vocab / s.tp)], bf16_peak, e, 3.0, sms, k0)
    return c["L"] * t_block, head, lowp_share, quant_b


def _cast_bytes(s: TrainSetup, fmt, block) -> tuple[float, float]:
    """HBM bytes the low-precision casts of one block move per micro-batch (`Format.cast_bytes` per element):
    (all of them, the forward's: what a recompute repeats).
    Megatron-Core builds QKV and FC1 as Transformer Engine LayerNormLinears: each of the two norm outputs is cast
    once (`norm_input`) and the projection's and FC2's inputs at `input`; PyTorch-stack linears (torchtitan, OLMo,
    Hugging Face) each cast their own input. Every GEMM's output gradient at `grad`. Weights: Megatron passes
    `is_first_microbatch`, so Transformer Engine casts them on a step's first micro-batch and reuses the cache
    (with FP8 parameters only their transpose is made, 2 bytes); on the PyTorch stack they are cast every
    micro-batch, or, gathered in FP8 (torchao's FSDP2 float8 all-gather), only copied to the transposed layout.
    Under TP, torchtitan's float8 styles cast the attention's and the FFN's input once each, on the sequence shard,
    before gathering it (`Format.tp_float8_gather`)."""
    cast, M = fmt.cast_bytes(), block[0][0]
    (_, h, _), (_, q_in, _), (_, f_in, _) = block[0], block[3], block[-1]
    if s.stack == "megatron":
        x = [a * 2 * M * h + b * M * (q_in + f_in) for a, b in zip(cast.norm_input, cast.input)]
        w = [v / max(1, s.grad_accum) for v in ((2.0, 0.0) if s.gathers_fp8 else cast.weight)]
    elif s.tp > 1 and fmt.tp_float8_gather:
        x = [v * (2 * M / s.tp * h + M * (q_in + f_in)) for v in cast.input]
        w = (0.0, 2.0) if s.gathers_fp8 else cast.weight
    else:
        x = [v * sum(a * k for a, k, _ in block) for v in cast.input]
        w = (0.0, 2.0) if s.gathers_fp8 else cast.weight   # gathered in FP8: the backward's transposed copy
    g = [v * sum(a * n for a, _, n in block) for v in cast.grad]
    kn = sum(k * n for _, k, n in block)
    fwd = x[0] + g[0] + w[0] * kn
    return fwd + x[1] + g[1] + w[1] * kn, fwd


def cast_bytes_per_micro_batch(m: ModelSpec, s: TrainSetup) -> float:
    """The low-precision casts' HBM bytes per micro-batch over this GPU's blocks (0 in bf16): `--explain`'s line."""
    fmt = planned_format(s.precision)
    if fmt is None:
        return 0.0
    block = _block_gemms(m, s, s.micro_batch * s.seq / s.cp)
    return _ctx(m, s, CALIBRATION)["L"] * (1 - fmt.keep_last_fraction) * _cast_bytes(s, fmt, block)[0]


def _attention_time(m: ModelSpec, s: TrainSetup, cal: dict, c: dict) -> tuple[float, float]:
    """Attention seconds per micro-batch, and the share of it the forward takes (what a recompute repeats)."""
    L, e, sms, k0, bf16_peak = c["L"], c["e"], c["sms"], c["k0"], c["bf16_peak"]
    if s.attention == "unfused":
        # scores and probabilities in HBM: two batched GEMMs per head over the whole s × s (no causal skip),
        # (s × s over head_dim) and (s × head_dim over s), forward + 2 backward, and per score
        # UNFUSED_ATTN_BYTES of softmax/mask/dropout traffic
        heads = m.n_head / s.tp
        per_head = [(s.seq / s.cp, m.head_dim, s.seq)] * 2
        attn = L * s.micro_batch * heads * _gemm_s(per_head, bf16_peak, e, 3.0, sms, k0)
        per_score = UNFUSED_ATTN_BYTES + (UNFUSED_DROPOUT_BYTES if s.dropout else 0.0)
        attn += L * s.micro_batch * heads * (s.seq / s.cp) * s.seq * per_score / c["hbm"]
        return attn, 1 / 3
    # each query over its own document's keys (s·d: --doc-len), the kernel's rate at that many tokens a launch
    attn_fwd = 4 * s.micro_batch * (s.seq / s.cp) * s.attn_len * (m.n_head * m.head_dim) / s.tp * 0.5
    share = attention_share(s, min(s.seq / s.cp, s.attn_len))
    rate = bf16_peak * 1e12 * share * cal["attn_rel"] * attention_override(s, cal)
    rate *= head_dim_padding(s, m.head_dim)   # tiles as wide as the compiled head dim the head is padded to
    return L * 3.5 * attn_fwd / rate, 1 / 3.5


def _elementwise_bytes(m: ModelSpec, s: TrainSetup, cal: dict, L: float) -> float:
    """HBM bytes of the norms, residuals, RoPE and activation, forward + backward, per micro-batch."""
    act = 3 * m.ffn if m.gated_mlp else 2 * m.ffn
    width = 4 if s.precision == "fp32" else 2
    # 10h of the 12h per token are the norms and residuals: on tokens/tp with sequence parallelism, on every token
    # of each TP rank without it (Korthikanti et al. 2022)
    per_tok = 10 * m.hidden * (s.tp // s.sp) + 2 * m.hidden + 2 * m.kv_dim + act
    if m.qk_norm:   # two more norms over q and k: read and write each
        per_tok += 2 * (m.q_dim + m.kv_dim)
    ew_bytes = L * (s.micro_batch * s.seq / s.cp / s.tp) * 3 * per_tok * width
    if m.squared_relu and s.stack == "megatron":   # Megatron-Core cannot fuse it (SRELU_UNFUSED_ELEMS)
        ew_bytes += L * (s.micro_batch * s.seq / s.cp / s.tp) * SRELU_UNFUSED_ELEMS * m.ffn * width
    if not s.compile and s.stack != "megatron" and not s.fused_kernels:
        ew_bytes *= cal["nocompile"]
    ew_bytes += unfused_bytes(m, s, L)   # --unfused-ops: pre-TE Megatron's eager kernels (unfused.py)
    return ew_bytes


def _recompute_time(m: ModelSpec, s: TrainSetup, c: dict, block, gemm_block: float, attn: float, fwd_share: float,
                    ew_bytes: float, quant_fwd: float, passes: float) -> float:
    """The forward work that checkpointing or Megatron's selective recompute runs again in the backward."""
    L, hbm, e, sms, k0, bf16_peak = c["L"], c["hbm"], c["e"], c["sms"], c["k0"], c["bf16_peak"]
    # selective: the L // 2 blocks memory.py checkpoints (none with one block per stage)
    frac_fwd = {"none": 0.0, "selective": (L // 2) / L, "full": 1.0, "selective-op": 0.0}[s.checkpointing]
    if s.recompute_layers:
        frac_fwd = recomputed_blocks(m, s) / L
    # the fused elementwise forward is a third of its bytes; the eager ops' forward share is measured (unfused.py)
    ew_fwd = (ew_bytes - unfused_bytes(m, s, L)) / 3 + unfused_bytes(m, s, L, forward=True)
    recompute = frac_fwd * (gemm_block / passes + attn * fwd_share + (ew_fwd + L * quant_fwd) / hbm)
    if s.checkpointing == "selective-op":
        recompute = 0.5 * gemm_block / passes + ew_fwd / hbm
    tok, width = s.micro_batch * s.seq / s.cp / s.tp, 4 if s.precision == "fp32" else 2
    if "mlp" in s.recompute_modules:   # the MLP's forward GEMMs and activation again
        n_mlp = 3 if m.gated_mlp else 2
        recompute += (gemm_block / passes * _gemm_s(block[-n_mlp:], bf16_peak, e, 1, sms, k0)
                      / _gemm_s(block, bf16_peak, e, 1, sms, k0))
        recompute += L * tok * (3 * m.ffn if m.gated_mlp else 2 * m.ffn) * width / hbm
        recompute += unfused_bytes(m, s, L, forward=True, ops=("swiglu",) if "swiglu" in s.unfused_ops else ()) / hbm
    if "core_attn" in s.recompute_modules:
        recompute += attn * fwd_share
    if "layernorm" in s.recompute_modules:
        recompute += L * tok * 4 * m.hidden * width / hbm   # two norms: read h, write h
    return recompute


def _offload_time(m: ModelSpec, s: TrainSetup, L: float) -> float:
    """Activation offload: out after the forward, back before the backward, on a side stream (exposed beyond
    compute: estimate.py)."""
    if not s.offload_activations:
        return 0.0
    per_block = act_bytes_per_layer(m, s)
    if s.checkpointing == "full" and not s.recompute_layers:
        # a checkpointed block saves only its input, so that is all its offload moves (torchtune offloads the
        # saved tensors of the checkpointed blocks), as memory.py counts it
        per_block = s.seq * s.micro_batch / (s.tp * s.cp) * m.hidden * (4 if s.precision == "fp32" else 2)
    moved = min(s.offload_activations, L) * per_block
    return 2 * moved / _host_bps(s)


def _host_bps(s: TrainSetup) -> float:
    """Bytes/s each way between this GPU and its host: NVLink-C2C on Grace boards, PCIe elsewhere (HOST_GBS)."""
    return HOST_GBS.get(s.gpu.key, HOST_GBS["pcie"]) * 1e9


def _optimizer_time(m: ModelSpec, s: TrainSetup, hbm: float) -> float:
    """The optimizer step over this GPU's shard of the parameters, per step (none without a step)."""
    if s.optimizer == NO_STEP:
        return 0.0
    P_shard = m.n_params() / (s.tp * s.pp) / (s.shards if s.sharding != "none" else 1)
    if s.lora_rank:
        from overdrive.plan.memory import lora_params

        P_shard = lora_params(m, s.lora_rank) / (s.tp * s.pp)
    if s.offload != "none":
        return 6 * P_shard / _host_bps(s) + P_shard / 1e9   # grads out + 16-bit weights back: 6 B, then the CPU step
    # AdamW: read p, g, m, v and write p, m, v (fp32: 28 bytes) + the grad-norm pass (4); 8 fewer per state
    return (16 + 8 * OPTIMIZER_STATES[s.optimizer]) * P_shard / hbm


BF16_ACCUM_BYTES = 18.0
"""HBM bytes per parameter DeepSpeed's BF16_Optimizer moves after every micro-batch's backward under its
PipelineEngine (deepspeed/runtime/pipe/engine.py `_exec_backward_pass` calls `update_hp_grads`;
deepspeed/runtime/bf16_optimizer.py @ 196e63ac: `hp_grad.data.add_(lp.grad.data.to(hp_grad.dtype))`): the cast
of the bf16 gradient to a new fp32 tensor (read 2, write 4) and the in-place add into the fp32 accumulator (read
4 + 4, write 4)."""
NANOTRON_ACCUM_BYTES = 10.0
"""nanotron's fp32 accumulation after every backward (--zero-sliced; gradient_accumulator.py `_accumulate_grad`:
`fp32_grad.add_(half_param.grad)`, the bf16 gradient promoted inside the add): read 2 + 4, write 4."""


def _grad_accum_time(m: ModelSpec, s: TrainSetup, hbm: float) -> float:
    """Per micro-batch: DeepSpeed's BF16_Optimizer (BF16_ACCUM_BYTES) or nanotron's accumulator
    (NANOTRON_ACCUM_BYTES) folds the 16-bit gradients into fp32 ones."""
    per = (BF16_ACCUM_BYTES if s.deepspeed_pipeline and s.precision == "bf16" else
           NANOTRON_ACCUM_BYTES if s.zero_sliced else 0.0)
    return per * m.n_params() / (s.tp * s.pp) / hbm


def compute_times(m: ModelSpec, s: TrainSetup, cal: dict | None = None) -> dict[str, float]:
    """Seconds per micro-batch on the busiest GPU (the last pipeline stage), by op class; plus
    `optimizer` seconds per step."""
    cal = cal or CALIBRATION
    c = _ctx(m, s, cal)
    L = c["L"]
    passes = 2.0 if s.lora_rank else 3.0
    block = _block_gemms(m, s, s.micro_batch * s.seq / s.cp)   # tokens through each GEMM (SP gathered)
    gemm_block, head, lowp_share, quant_b = _gemm_terms(m, s, cal, c, block, passes)
    attn, fwd_share = _attention_time(m, s, cal, c)
    ew_bytes = _elementwise_bytes(m, s, cal, L)
    tok = s.micro_batch * s.seq / s.cp / s.tp      # tokens per GPU in the memory-bound ops
    # the loss kernel is --loss's; "standard" on the megatron stack is Megatron's own vocab-parallel one
    loss_b = loss_bytes_per_logit(s) + (Z_LOSS_BYTES if s.z_loss and s.loss in ("standard", "hf", "compiled-fp32", "megatron-v07") else 0)
    memory = (ew_bytes + L * quant_b[0] + tok * m.vocab * loss_b) / c["hbm"]
    recompute = _recompute_time(m, s, c, block, gemm_block, attn, fwd_share, ew_bytes, quant_b[1], passes)
    return {"gemm": gemm_block + head, "attention": attn, "memory": memory, "recompute": recompute,
            "forward": (gemm_block + head) / passes + attn * fwd_share + memory / 3,   # what no gradient is ready in
            "optimizer": _optimizer_time(m, s, c["hbm"]), "lowp_share": lowp_share, "offload": _offload_time(m, s, L),
            "grad_accum": _grad_accum_time(m, s, c["hbm"])}
