"""Which linear layers go to a low-precision format, decided once and reported per layer.

Rules, in order (a user `module_filter_fn(module, fqn) -> bool` replaces rules 3-6, never 1-2):
1. Only plain `nn.Linear` is replaced. Modules that hold linears the engines cannot take over are
   reported, not silently passed: HF `Conv1D` (GPT-2: a transposed Linear whose weight is (in, out))
   and `nn.MultiheadAttention` (its packed q/k/v weight and out_proj run inside
   F.multi_head_attention_forward).
2. GEMM dims must meet the engine's shape rules (`formats.shape_rules`, each cited): FP8 16 (cuBLAS FP8),
   MXFP8 32 (one E8M0 scale per 32), NVFP4 32 in Transformer Engine (16-byte TMA alignment of FP4 data),
   128 in torchao's Triton NVFP4 kernels, 16 emulated (one E4M3 scale per 16).
3. The output head stays in high precision unless `convert_head` (torchtitan keeps `output` in bf16
   in its float8 and MXFP8 runs).
4. The format's own layers kept in bf16 (`Format.keep_leaves`): MXFP8 keeps the attention K/V projections
   (`wk`, `wv`, `k_proj`, `v_proj`), as torchtitan's MXFP8 runs filter them: in GQA models they are the
   smallest GEMMs and among the most sensitive.
5. The format's last blocks kept in bf16 (`Format.keep_last_fraction`): NVFP4 keeps the last ~16% (NVIDIA's
   NVFP4 pretraining recipe keeps about 16% of linear layers, the final ones, in BF16 for stability).
6. On real hardware, layers with in or out features < `min_dim` stay in high precision: the cast and
   scale overhead outweighs the faster GEMM there. Emulation converts them (numerics only).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from torch import nn

from overdrive.formats import EMULATED, dims_multiple, get_format

__all__ = ["layer_policy", "HEAD_NAMES", "dims_multiple"]

HEAD_NAMES = ("lm_head", "head", "output", "classifier", "score", "embed_out")
_ENGINE_MODULES = ("torchao", "transformer_engine", "overdrive.convert")


def _tied_weight_ids(model: nn.Module) -> set[int]:
    return {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}


def _last_blocks(model: nn.Module, fraction: float) -> tuple[dict[str, str], int, int]:
    """{block fqn prefix: label} for the last ceil(fraction * n) blocks of the model's block list."""
    from overdrive.convert.checkpointing import find_blocks

    fqn, blocks = find_blocks(model)
    if not blocks:
        return {}, 0, 0
    k = max(1, math.ceil(fraction * len(blocks)))
    pre = f"{fqn}." if fqn else ""
    return {f"{pre}{i}.": f"{pre}{i}" for i in range(len(blocks) - k, len(blocks))}, k, len(blocks)


def layer_policy(model: nn.Module, *, fmt: str = "fp8", backend: str = "torchao", min_dim: int = 1024,
                 convert_head: bool = False, module_filter_fn: Callable[[nn.Module, str], bool] | None = None
                 ) -> Callable[[nn.Module, str], tuple[bool, str] | None]:
    """`decide(module, fqn)` -> (convert?, why) for linear-like modules, None for the rest."""
    emulated = backend == EMULATED
    tied = _tied_weight_ids(model)
    mult = dims_multiple(fmt, backend)
    f = get_format(fmt)
    name = f.label
    kept, k, n = _last_blocks(model, f.keep_last_fraction) if f.keep_last_fraction else ({}, 0, 0)

    def decide(m: nn.Module, fqn: str) -> tuple[bool, str] | None:
        if isinstance(m, nn.MultiheadAttention):
            return False, (f"nn.MultiheadAttention runs its q/k/v (packed in_proj_weight) and out_proj inside "
                           f"F.multi_head_attention_forward, which no {name} module can take over: stays in high "
                           "precision (use separate nn.Linear projections to convert them)")
        if not isinstance(m, nn.Linear):
            if type(m).__name__ == "Conv1D" and hasattr(m, "nf"):  # transformers' GPT-2 projection
                return False, (f"transformers Conv1D (a transposed Linear), not an nn.Linear: stays in high "
                               f"precision, {name} does not apply to it")
            return None
        if type(m) is not nn.Linear:
            if type(m).__module__.startswith(_ENGINE_MODULES) or type(m).__name__ == \
                    "NonDynamicallyQuantizableLinear":
                return None  # already converted, or reported with its nn.MultiheadAttention
            return False, f"{type(m).__name__} subclasses nn.Linear with its own forward: not replaced"
        if m.in_features % mult or m.out_features % mult:
            return False, (f"dims {m.in_features}x{m.out_features} not divisible by {mult}: the {name} GEMM "
                           f"({backend}) cannot run")
        if module_filter_fn is not None:
            keep = bool(module_filter_fn(m, fqn))
            return keep, "module_filter_fn: " + ("convert" if keep else "skip")
        leaf = fqn.rsplit(".", 1)[-1]
        if not convert_head and (leaf in HEAD_NAMES or id(m.weight) in tied):
            return False, "output head stays in high precision (fp8_convert_head=False)"
        if leaf in f.keep_leaves:
            return False, f.keep_why
        block = next((lbl for pre, lbl in kept.items() if fqn.startswith(pre)), None)
        if block is not None:
            return False, (f"in {block}, one of the last {k} of {n} blocks: stays in bf16 (NVIDIA's {name} recipe "
                           f"keeps ~{f.keep_last_fraction:.0%} of layers, the final ones, in high precision)")
        if not emulated and min(m.in_features, m.out_features) < min_dim:
            return False, f"too small to gain ({m.in_features}x{m.out_features} < {min_dim}): cast overhead " \
                          "outweighs the faster GEMM"
        return True, f"emulated {name} (numerics only)" if emulated else f"{name} ({backend})"

    return decide
