"""Activation checkpointing on the model's repeated blocks, keeping state_dict keys unchanged.

Instead of wrapping each block in a new module (which prefixes every key), the block's own
`forward` is replaced on the instance by one that runs it under torch.utils.checkpoint.

Blocks are the children of an `nn.ModuleList` or `nn.Sequential` that all share one class (HF
Llama's `model.layers`, GPT-2's `transformer.h`, timm ViT's `blocks` Sequential, T5's
`encoder.block` and `decoder.block`): the largest such list, and every other list of that class.
"""

from __future__ import annotations

import functools

from torch import nn
from torch.utils.checkpoint import checkpoint

__all__ = ["find_blocks", "find_block_groups", "apply_activation_checkpointing", "prepare_hf_model",
           "hf_checkpointing_on"]


def _candidates(model: nn.Module) -> list[tuple[int, str, nn.Module]]:
    out = []
    for fqn, m in model.named_modules():
        if isinstance(m, (nn.ModuleList, nn.Sequential)) and len(m) >= 2 and len({type(c) for c in m}) == 1:
            n = sum(p.numel() for p in m.parameters())
            if n:
                out.append((n, fqn, m))
    return out


def find_block_groups(model: nn.Module) -> list[tuple[str, list[nn.Module]]]:
    """Every list of repeated blocks: the largest one, plus the others whose children share its class
    and that do not sit inside an already chosen list (e.g. T5's encoder and decoder stacks)."""
    cands = _candidates(model)
    if not cands:
        return []
    _, _, top = max(cands, key=lambda c: c[0])
    cls = type(top[0])
    groups: list[tuple[str, list[nn.Module]]] = []
    for _, fqn, m in sorted(cands, key=lambda c: c[1]):
        if type(m[0]) is not cls:
            continue
        if any(fqn.startswith(g + ".") for g, _ in groups if g):
            continue
        groups.append((fqn, list(m)))
    return groups


def find_blocks(model: nn.Module) -> tuple[str, list[nn.Module]]:
    """The largest list of repeated blocks: (its fqn, its blocks); ("", []) when there is none."""
    cands = _candidates(model)
    if not cands:
        return "", []
    _, fqn, m = max(cands, key=lambda c: c[0])
    return fqn, list(m)


def prepare_hf_model(model: nn.Module) -> list[tuple[str, str]]:
    """What a Hugging Face model needs before its blocks are recomputed, as HF's own
    gradient_checkpointing_enable() does: no KV cache while training (a cache filled during the
    forward is not filled again in the recompute, so the saved tensors differ: CheckpointError).
    Returns (what, why) notes."""
    if hf_checkpointing_on(model):
        return [("model's own", "Hugging Face gradient checkpointing is already on (gradient_checkpointing_enable()):"
                 " left to it, not checkpointed twice")]
    notes = []
    # Every config, not only the root's: HF stacks keep their own copy (T5's decoder fills its cache
    # from decoder.config.use_cache, and the cross-attention then reuses k/v in the recompute).
    configs = {id(c): c for m in model.modules() for c in (getattr(m, "config", None),) if c is not None}
    for c in list(configs.values()):
        for sub in (getattr(c, "text_config", None), getattr(c, "decoder", None)):
            if sub is not None and hasattr(sub, "use_cache"):
                configs[id(sub)] = sub
    for c in configs.values():
        if getattr(c, "use_cache", None) is True:
            c.use_cache = False
            if not notes:
                notes.append(("use_cache=False", "Hugging Face model: KV cache off for training, as "
                              "gradient_checkpointing_enable() does (a cache filled in forward breaks recompute)"))
    return notes


def hf_checkpointing_on(model: nn.Module) -> bool:
    """The model's own (Hugging Face) gradient checkpointing is on."""
    # transformers >= 5 renamed is_gradient_checkpointing (now a deprecated alias) to is_activation_checkpointing.
    for name in ("is_activation_checkpointing", "is_gradient_checkpointing"):
        if hasattr(type(model), name):
            return bool(getattr(model, name))
    return False


def _ckpt_forward(orig, *args, **kwargs):
    return checkpoint(orig, *args, use_reentrant=False, **kwargs)


def apply_activation_checkpointing(model: nn.Module, mode: str, every: int = 2) -> list[str]:
    """Checkpoint all blocks ("full") or blocks 0, k, 2k, ... of each list ("selective"); returns their fqns.

    A Hugging Face model whose own gradient checkpointing is already on is left as it is (checkpointing
    twice recomputes twice)."""
    if mode == "none":
        return []
    if hf_checkpointing_on(model):
        return []
    groups = find_block_groups(model)
    if not groups:
        raise ValueError("activation checkpointing: no repeated blocks (an nn.ModuleList or nn.Sequential of "
                         "one class) found in this model; use activation_checkpointing='none'")
    done = []
    for fqn, blocks in groups:
        for i, b in enumerate(blocks):
            if mode == "full" or i % every == 0:
                if getattr(b, "_overdrive_ckpt", False):
                    continue
                b.forward = functools.partial(_ckpt_forward, b.forward)
                b._overdrive_ckpt = True
                done.append(f"{fqn}.{i}" if fqn else str(i))
    return done
