"""The one training step, used by `Accelerated` (acc.backward / acc.step) and by the trainer; the
click model's step (recsys/train.py) uses it with several optimizers and no scaler.

    stepper = TrainStep(model, opt, scaler=scaler, applied=applied, grad_clip=1.0, accum=4, fsdp=True)
    for i, (x, y) in enumerate(micro_batches):       # 4 of them
        stepper.backward(loss_of(x, y), last=i == 3)  # loss / 4, scaled under fp16; FSDP syncs on the last
    info = stepper.step(guard=check)                  # unscale, clip, guard, step, scaler update, zero_grad

Under FSDP2 with accumulation the gradients are reduce-scattered once, on the last micro-batch
(`set_requires_gradient_sync`): the earlier ones accumulate unsharded gradients locally, which is
what makes accumulation cheap. `step` returns tensors, never floats: a float() per step is a host
sync on GPU; the caller decides when to read them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

__all__ = ["TrainStep", "StepInfo"]


@dataclass
class StepInfo:
    stepped: bool
    """An optimizer step was taken (False on the micro-steps before the last one)."""
    skipped: torch.Tensor | bool = False
    """fp16: the GradScaler skipped this step (inf/nan gradients); a 0-dim bool tensor."""
    grad_norm: torch.Tensor | None = None
    """The global gradient norm before clipping (None when clipping is off and nobody asked)."""
    scale: torch.Tensor | None = None
    """fp16: the loss scale after the update."""


class TrainStep:
    """Backward and optimizer step of one model: autocast is the caller's forward, the rest is here."""

    def __init__(self, model: nn.Module, optimizers: torch.optim.Optimizer | Sequence[torch.optim.Optimizer], *,
                 scaler: torch.amp.GradScaler | None = None, applied=None, grad_clip: float | None = None,
                 measure_norm: bool = False, accum: int = 1, fsdp: bool = False) -> None:
        self.model = model
        self.optimizers = [optimizers] if isinstance(optimizers, torch.optim.Optimizer) else list(optimizers)
        self.scaler, self.applied, self.grad_clip = scaler, applied, grad_clip
        self.measure_norm, self.accum, self.fsdp = measure_norm, accum, fsdp

    def backward(self, loss: torch.Tensor, *, last: bool = True, accum: int | None = None) -> None:
        """loss / accum, scaled under fp16, backward; under FSDP2 the gradients sync on `last` only."""
        n = accum or self.accum
        if self.fsdp and n > 1:
            self.model.set_requires_gradient_sync(last)
        if n > 1:
            loss = loss / n
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def step(self, *, guard: Callable[[torch.Tensor | None], None] | None = None,
             skip_non_finite: bool = False) -> StepInfo:
        """Unscale (fp16), clip (or only measure the norm), `guard(grad_norm)` (may raise to stop before
        anything changes), optimizer step(s), scaler update, the recipe's post-step hook, zero_grad.
        skip_non_finite (no GradScaler; needs the norm measured): a NaN/inf gradient norm zeroes the gradients
        and steps nothing (stepped=False, skipped=True), at the cost of one host sync."""
        info = StepInfo(stepped=True)
        if self.scaler is not None:
            for o in self.optimizers:
                self.scaler.unscale_(o)
        if self.grad_clip or self.measure_norm:
            gn = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip or math.inf)
            info.grad_norm = gn.full_tensor() if hasattr(gn, "full_tensor") else gn
        if guard is not None:
            guard(info.grad_norm)
        if skip_non_finite and info.grad_norm is not None and not bool(torch.isfinite(info.grad_norm)):
            for o in self.optimizers:
                o.zero_grad(set_to_none=True)
            return StepInfo(stepped=False, skipped=True)
        if self.scaler is not None:
            before = self.scaler._scale.clone()  # the scale as a tensor: get_scale() would sync
            for o in self.optimizers:
                self.scaler.step(o)  # skipped internally when grads hold inf/nan
            self.scaler.update()
            info.scale = self.scaler._scale.detach().clone()
            info.skipped = info.scale < before  # the scale backs off exactly when a step is skipped
        else:
            for o in self.optimizers:
                o.step()
        if self.applied is not None:
            self.applied.after_optimizer_step()
        for o in self.optimizers:
            o.zero_grad(set_to_none=True)
        return info
