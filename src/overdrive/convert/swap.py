"""Generic module swap: replace submodules in place, keeping their parameters (and so the
state_dict keys) where the replacement shares them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

__all__ = ["LayerDecision", "swap_modules", "share_params", "plan_swaps"]


@dataclass(frozen=True)
class LayerDecision:
    fqn: str
    kind: str
    """What the module is (e.g. "Linear(768→3072)", "LayerNorm(768)")."""
    converted: bool
    reason: str


def _targets(model: nn.Module, decide) -> list[tuple[str, nn.Module, bool, str]]:
    out = []
    for fqn, mod in model.named_modules():
        if not fqn:
            continue
        d = decide(mod, fqn)
        if d is not None:
            out.append((fqn, mod, d[0], d[1]))
    return out


def plan_swaps(model: nn.Module, decide: Callable[[nn.Module, str], tuple[bool, str] | None],
               kind: Callable[[nn.Module], str]) -> list[LayerDecision]:
    """What `swap_modules` would do, without doing it (for engines that swap through their own entry point)."""
    return [LayerDecision(fqn=f, kind=kind(m), converted=do, reason=why) for f, m, do, why in _targets(model, decide)]


def swap_modules(model: nn.Module, decide: Callable[[nn.Module, str], tuple[bool, str] | None],
                 factory: Callable[[nn.Module, str], nn.Module], kind: Callable[[nn.Module], str]
                 ) -> list[LayerDecision]:
    """For every submodule where `decide` returns (True, why), put `factory(module, fqn)` in its place.

    `decide` returns None for modules it does not care about (they are not reported).
    The root module itself is never swapped.
    """
    out: list[LayerDecision] = []
    for fqn, mod, do, why in _targets(model, decide):
        if do:
            parent_name, _, child = fqn.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            setattr(parent, child, factory(mod, fqn))
        out.append(LayerDecision(fqn=fqn, kind=kind(mod), converted=do, reason=why))
    return out


@torch.no_grad()
def share_params(src: nn.Module, dst: nn.Module, names: tuple[str, ...] = ("weight", "bias")) -> None:
    """Give `dst` the very Parameters of `src` (same storage, same requires_grad) where it has them."""
    for n in names:
        p = getattr(src, n, None)
        if p is None or getattr(dst, n, None) is None:
            continue
        q = getattr(dst, n)
        if q.shape != p.shape:
            raise ValueError(f"cannot move {n}: shape {tuple(p.shape)} vs {tuple(q.shape)}")
        if isinstance(q, nn.Parameter) and type(q) is nn.Parameter:
            setattr(dst, n, p)  # share: the swapped module trains the user's own tensor
        else:
            q.copy_(p)
