"""`accelerate(model, recipe)`: the user's model, made fast with what works here, every choice explained.

    acc = overdrive.accelerate(model, recipe="auto", lr=3e-4)
    for x, y in batches:
        with acc.autocast():
            loss = loss_fn(acc.model(x), y)
        acc.backward(loss)
        acc.step()
    print(acc.report())
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import logging
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from overdrive.convert import LayerDecision, apply_activation_checkpointing, convert_fp8, convert_norms
from overdrive.env import EnvReport, get_env
from overdrive.optim import build_adamw
from overdrive.recipes import Decision, Recipe, ResolvedRecipe, resolve

__all__ = ["accelerate", "Accelerated"]


class Accelerated:
    """A model converted per a ResolvedRecipe, with its optimizer, scaler and autocast."""

    def __init__(self, model: nn.Module, resolved: ResolvedRecipe, *, lr: float, weight_decay: float,
                 betas: tuple[float, float], grad_clip: float | None,
                 module_filter_fn: Callable[[nn.Module, str], bool] | None, build_optimizer: bool) -> None:
        self.resolved = resolved
        self.device = torch.device(resolved.device)
        self.grad_clip = grad_clip
        self.conversions: dict[str, list[LayerDecision]] = {}
        model.to(self.device)

        if resolved.norm != "torch":
            self.conversions["norm"] = convert_norms(model, resolved.norm)
        if resolved.fp8_backend:
            self.conversions["fp8"] = convert_fp8(model, backend=resolved.fp8_backend, scaling=resolved.fp8_scaling,
                                                  min_dim=resolved.fp8_min_dim,
                                                  convert_head=resolved.fp8_convert_head,
                                                  module_filter_fn=module_filter_fn)
        if any(type(m).__module__.startswith("transformer_engine") for m in model.modules()):
            _keep_state_dict_plain(model)
        self.checkpointed = apply_activation_checkpointing(model, resolved.activation_checkpointing,
                                                           resolved.checkpoint_every)
        if resolved.compile != "off":
            # In place (nn.Module.compile) so state_dict keys carry no "_orig_mod." prefix.
            model.compile(mode=None if resolved.compile == "default" else resolved.compile)
        self.model = model
        self.optimizer = build_adamw(model, resolved.optimizer, lr=lr, betas=betas,
                                     weight_decay=weight_decay) if build_optimizer else None
        self.scaler = torch.amp.GradScaler(self.device.type) if resolved.grad_scaler else None
        self._te_recipe = _te_fp8_recipe(resolved.fp8_scaling) if resolved.fp8_backend == "transformer_engine" \
            else None
        self._flce = None
        self.steps = 0
        self.skipped_steps = 0

    # -- the training-loop API -------------------------------------------------------------
    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        """Forward-pass context: torch autocast (bf16/fp16) and, for TE FP8, TE's FP8 autocast."""
        with contextlib.ExitStack() as stack:
            if self.resolved.autocast_dtype:
                stack.enter_context(torch.autocast(self.device.type,
                                                   dtype=getattr(torch, self.resolved.autocast_dtype)))
            if self._te_recipe is not None:
                te = importlib.import_module("transformer_engine.pytorch")
                ctx = te.autocast(enabled=True, recipe=self._te_recipe) if hasattr(te, "autocast") \
                    else te.fp8_autocast(enabled=True, fp8_recipe=self._te_recipe)
                stack.enter_context(ctx)
            yield

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler else loss).backward()

    def step(self) -> dict:
        """Clip (if grad_clip), optimizer step, scaler update, zero_grad. Returns what happened."""
        if self.optimizer is None:
            raise RuntimeError("accelerate(..., build_optimizer=False): step your own optimizer")
        info: dict = {"skipped": False, "grad_norm": None, "scale": None}
        if self.scaler:
            self.scaler.unscale_(self.optimizer)
        if self.grad_clip:
            info["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip))
        if self.scaler:
            before = self.scaler.get_scale()
            self.scaler.step(self.optimizer)  # skipped internally when grads hold inf/nan
            self.scaler.update()
            info["scale"] = self.scaler.get_scale()
            info["skipped"] = info["scale"] < before
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.steps += 1
        self.skipped_steps += int(info["skipped"])
        return info

    def lm_loss(self, hidden: torch.Tensor, head_weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Cross-entropy of `hidden @ head_weight.T` against targets; fused (Liger) when resolved so."""
        h = hidden.reshape(-1, hidden.size(-1))
        if self.resolved.loss == "fused-linear-cross-entropy":
            if self._flce is None:
                from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

                self._flce = LigerFusedLinearCrossEntropyLoss()
            return self._flce(head_weight, h, targets.reshape(-1))
        return F.cross_entropy(F.linear(h, head_weight).float(), targets.reshape(-1))

    # -- explanations ----------------------------------------------------------------------
    def report(self) -> str:
        r = self.resolved
        lines = [f"Overdrive recipe '{r.recipe.name}' on {r.device}: precision {r.precision}"
                 + (f" ({r.fp8_backend}, {r.fp8_scaling})" if r.fp8_backend else "")
                 + (f", autocast {r.autocast_dtype}" if r.autocast_dtype else "")
                 + (", GradScaler" if r.grad_scaler else "")]
        for d in r.decisions:
            tag = "FALLBACK " if d.fallback else ""
            lines.append(f"  {tag}{d.field}: {d.chosen}  — {d.reason}")
        if r.emulated:
            fmt = {"mxfp8": "MXFP8", "nvfp4": "NVFP4"}.get(r.fp8_scaling, "FP8")
            lines.append(f"  NOTE: {fmt} is emulated: it shows {fmt} numerics, it is not faster.")
        for what, decs in self.conversions.items():
            conv = [d for d in decs if d.converted]
            lines.append(f"  {what} swaps: {len(conv)} of {len(decs)} layers converted")
            # Group the skips by reason so a 96-layer model reads in a few lines.
            by_reason: dict[str, list[str]] = {}
            for d in decs:
                if not d.converted:
                    by_reason.setdefault(d.reason, []).append(d.fqn)
            for reason, fqns in by_reason.items():
                shown = ", ".join(fqns[:4]) + (f" and {len(fqns) - 4} more" if len(fqns) > 4 else "")
                lines.append(f"    skipped {shown}: {reason}")
        if self.checkpointed:
            lines.append(f"  activation checkpointing on {len(self.checkpointed)} blocks: "
                         + ", ".join(self.checkpointed[:6]) + (" ..." if len(self.checkpointed) > 6 else ""))
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {"resolved": self.resolved.to_dict(),
                "conversions": {k: [vars(d) for d in v] for k, v in self.conversions.items()},
                "checkpointed": self.checkpointed}


def _te_fp8_recipe(scaling: str | None):
    from overdrive.convert.fp8 import te_fp8_recipe  # one place knows TE's recipe classes (incl. NVFP4)

    return te_fp8_recipe(scaling)


def _keep_state_dict_plain(model: nn.Module) -> None:
    """TE modules add `_extra_state` (FP8 scaling metadata) keys: hide them from state_dict() and
    accept state dicts without them, so checkpoints stay interchangeable with the original model."""

    def drop(module, state_dict, prefix, local_metadata):
        for k in [k for k in state_dict if k.endswith("._extra_state") or k == "_extra_state"]:
            del state_dict[k]

    def fill(module, state_dict, prefix, *args):
        for name, sub in module.named_modules():
            if hasattr(sub, "get_extra_state") and type(sub).__module__.startswith("transformer_engine"):
                key = f"{prefix}{name + '.' if name else ''}_extra_state"
                state_dict.setdefault(key, sub.get_extra_state())

    model.register_state_dict_post_hook(drop)
    model.register_load_state_dict_pre_hook(fill)


def accelerate(model: nn.Module, recipe: str | Recipe = "auto", *, lr: float = 3e-4, weight_decay: float = 0.1,
               betas: tuple[float, float] = (0.9, 0.95), grad_clip: float | None = 1.0, strict: bool = False,
               module_filter_fn: Callable[[nn.Module, str], bool] | None = None, env: EnvReport | None = None,
               build_optimizer: bool = True) -> Accelerated:
    """Resolve `recipe` on this machine and apply it to `model` in place.

    recipe="tuned" applies the winner `overdrive tune` cached for this model (parameter names and
    shapes) on this machine; with none cached it runs "auto" and says so (a FALLBACK line in report()).
    strict=True raises RecipeUnavailable instead of falling back. `module_filter_fn(module, fqn)`
    decides which nn.Linear layers go to FP8 (instead of the size and head rules).
    """
    env = env or get_env()
    tuned_note = None
    if isinstance(recipe, str) and recipe.strip().lower() == "tuned":
        recipe, tuned_note = _tuned(model, env)
    resolved = resolve(recipe, env, strict=strict)
    if tuned_note is not None:
        resolved = dataclasses.replace(resolved, decisions=(tuned_note,) + resolved.decisions)
    if module_filter_fn is None and resolved.fp8_backend and resolved.recipe.fp8_shapes:
        module_filter_fn = _shape_filter(resolved.recipe.fp8_shapes, resolved.fp8_convert_head)
    return Accelerated(model, resolved, lr=lr, weight_decay=weight_decay, betas=betas, grad_clip=grad_clip,
                       module_filter_fn=module_filter_fn, build_optimizer=build_optimizer)


def _tuned(model: nn.Module, env: EnvReport) -> tuple[str | Recipe, Decision]:
    """The cached tune winner for this model and machine, or "auto" with a fallback decision."""
    from overdrive.recipes.tuned import load_tuned

    rec, why = load_tuned(model, env)
    if rec is None:
        logging.getLogger("overdrive").warning("recipe 'tuned': %s; running 'auto'", why)
        return "auto", Decision(field="recipe", requested="tuned", chosen="auto", reason=f"{why} → auto",
                                fallback=True)
    return rec, Decision(field="recipe", requested="tuned", chosen=rec.name, reason=why)


def _shape_filter(shapes: str, convert_head: bool) -> Callable[[nn.Module, str], bool]:
    """The measured per-layer FP8 filter a tuned recipe carries: only the listed (in x out) shapes."""
    from overdrive.convert.fp8 import HEAD_NAMES

    keep = {s.strip() for s in shapes.split(",") if s.strip()}

    def f(m: nn.Module, fqn: str) -> bool:
        if not convert_head and fqn.rsplit(".", 1)[-1] in HEAD_NAMES:
            return False
        return f"{m.in_features}x{m.out_features}" in keep

    return f
