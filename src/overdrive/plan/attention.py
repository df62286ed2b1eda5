"""The fused attention kernel the planner times: which one a stack runs on a GPU generation (`attention_kernel`),
the share of the bf16 peak its published benchmarks reach (`ATTN_PEAK_SHARE`), and how that share falls at short
sequences (`ATTN_SEQ_RATE`); the head dim a kernel pads to (`padded_head_dim`) is planned, what a compiled head dim
other than 128 would do (`ATTN_HEAD_DIM`) is shown, not planned. throughput.py times attention's FLOPs at that share ×
the padding × the fitted `attn_rel`."""

from __future__ import annotations

import math

from overdrive.plan.setup import TrainSetup

__all__ = ["ATTN_PEAK_SHARE", "TRITON_VS_FA2", "FA1_VS_FA2", "ATTN_SEQ_RATE", "ATTN_HEAD_DIM", "CUDNN_HINT",
           "attention_kernel", "fa2_by_default",
           "attention_share", "attention_override", "head_dim_ratio", "KERNEL_HEAD_DIMS", "padded_head_dim",
           "head_dim_padding", "KERNEL_MAX_HEAD_DIM", "head_dim_refusal",
           "KERNEL_NAMES"]

TRITON_VS_FA2 = 3.5 / (1.4 * 1.0 + 2.0 * 2.5)
"""FlashAttention's Triton kernel (flash_attn_triton.py) over FlashAttention-2, forward + backward weighted 1 : 2.5:
the FlashAttention-2 paper (Dao 2023, section 4.1, A100) has FlashAttention-2 "around 1.3-1.5x faster than
FlashAttention in Triton in the forward pass and around 2x faster in the backward pass" (1.4 and 2 taken): 0.55."""
FA1_VS_FA2 = 0.5
"""FlashAttention (flash-attn 1.x) over FlashAttention-2: the FlashAttention-2 paper (Dao 2023) reports FlashAttention-2
"around 2x" faster ("1.7-3.0x faster than FlashAttention", section 4, A100; FlashAttention at "25-40% of the
theoretical maximum FLOPs/s" against FlashAttention-2's 50-73%): 0.5, the same sm80 MMA code on Hopper."""
ATTN_PEAK_SHARE = {"fa2": {8: 0.60, 9: 0.33, 10: 0.26}, "cudnn": {8: 0.60, 9: 0.53, 10: 0.50}, "fa3": {9: 0.58},
                   "triton": {8: round(0.60 * TRITON_VS_FA2, 2), 9: round(0.33 * TRITON_VS_FA2, 2)},
                   "fa1": {8: round(0.60 * FA1_VS_FA2, 3), 9: round(0.33 * FA1_VS_FA2, 3)}}
