"""What a recipe becomes on one model here: the one path from a recipe to what the applier runs.

`accelerate()` and the trainer both come through `resolve_for_model`, so each gets the same checks:
recipe="tuned" finds the cached winner for this model (or says it runs "auto"), the model's own
(Hugging Face) gradient checkpointing keeps Transformer Engine's FP8 out, and a tuned recipe's
measured per-layer FP8 shapes become the layer filter.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable

from torch import nn

from overdrive.convert.checkpointing import hf_checkpointing_on
from overdrive.env import EnvReport, get_env
from overdrive.recipes import Decision, Recipe, ResolvedRecipe, resolve

__all__ = ["resolve_for_model"]

LayerFilter = Callable[[nn.Module, str], bool]


def resolve_for_model(model: nn.Module, recipe: str | Recipe | ResolvedRecipe, env: EnvReport | None = None, *,
                      strict: bool = False, module_filter_fn: LayerFilter | None = None
                      ) -> tuple[ResolvedRecipe, LayerFilter | None]:
    """(what runs, the FP8 layer filter) for `recipe` on `model` on the machine `env` describes (None:
    this one, probed only where a recipe is resolved here).

    A ResolvedRecipe (resolved once elsewhere, as bench's parent does for its workers) is kept, unless it
    chose Transformer Engine's FP8 for a model with its own gradient checkpointing: then its recipe is
    resolved again with that known, as a recipe given by name would have been."""
    own = hf_checkpointing_on(model)
    if isinstance(recipe, ResolvedRecipe):
        resolved = recipe
        if own and recipe.fp8_backend == "transformer_engine":
            resolved = resolve(recipe.recipe, env or get_env(), strict=strict, model_checkpointing=True)
    else:
        env = env or get_env()
        tuned_note = None
        if isinstance(recipe, str) and recipe.strip().lower() == "tuned":
            recipe, tuned_note = _tuned(model, env)
        resolved = resolve(recipe, env, strict=strict, model_checkpointing=own)
        if tuned_note is not None:
            resolved = dataclasses.replace(resolved, decisions=(tuned_note,) + resolved.decisions)
    if module_filter_fn is None and resolved.fp8_backend and resolved.recipe.fp8_shapes:
        module_filter_fn = _shape_filter(resolved.recipe.fp8_shapes, resolved.fp8_convert_head)
    return resolved, module_filter_fn


def _tuned(model: nn.Module, env: EnvReport) -> tuple[str | Recipe, Decision]:
    """The cached tune winner for this model and machine, or "auto" with a fallback decision."""
    from overdrive.recipes.tuned import load_tuned

    rec, why = load_tuned(model, env)
    if rec is None:
        logging.getLogger("overdrive").warning("recipe 'tuned': %s; running 'auto'", why)
        return "auto", Decision(field="recipe", requested="tuned", chosen="auto", reason=f"{why} → auto",
                                fallback=True)
    return rec, Decision(field="recipe", requested="tuned", chosen=rec.name, reason=why)


def _shape_filter(shapes: str, convert_head: bool) -> LayerFilter:
    """The measured per-layer FP8 filter a tuned recipe carries: only the listed (in x out) shapes."""
    from overdrive.convert.fp8 import HEAD_NAMES

    keep = {s.strip() for s in shapes.split(",") if s.strip()}

    def f(m: nn.Module, fqn: str) -> bool:
        if not convert_head and fqn.rsplit(".", 1)[-1] in HEAD_NAMES:
            return False
        return f"{m.in_features}x{m.out_features}" in keep

    return f
