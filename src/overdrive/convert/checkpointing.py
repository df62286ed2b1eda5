"""Activation checkpointing on the model's repeated blocks, keeping state_dict keys unchanged.

Instead of wrapping each block in a new module (which prefixes every key), the block's own
`forward` is replaced on the instance by one that runs it under torch.utils.checkpoint.
"""

from __future__ import annotations

import functools

from torch import nn
from torch.utils.checkpoint import checkpoint

__all__ = ["find_blocks", "apply_activation_checkpointing"]


def find_blocks(model: nn.Module) -> tuple[str, list[nn.Module]]:
    """The transformer blocks: the largest ModuleList whose children all share one class."""
    best: tuple[int, str, list[nn.Module]] = (0, "", [])
    for fqn, m in model.named_modules():
        if isinstance(m, nn.ModuleList) and len(m) >= 2 and len({type(c) for c in m}) == 1:
            n = sum(p.numel() for p in m.parameters())
            if n > best[0]:
                best = (n, fqn, list(m))
    return best[1], best[2]


def _ckpt_forward(orig, *args, **kwargs):
    return checkpoint(orig, *args, use_reentrant=False, **kwargs)


def apply_activation_checkpointing(model: nn.Module, mode: str, every: int = 2) -> list[str]:
    """Checkpoint all blocks ("full") or blocks 0, k, 2k, ... ("selective"); returns their fqns."""
    if mode == "none":
        return []
    fqn, blocks = find_blocks(model)
    if not blocks:
        raise ValueError("activation checkpointing: no repeated blocks (an nn.ModuleList of one class) found "
                         "in this model; use activation_checkpointing='none'")
    done = []
    for i, b in enumerate(blocks):
        if mode == "full" or i % every == 0:
            if getattr(b, "_overdrive_ckpt", False):
                continue
            b.forward = functools.partial(_ckpt_forward, b.forward)
            b._overdrive_ckpt = True
            done.append(f"{fqn}.{i}" if fqn else str(i))
    return done
