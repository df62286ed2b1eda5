"""The one candidate type bench and tune measure: a name, the recipe asked for, and (resolved once in
the parent) what runs here, with every name that runs the same thing.

Candidates are recipe names from the one registry (`overdrive.recipes.PRESETS` and its "+knob"
grammar), so every name printed is one `accelerate(recipe=...)` and `train.recipe` accept; a
workload may name its own configurations (recsys) with task `options`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from overdrive.formats import FORMATS
from overdrive.recipes import Recipe, get_recipe

if TYPE_CHECKING:
    from overdrive.env import EnvReport
    from overdrive.recipes import ResolvedRecipe

__all__ = ["Candidate"]

# What each registered name means to a reader of the table (the recipe's fields say it exactly).
_DESCRIPTIONS = {
    "baseline": "plain PyTorch: fp32, eager, AdamW for-loop, torch norms",
    "fp32": "fp32 with the best AdamW and norms that work here",
    "fp32-fused": "fp32 with torch's fused AdamW and the best norms here",
    "amp-bf16": "bf16 autocast + best AdamW/norms",
    "amp-fp16": "fp16 autocast + GradScaler + best AdamW/norms",
}


@dataclass(kw_only=True)
class Candidate:
    name: str
    """A registered recipe name, or a workload's own configuration name (recsys)."""
    recipe: Recipe
    """What was asked for."""
    description: str = ""
    baseline: bool = False
    """The reference every speedup is against (plain fp32 PyTorch)."""
    options: dict = field(default_factory=dict)
    """Task-specific settings the worker's spec carries (recsys: embedding, optimizer)."""
    resolved: ResolvedRecipe | None = None
    """What runs here, resolved once in the parent (None until resolved, or where it cannot)."""
    names: list[str] = field(default_factory=list)
    """Every name that resolves to this same effective recipe here (the first is `name`)."""
    stage: str = "presets"
    """Where a search found it (tune: presets | knobs | checkpointing)."""

    @classmethod
    def preset(cls, name: str, *, baseline: bool = False) -> "Candidate":
        """The candidate for a recipe name in the registry (any accepted spelling; printed canonically)."""
        r = get_recipe(name)
        head, *knobs = r.name.split("+")
        words = {**_DESCRIPTIONS, **{f.preset: f.description for f in FORMATS.values()}}  # a format's own words
        desc = words.get(head, f"recipe {head}") + "".join(f" + {k}" for k in knobs)
        return cls(name=r.name, recipe=r, description=desc, baseline=baseline)

    @property
    def emulated(self) -> bool:
        """Runs an emulated low-precision format here: checked for quality, never a speed."""
        return bool(self.resolved is not None and self.resolved.emulated)

    @property
    def label(self) -> str:
        """Every name it answers to: 'fp32 = auto'."""
        return " = ".join(self.names or [self.name])

    def ran(self, env: EnvReport) -> str:
        """The label of what ran: the names, or `names → what ran (fallback: cause)`."""
        from overdrive.recipes.labels import ran_label

        return ran_label(self.label, self.resolved, env) if self.resolved is not None else self.label

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["recipe"] = self.recipe.to_dict()
        d["resolved"] = self.resolved.to_dict() if self.resolved is not None else None
        return d