"""Share of the dense bf16 peak a fused attention kernel reaches, head dim 128, forward (causal) + backward weighted
1 : 2.5 by FLOPs, at 16K tokens. Hopper: FlashAttention-3 paper (Shah et al. 2024), H100 SXM5 figures: FlashAttention-2
forward 335 and backward 322 TFLOP/s (0.33 of 989; the paper's "35% utilization"), cuDNN 539 and 516 (0.53),
FlashAttention-3 616 and 561 (0.58; its kernels are sm90's alone: `setup_checks` refuses --attention fa3 on other
GPUs, so its table has Hopper's entry only); the paper plots the backward without the causal mask. Ampere:
FlashAttention-2 paper (Dao 2023), "50-73% of the theoretical maximum FLOPs/s on A100": 0.60 assumed inside that
range (its A100 forward+backward figure is a plot only); cuDNN's fused attention on sm80 taken as the same class.
Blackwell, assumed: FlashAttention-4 (Zadouri et al. 2026) reaches up to 71% of a B200 forward and "up to 1.3x" cuDNN
9.13, with a backward bound by shared-memory traffic and no backward rate published: cuDNN 0.50; FlashAttention-2
has no Blackwell-native path (sm80 MMA, as Triton's kernels, which FlashAttention-4 outruns up to 2.7x): 0.26.
triton, FlashAttention's 2022 Triton kernel (MPT's `attn_impl: triton`, llm-foundry's benchmarks): FlashAttention-2's
share × `TRITON_VS_FA2` on both generations it runs on (its pre-MLIR compiler emits the same sm80 MMA code on Hopper,
as FlashAttention-2 does; no Hopper figure of it is published). fa1, FlashAttention (flash-attn 1.x): FlashAttention-2's
share × `FA1_VS_FA2` on Ampere and Hopper (its kernels are sm75/sm80 code)."""
ATTN_SEQ_RATE = ((512, 0.61), (1024, 0.79), (2048, 0.90), (4096, 0.96), (8192, 0.99), (16384, 1.0))
"""The kernels' rate at a sequence length, relative to 16K tokens (FlashAttention-3 paper, H100, head dim 128, the
same tokens per launch: FlashAttention-2 and cuDNN alike, forward causal 0.57-0.58 at 512, 0.89-0.90 at 2K, 0.95-0.96
at 4K; backward, plotted without the mask, 0.59-0.66, 0.90, 0.96-0.97): short sequences spend more of each query tile on its prologue and
the causal diagonal. Log-linear between the points; flat past 16K."""
ATTN_HEAD_DIM = {"fa2": ((64, 0.89), (128, 1.0), (256, 0.89)), "cudnn": ((64, 0.72), (128, 1.0), (256, 0.94))}
"""A kernel's rate at a head dim relative to 128 (FlashAttention-3 paper, H100 SXM5, causal forward at 16K:
FlashAttention-2 299 / 335 / 298 TFLOP/s at head dim 64 / 128 / 256, cuDNN 388 / 539 / 509). Shown by `--explain`,
not planned: timing attention at these ratios was tried (2026-12-03) and left leave-one-source-out's worst 1.5 points
higher and TinyLlama's head-dim-64 A100 row 2 points further off (the ratios are H100's forward alone), so a compiled
head dim other than 128 is planned at 128's rate and said to be. The padding to a compiled head dim is planned
(`head_dim_padding`): its zeros are computed, whatever the kernel's rate."""
KERNEL_HEAD_DIMS = {"fa2": (32, 64, 96, 128, 160, 192, 224, 256), "fa3": (64, 96, 128, 192, 256), "fa1": (32, 64, 128)}
"""The head dims a kernel is compiled for; a head runs in the smallest that holds it, its tiles that wide, the rest
zeros. FlashAttention-2: HEADDIM_SWITCH (csrc/flash_attn/src/static_switch.h; PyTorch's vendored copy,
aten/src/ATen/native/transformers/cuda/flash_attn, keeps the 224 that flash-attn 2 itself has since dropped: 193-224
pad to 256 there); SDPA first pads a head dim to a multiple of 8 (attention.cpp, pad_last_dim<8>), 100 runs as 128.
FlashAttention-3: round_up_headdim (hopper/flash_api.cpp). The Triton kernel (flash_attn/flash_attn_triton.py @
00583fb1) tiles at BLOCK_HEADDIM = max(triton.next_power_of_2(d), 16), masking the loads past d. cuDNN's tiling is
not published: planned unpadded. FlashAttention 1.x (csrc/flash_attn/fmha_api.cpp): its first releases took head
sizes 16, 32, 64 and 128 alone; 1.0 takes any multiple of 8 up to 128 and runs it in the 32-, 64- or 128-wide kernel.
"""
KERNEL_MAX_HEAD_DIM = {"fa2": 256, "fa3": 256, "cudnn": 256, "triton": 128, "fa1": 128}
"""The widest head each kernel takes (the Triton kernel asserts d <= 128; PyTorch's cuDNN backend takes 256 on Hopper
with cuDNN >= 9.1, 128 before); past it the kernel does not run."""
NEEDS_MULTIPLE_OF_8 = ("fa3", "cudnn", "fa1")
"""Kernels that refuse a head dim not divisible by 8 rather than pad it (flash-attn 3's check; PyTorch's
check_cudnn_tensor_shapes; flash-attn 1.0's head_size % 8)."""


def padded_head_dim(kernel: str, head_dim: int) -> int:
    """The head dim `kernel` computes a head of `head_dim` at (`KERNEL_HEAD_DIMS`); unpadded where not known or
    past the widest the kernel takes (`KERNEL_MAX_HEAD_DIM`: it would not run, `--explain` says so)."""
    d = max(1, int(head_dim))
    if d > KERNEL_MAX_HEAD_DIM.get(kernel, d):
        return d
    if kernel == "triton":
        return max(16, 1 << (d - 1).bit_length())
    return next((t for t in KERNEL_HEAD_DIMS.get(kernel, ()) if t >= d), d)


def head_dim_padding(s: TrainSetup, head_dim: int) -> float:
    """The share of the kernel's tile FLOPs that are the model's: head_dim / the padded head dim (1 when none)."""
    return max(1, int(head_dim)) / padded_head_dim(attention_kernel(s), head_dim)


KERNEL_NAMES = {"fa2": "FlashAttention-2", "fa3": "FlashAttention-3", "cudnn": "cuDNN's fused attention",
                "triton": "FlashAttention's Triton kernel", "fa1": "FlashAttention (1.x)"}


