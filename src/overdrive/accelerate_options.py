"""`AccelerateOptions`: every keyword of `accelerate(model, recipe, **options)`, in one frozen record.

`accelerate()` is a thin function over `Accelerated(model, recipe, AccelerateOptions(...))`: its
keywords are these fields, checked here once, whoever calls.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from overdrive.env import EnvReport
from overdrive.errors import UserError

__all__ = ["AccelerateOptions", "Optimizer"]

Optimizer = torch.optim.Optimizer | Callable[[list], torch.optim.Optimizer]


@dataclass(frozen=True, kw_only=True)
class AccelerateOptions:
    """How `accelerate()` applies a recipe to a model; each field is one of its keywords."""

    lr: float | None = None
    """AdamW's learning rate (3e-4 when neither this nor optimizer= is given)."""
    weight_decay: float | None = None
    """AdamW's weight decay (0.1 when not given: GPT-3/Llama's; torch's is 0.01)."""
    betas: tuple[float, float] | None = None
    """AdamW's betas ((0.9, 0.95) when not given: GPT-3/Llama's; torch's are (0.9, 0.999))."""
    grad_clip: float | None = 1.0
    """acc.step() clips the gradient norm at this; None turns clipping off."""
    strict: bool = False
    """Raise RecipeUnavailable instead of falling back."""
    module_filter_fn: Callable[[nn.Module, str], bool] | None = None
    """`f(module, fqn)`: which nn.Linear layers go to FP8 (instead of the size and head rules)."""
    env: EnvReport | None = None
    """The machine to resolve for (default: this one, probed once)."""
    build_optimizer: bool = True
    """Build AdamW when no optimizer= is given (False: no optimizer; acc.step() then refuses)."""
    optimizer: Optimizer | None = None
    """Yours: an Optimizer over model.parameters(), or `lambda params: Optimizer`."""
    scheduler: Any = None
    """An LR scheduler, or `lambda opt: Scheduler(opt, ...)`; acc.step() steps it after each optimizer step."""
    grad_accum_steps: int = 1
    """acc.backward divides the loss by N; acc.step() steps every N-th call."""
    gradient_accumulation_steps: int | None = None
    """Accelerate's and TrainingArguments' name for grad_accum_steps: the same setting."""
    distributed: str | None = None
    """None (one process), "ddp" (a replica per rank) or "fsdp" (FSDP2, sharded), the last two under torchrun."""
    autocast_forward: bool = True
    """acc.model's forward runs under the recipe's autocast (False: enter acc.autocast() yourself)."""
    dataloader: Any = None
    """A torch DataLoader, prepared as acc.dataloader (sharded, on the device, resumable)."""
    report_to: str | list[str] | None = None
    """"mlflow", "wandb", "tensorboard" (a list, or comma-separated): where acc.log() sends metrics."""
    run_name: str | None = None
    """The trackers' run name."""
    logging_dir: str = "runs/accelerate"
    """Where local tracker stores go."""

    def __post_init__(self) -> None:
        n = self.grad_accum_steps
        if self.gradient_accumulation_steps is not None:
            if n not in (1, self.gradient_accumulation_steps):
                raise UserError(f"grad_accum_steps={n} and gradient_accumulation_steps="
                                f"{self.gradient_accumulation_steps} are the same setting: pass one")
            n = self.gradient_accumulation_steps
            object.__setattr__(self, "grad_accum_steps", n)  # one name from here on
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise UserError(f"grad_accum_steps={n!r}: use an integer >= 1")
        if self.distributed not in (None, "fsdp", "ddp"):
            raise UserError(f"distributed={self.distributed!r}: use None (one process), 'ddp' (a replica per rank) "
                            "or 'fsdp' (sharded), the last two under torchrun")

    @classmethod
    def from_keywords(cls, where: str, keywords: dict) -> AccelerateOptions:
        """The options from `where`'s keywords; an unknown one is named with the ones there are."""
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(keywords) - set(names))
        if unknown:
            raise TypeError(f"{where} got an unexpected keyword argument {unknown[0]!r}: its keywords are "
                            + ", ".join(names))
        return cls(**keywords)
