"""Low-precision linears: nn.Linear → torchao Float8Linear (real or emulated), te.Linear, or the
MXFP8/NVFP4 linears of `convert.mx`. Which layers convert: `convert.policy` (reported per layer).
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable

import torch
from torch import nn

from overdrive.convert.policy import HEAD_NAMES, layer_policy
from overdrive.convert.shape_rules import tokens_multiple
from overdrive.convert.swap import LayerDecision, plan_swaps, share_params, swap_modules

__all__ = ["fp8_layer_policy", "convert_fp8", "HEAD_NAMES", "te_fp8_recipe", "TE_RECIPE_SINCE", "te_linear_like",
           "te_autocast", "TE_FP8_TOKENS_MULTIPLE"]

# The Transformer Engine release each recipe class first shipped in (TE's docs and release notes:
# the 2.0 API lists DelayedScaling and MXFP8BlockScaling; 2.2 adds Float8CurrentScaling; 2.7's
# recipe.Format has no E2M1, 2.8 adds NVFP4BlockScaling).
TE_RECIPE_SINCE = {"delayed": (1, 0), "mxfp8": (2, 0), "tensorwise": (2, 2), "nvfp4": (2, 8)}


def fp8_layer_policy(model: nn.Module, *, emulated: bool, min_dim: int, convert_head: bool,
                     module_filter_fn: Callable[[nn.Module, str], bool] | None = None, fmt: str = "fp8",
                     backend: str | None = None) -> Callable[[nn.Module, str], tuple[bool, str] | None]:
    backend = "emulated" if emulated else (backend or "torchao")
    return layer_policy(model, fmt=fmt, backend=backend, min_dim=min_dim, convert_head=convert_head,
                        module_filter_fn=module_filter_fn)


def _kind(m: nn.Module) -> str:
    if isinstance(m, nn.Linear):
        return f"Linear({m.in_features}→{m.out_features})"
    return type(m).__name__


def te_fp8_recipe(scaling: str | None):
    """The Transformer Engine recipe object for a resolved scaling (resolve checked the TE version)."""
    rec = importlib.import_module("transformer_engine.common.recipe")
    if scaling == "delayed":
        return rec.DelayedScaling(fp8_format=rec.Format.HYBRID, amax_history_len=16, amax_compute_algo="max")
    if scaling == "mxfp8":
        return rec.MXFP8BlockScaling()
    if scaling == "nvfp4":
        return rec.NVFP4BlockScaling()
    return rec.Float8CurrentScaling()


# Transformer Engine's per-tensor FP8 needs the token count M % 16, not 8: its forward asserts
# prod(shape[:-1]) % 8 (`assert_dim_for_fp8_exec`), but the wgrad GEMM general_gemm(x, dy, layout="NT")
# (module/linear.py:1184-1220) reduces over M, and cuBLASLt FP8 checks lda/ldb % 16 ("Caller must pad",
# common/gemm/cublaslt_gemm.cu:161,252): 8 x 3 tokens crashed in backward. The rules: `convert.shape_rules`.
TE_FP8_TOKENS_MULTIPLE = tokens_multiple("fp8", "transformer_engine")


def te_linear_like(te, m: nn.Linear, *, tokens_multiple: int) -> nn.Module:
    """A te.Linear holding `m`'s own Parameters, its input's tokens zero-padded to `tokens_multiple`."""
    from overdrive.convert.mx import _token_padded

    cls = _token_padded(te.Linear, tokens_multiple)
    new = cls(m.in_features, m.out_features, bias=m.bias is not None, params_dtype=m.weight.dtype,
              device=m.weight.device)
    with torch.no_grad():
        share_params(m, new)
    return new


def te_autocast(te_recipe):
    """Transformer Engine's FP8 autocast for `te_recipe`: `te.autocast(enabled=, recipe=)` from TE 2.9
    (transformer_engine/pytorch/quantization.py, v2.9), `te.fp8_autocast(enabled=, fp8_recipe=)` before
    (transformer_engine/pytorch/fp8.py, v2.0-v2.8; deprecated from 2.9). Outside it a te.Linear runs in
    its high-precision dtype: every TE FP8 forward, timed or trained, must run inside."""
    te = importlib.import_module("transformer_engine.pytorch")
    if hasattr(te, "autocast"):
        return te.autocast(enabled=True, recipe=te_recipe)
    return te.fp8_autocast(enabled=True, fp8_recipe=te_recipe)


def _te_factory(m: nn.Module, fqn: str) -> nn.Module:
    te = importlib.import_module("transformer_engine.pytorch")
    return te_linear_like(te, m, tokens_multiple=TE_FP8_TOKENS_MULTIPLE)


def convert_fp8(model: nn.Module, *, backend: str, scaling: str, min_dim: int = 1024, convert_head: bool = False,
                module_filter_fn: Callable[[nn.Module, str], bool] | None = None,
                enable_fsdp_float8_all_gather: bool = False) -> list[LayerDecision]:
    """Swap the chosen linears in place; returns one decision per linear-like layer.

    `scaling` "mxfp8"/"nvfp4" selects the block-scaled formats (`convert.mx`); the rest are per-tensor
    or rowwise FP8. `enable_fsdp_float8_all_gather` (torchao, tensorwise): FSDP2 all-gathers the weights
    in float8."""
    fmt = scaling if scaling in ("mxfp8", "nvfp4") else "fp8"
    if backend not in ("torchao", "emulated", "transformer_engine"):
        raise ValueError(f"unknown FP8 backend {backend!r}")
    decide = layer_policy(model, fmt=fmt, backend=backend, min_dim=min_dim, convert_head=convert_head,
                          module_filter_fn=module_filter_fn)
    if fmt != "fp8":
        from overdrive.convert.mx import mx_factory

        return swap_modules(model, decide, mx_factory(fmt, backend), _kind)
    if backend == "transformer_engine":
        return swap_modules(model, decide, _te_factory, _kind)
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    cfg = Float8LinearConfig.from_recipe_name(scaling if scaling in ("tensorwise", "rowwise") else "tensorwise")
    if backend == "emulated":
        cfg = dataclasses.replace(cfg, emulate=True)
    if enable_fsdp_float8_all_gather:
        cfg = dataclasses.replace(cfg, enable_fsdp_float8_all_gather=True)
    # torchao's public entry point, not Float8Linear.from_float: it also applies torchao's inductor
    # workaround for a Triton fp8 miscompile (NaN in compiled backward on newer torch). Our policy
    # decides, its filter obeys; Float8Linear keeps the user's weight and bias Parameters.
    plan = plan_swaps(model, decide, _kind)
    chosen = {d.fqn for d in plan if d.converted}
    if chosen:
        convert_to_float8_training(model, config=cfg, module_filter_fn=lambda m, fqn: fqn in chosen)
        if backend == "torchao":
            _pad_float8_tokens(model, chosen)
    return plan


def _pad_float8_tokens(model: nn.Module, chosen: set[str]) -> None:
    """torchao's Float8Linear pads nothing: its wgrad torch.mm(grad_output.t(), input) (float8/float8_linear.py:
    197-200) becomes `_scaled_mm` with mat1 (N, M), and ATen requires mat1's trailing dim M % 16 (ScaledBlas.cpp
    `_scaled_mm_out_cuda`). Its `pad_inner_dim` (float8/config.py:231, off by default) would pad and re-lay-out
    both operands of every GEMM, every step, aligned or not (float8_ops.py:335-345); padding the tokens costs
    nothing when M % 16 == 0 (the usual batch x sequence) and one zero pad of x otherwise. The emulated path
    never calls `_scaled_mm` and is left as it is."""
    from torchao.float8.float8_linear import Float8Linear

    from overdrive.convert.mx import _token_padded

    padded = _token_padded(Float8Linear, tokens_multiple("fp8", "torchao"))
    for fqn, m in model.named_modules():
        if fqn in chosen and type(m) is Float8Linear:
            m.__class__ = padded  # same module, same Parameters and state_dict keys; only forward pads
