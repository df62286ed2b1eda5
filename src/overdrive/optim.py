"""AdamW by implementation: Apex FusedAdam, torch fused, torch foreach, torch for-loop."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["build_adamw", "param_groups"]


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Decay matrices (embeddings, linears); not biases or norm gains (the nanoGPT split)."""
    decay, no_decay, seen = [], [], set()
    for p in model.parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        (decay if p.dim() >= 2 else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    return groups


def build_adamw(model: nn.Module, impl: str, *, lr: float, betas: tuple[float, float] = (0.9, 0.95),
                weight_decay: float = 0.1, eps: float = 1e-8) -> torch.optim.Optimizer:
    groups = param_groups(model, weight_decay)
    if impl == "apex":
        from apex.optimizers import FusedAdam

        return FusedAdam(groups, lr=lr, betas=betas, eps=eps, adam_w_mode=True)
    kw = {"torch-fused": {"fused": True}, "foreach": {"foreach": True},
          "for-loop": {"foreach": False, "fused": False}}.get(impl)
    if kw is None:
        raise ValueError(f"unknown AdamW implementation {impl!r}")
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, **kw)
