"""Module-swap helpers every low-precision linear shares: a new module holding the user's own Parameters,
and the token padding each engine's shape rules call for (`formats.tokens_multiple`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["new_like", "pad_tokens", "token_padded"]


def new_like(cls, m: nn.Linear, **kw) -> nn.Module:
    """A `cls` built on the meta device, then given `m`'s own Parameters (no copy, same state_dict keys)."""
    new = cls(m.in_features, m.out_features, bias=m.bias is not None, device="meta", **kw)
    new.weight = m.weight
    if m.bias is not None:
        new.bias = m.bias
    return new


_PADDED: dict[tuple[type, int], type] = {}


def pad_tokens(x: torch.Tensor, multiple: int, fn) -> torch.Tensor:
    """`fn` on x flattened to (M, K) with M zero-padded up to a multiple of `multiple`; the padded rows
    of the output sliced off. Zero rows add nothing to grad-weight, never raise a block's amax, and
    their outputs (so their gradients) are dropped."""
    m = x.numel() // x.shape[-1]
    x2 = x.reshape(m, x.shape[-1])                                # (M, K)
    pad = (-m) % multiple
    y = fn(F.pad(x2, (0, 0, 0, pad)) if pad else x2)              # (M + pad, N)
    return (y[:m] if pad else y).reshape(*x.shape[:-1], y.shape[-1])


def token_padded(cls: type, multiple: int) -> type:
    """`cls` with its input's tokens zero-padded to a multiple of `multiple` (from `formats.shape_rules`,
    where each engine's rule is cited). The grad-weight GEMM reduces over the tokens (M), so the FP8 GEMMs'
    leading-dimension rules land on M: Transformer Engine's per-tensor FP8 and torchao's `_scaled_mm` need
    M % 16, the MXFP8 casts and TE's NVFP4 transpose-cast M % 32, torchao's NVFP4 Triton GEMM M % 128 (it
    reads M as `input.shape[-2]`, so the input goes in flattened)."""
    key = (cls, multiple)
    if key not in _PADDED:
        def forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
            return pad_tokens(x, multiple, lambda x2: cls.forward(self, x2, *args, **kwargs))

        # The engine's module name kept: TE modules are recognised by it (state_dict `_extra_state`).
        _PADDED[key] = type(f"TokenPadded{cls.__name__}", (cls,), {"forward": forward, "__module__": cls.__module__})
    return _PADDED[key]