def head_dim_refusal(kernel: str, head_dim: int, sm: tuple[int, int] = (8, 0)) -> str:
    """Why `kernel` would not run a head of `head_dim` on an `sm` GPU (planned as if it did, said wherever the plan
    is), or ''."""
    name = KERNEL_NAMES.get(kernel, kernel)
    if kernel == "fa1" and 64 < head_dim <= KERNEL_MAX_HEAD_DIM["fa1"] and tuple(sm) not in ((8, 0), (9, 0)):
        # flash-attn 1.x's README: "Head dim > 64 backward requires A100 or H100"
        return (f"{name}'s backward takes head dims over 64 on A100 and H100 alone: {head_dim} would not train on "
                f"sm{sm[0]}{sm[1]}; --attention fa2 does")
    if head_dim > KERNEL_MAX_HEAD_DIM.get(kernel, head_dim):
        return (f"{name} takes head dims up to {KERNEL_MAX_HEAD_DIM[kernel]}: {head_dim} would not run there"
                + ("; --attention fa2 takes up to 256" if kernel in ("triton", "fa1")
                   else "; --attention unfused has no limit"))
    if kernel in NEEDS_MULTIPLE_OF_8 and head_dim % 8:
        return (f"{name} needs a head dim divisible by 8: {head_dim} would not run there; --attention fa2 pads it "
                "(planned at its own tiles)")
    return ""


def attention_kernel(s: TrainSetup) -> str:
    """The attention kernel planned: --attention's, or with flash the stack's own. Megatron-Core calls Transformer
    Engine's fused attention (cuDNN's kernels). PyTorch: cuDNN's on Blackwell (torchtitan since 2025-05 puts it first
    on sm100), FlashAttention-2's on Ampere and Hopper (flash-attn 2; SDPA's flash backend, first in PyTorch
    2.5.1-2.10's CUDA 12 wheels; torchtitan before 2025-10). PyTorch >= 2.11 (2.10 with CUDA 13: a cuDNN newer than
    9.15) and torchtitan since 2025-10 pick cuDNN's on H100 too: --attention cudnn."""
    if s.attention != "flash":
        return s.attention
    return "cudnn" if s.stack == "megatron" or s.gpu.sm[0] >= 10 else "fa2"


CUDNN_HINT = "PyTorch >= 2.11 (2.10 with CUDA 13) and torchtitan since 2025-10 run cuDNN's on Hopper: --attention cudnn"
"""Said wherever the PyTorch stack on Hopper is planned with FlashAttention-2 by default (`fa2_by_default`)."""


def fa2_by_default(s: TrainSetup) -> bool:
    """PyTorch on Hopper, --attention left to the stack: planned as FlashAttention-2, which newer PyTorch is not."""
    return s.attention == "flash" and attention_kernel(s) == "fa2" and s.gpu.sm[0] == 9


def _loglinear(pts, x: float) -> float:
    """Piecewise log-linear through (x, y) points, flat outside them."""
    if x <= pts[0][0]:
        return pts[0][1]
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if x <= x1:
            return y0 + (y1 - y0) * math.log2(x / x0) / math.log2(x1 / x0)
    return pts[-1][1]


def head_dim_ratio(s: TrainSetup, head_dim: int) -> float:
    """The kernel's published rate at `head_dim` relative to 128 (`ATTN_HEAD_DIM`; shown, not planned)."""
    # FlashAttention-3's own head-dim curve is not in the table read: shown on cuDNN's, the other Hopper-native one;
    # the Triton kernel's and FlashAttention 1.x's on FlashAttention-2's, the same sm80 MMA code
    kernel = attention_kernel(s)
    curve = ATTN_HEAD_DIM.get(kernel, ATTN_HEAD_DIM["fa2" if kernel in ("triton", "fa1") else "cudnn"])
    return _loglinear(curve, max(head_dim, 1))


def attention_share(s: TrainSetup, seq: float) -> float:
    """The kernel's share of the bf16 peak at `seq` tokens per rank (`ATTN_PEAK_SHARE` × `ATTN_SEQ_RATE`)."""
    table = ATTN_PEAK_SHARE[attention_kernel(s)]
    share = table.get(s.gpu.sm[0], table[9])
    pts = ATTN_SEQ_RATE
    if seq < pts[0][0]:   # the first segment's slope carried below 512, floored at a tenth
        (s0, r0), (s1, r1) = pts[0], pts[1]
        return share * max(0.1, r0 - (r1 - r0) * math.log2(s0 / max(seq, 1.0)))
    return share * _loglinear(pts, seq)


def attention_override(s: TrainSetup, cal: dict) -> float:
    """--efficiency / --calibrate over the calibrated GEMM efficiency: a measured whole-model rate (or a throttled
    card) slows attention in the same proportion as the GEMMs."""
    if s.efficiency is None:
        return 1.0
    table = cal["gemm_eff"][s.stack]
    return s.efficiency / table.get(s.gpu.sm[0], table[9])
