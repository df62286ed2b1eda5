"""FP8 linears: nn.Linear → torchao Float8Linear (real or emulated) or te.Linear.

Which layers convert is decided here, once, and reported per layer:
- dims not divisible by 16 cannot run (FP8 GEMMs need K and N % 16 == 0): always skipped;
- on real FP8 hardware, layers with in or out features < `fp8_min_dim` are skipped — the
  cast/scale overhead outweighs the faster GEMM there; emulation converts them (numerics only);
- the output head stays in high precision unless `fp8_convert_head` (most sensitive layer).
A user `module_filter_fn(module, fqn) -> bool` replaces the size and head rules (not the
divisibility rule).
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable

import torch
from torch import nn

from overdrive.convert.swap import LayerDecision, share_params, swap_modules

__all__ = ["fp8_layer_policy", "convert_fp8", "HEAD_NAMES"]

HEAD_NAMES = ("lm_head", "head", "output", "classifier", "score", "embed_out")


def _tied_weight_ids(model: nn.Module) -> set[int]:
    return {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}


def fp8_layer_policy(model: nn.Module, *, emulated: bool, min_dim: int, convert_head: bool,
                     module_filter_fn: Callable[[nn.Module, str], bool] | None = None
                     ) -> Callable[[nn.Module, str], tuple[bool, str] | None]:
    tied = _tied_weight_ids(model)

    def decide(m: nn.Module, fqn: str) -> tuple[bool, str] | None:
        if not isinstance(m, nn.Linear):
            if type(m).__name__ == "Conv1D" and hasattr(m, "nf"):  # transformers' GPT-2 projection
                return False, "transformers Conv1D, not an nn.Linear: stays in high precision"
            return None
        if type(m) is not nn.Linear:  # already converted, or a user subclass we must not replace
            return None
        if m.in_features % 16 or m.out_features % 16:
            return False, f"dims {m.in_features}x{m.out_features} not divisible by 16: FP8 GEMM cannot run"
        if module_filter_fn is not None:
            keep = bool(module_filter_fn(m, fqn))
            return keep, "module_filter_fn: " + ("convert" if keep else "skip")
        if not convert_head and (fqn.rsplit(".", 1)[-1] in HEAD_NAMES or id(m.weight) in tied):
            return False, "output head stays in high precision (fp8_convert_head=False)"
        if not emulated and min(m.in_features, m.out_features) < min_dim:
            return False, f"too small to gain ({m.in_features}x{m.out_features} < {min_dim}): cast overhead " \
                          "outweighs the faster GEMM"
        return True, "emulated FP8 (numerics only)" if emulated else "FP8"

    return decide


def _kind(m: nn.Module) -> str:
    if isinstance(m, nn.Linear):
        return f"Linear({m.in_features}→{m.out_features})"
    return type(m).__name__


def convert_fp8(model: nn.Module, *, backend: str, scaling: str, min_dim: int = 1024, convert_head: bool = False,
                module_filter_fn: Callable[[nn.Module, str], bool] | None = None) -> list[LayerDecision]:
    """Swap the chosen linears in place; returns one decision per linear-like layer."""
    emulated = backend == "emulated"
    decide = fp8_layer_policy(model, emulated=emulated, min_dim=min_dim, convert_head=convert_head,
                              module_filter_fn=module_filter_fn)
    if backend in ("torchao", "emulated"):
        from torchao.float8 import Float8LinearConfig
        from torchao.float8.float8_linear import Float8Linear

        cfg = Float8LinearConfig.from_recipe_name(scaling if scaling in ("tensorwise", "rowwise") else "tensorwise")
        if emulated:
            cfg = dataclasses.replace(cfg, emulate=True)
        factory = lambda m, fqn: Float8Linear.from_float(m, config=cfg)  # noqa: E731 (shares weight and bias)
    elif backend == "transformer_engine":
        te = importlib.import_module("transformer_engine.pytorch")

        def factory(m: nn.Module, fqn: str) -> nn.Module:
            new = te.Linear(m.in_features, m.out_features, bias=m.bias is not None, params_dtype=m.weight.dtype,
                            device=m.weight.device)
            with torch.no_grad():
                share_params(m, new)
            return new
    else:
        raise ValueError(f"unknown FP8 backend {backend!r}")
    return swap_modules(model, decide, factory, _kind)
