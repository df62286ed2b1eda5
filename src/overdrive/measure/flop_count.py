"""FLOPs counted on the user's own model: `torch.utils.flop_counter.FlopCounterMode` over one
forward+backward of the user's step, so achieved TFLOP/s and MFU exist for any model, not only
for the reference GPT's 6·N + 12·L·H·Q·T formula (bench/flops.py, kept as the cross-check).

What FlopCounterMode counts (torch/utils/flop_counter.py): matmuls (mm, addmm, bmm, baddbmm),
convolutions and attention (SDPA / flash / efficient kernels), forward and backward, 2 FLOPs per
multiply-add. Element-wise ops, norms and the optimizer are not counted: that is the MFU convention
(model FLOPs, as nanoGPT and torchtitan count them). Activation-checkpointing recomputation is not
counted either (it is work, not model progress).

`tuning.flops.count_step_flops` counts the user's step (meta device first, the CPU if that fails);
`rates` turns a count and a step time into TFLOP/s and MFU against the peak of the precision that ran.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["FlopCount", "count_flops", "flop_counter", "peak_for", "rates"]


@dataclass(frozen=True, kw_only=True)
class FlopCount:
    flops: int | None
    """FLOPs of one forward+backward of one step (None: could not be counted, see `note`)."""
    how: str
    """"meta" (shapes only) | "cpu" (one real step on the CPU) | "not counted"."""
    by_op: dict[str, int] = field(default_factory=dict)
    """FLOPs per aten op (mm, addmm, bmm, _scaled_dot_product_*...), the largest first."""
    note: str = ""

    def to_dict(self) -> dict:
        return {"per_step": self.flops, "how": self.how, "by_op": dict(self.by_op), "note": self.note,
                "counter": "torch.utils.flop_counter.FlopCounterMode, one forward+backward"}


def _fused_attention_backward(grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None,
                              **kwargs) -> int:
    """A fused attention kernel's backward, counted as the model's: twice its forward. torch's formula
    (torch/utils/flop_counter.py `sdpa_backward_flop_count`) adds "Step 1: We recompute the scores
    matrix", a fifth bmm, so on a GPU (flash, memory-efficient, cuDNN) attention counted 4 + 10 = 14 L·H·Q·T
    per token where the math path (CPU, meta: what tune counts) and the 12 L·H·Q·T convention count 4 + 8.
    Recomputation is work, not model progress (as for activation checkpointing, above)."""
    from torch.utils.flop_counter import sdpa_flop_count

    return 2 * sdpa_flop_count(query_shape, key_shape, value_shape)


def flop_counter():
    """FlopCounterMode with the MFU convention: a fused attention backward counts twice its forward, so a
    step counts the same on the GPU's fused kernels as on the CPU or meta math path."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    names = ("_scaled_dot_product_flash_attention_backward", "_scaled_dot_product_efficient_attention_backward",
             "_scaled_dot_product_cudnn_attention_backward")
    ops = [getattr(torch.ops.aten, n) for n in names if hasattr(torch.ops.aten, n)]
    return FlopCounterMode(display=False, custom_mapping={op: _fused_attention_backward for op in ops})


def count_flops(run_step: Callable[[], object]) -> tuple[int, dict[str, int]]:
    """(total FLOPs, per-op FLOPs) of `run_step()` (which runs a forward and its backward)."""
    with flop_counter() as fc:
        run_step()
    ops = {str(op).split(".")[-1] if "." in str(op) else str(op): int(n)
           for op, n in fc.get_flop_counts().get("Global", {}).items()}
    return int(fc.get_total_flops()), dict(sorted(ops.items(), key=lambda kv: -kv[1]))


def peak_for(precision: str, spec) -> tuple[float | None, str]:
    """The dense peak (TFLOP/s) a step in `precision` runs its matmuls against, and its label.
    fp32 matmuls run at the FP32 peak unless TF32 is allowed (torch's default is not to)."""
    if spec is None:
        return None, "no peak known for this device"
    if precision in ("fp8",) and spec.fp8_tflops:
        return spec.fp8_tflops, f"FP8 {spec.fp8_tflops:g}"
    if precision == "fp4" and getattr(spec, "fp4_tflops", None):
        return spec.fp4_tflops, f"FP4 {spec.fp4_tflops:g}"
    if precision in ("bf16", "fp16", "fp8", "fp4"):
        return spec.bf16_tflops, f"BF16 {spec.bf16_tflops:g}"
    import torch

    if torch.get_float32_matmul_precision() != "highest":
        return spec.tf32_tflops, f"TF32 {spec.tf32_tflops:g}"
    return spec.fp32_tflops, f"FP32 {spec.fp32_tflops:g}"


def rates(flops_per_step: int | None, step_ms: float | None, *, precision: str, spec=None,
          emulated: bool = False) -> dict:
    """Achieved TFLOP/s of a step, and MFU against the peak of the precision it ran (plus against the
    BF16 peak, so rows in different precisions compare). No MFU on CPU (no peak) or when emulated."""
    out = {"tflops": None, "mfu": None, "mfu_peak": None, "mfu_bf16_peak": None}
    if not flops_per_step or not step_ms or step_ms <= 0:
        return out
    tflops = flops_per_step / (step_ms / 1e3) / 1e12
    out["tflops"] = tflops
    if spec is None or emulated:
        return out
    peak, label = peak_for(precision, spec)
    if peak:
        out["mfu"], out["mfu_peak"] = tflops / peak, f"{label} TFLOP/s ({spec.name})"
    out["mfu_bf16_peak"] = tflops / spec.bf16_tflops
    return out
