"""The "Apply:" line: how to use a measured configuration, usable as printed and carrying its whole recipe.

One builder for the bench's recommendation and the report's next step (they used to be two, and one
dropped the click model's bf16): each workload writes its own (`Workload.apply_hint`). A recipe name
is written from the recipe's fields (`recipe_of`), so `accelerate(recipe=...)`, `train.recipe` and
`--set` all parse it back to the same fields.
"""

from __future__ import annotations

from overdrive.bench.workloads import workload_for_task
from overdrive.bench.workloads.gpt import recipe_of

__all__ = ["apply_hint", "recipe_of"]


def apply_hint(cfg: dict, task: str) -> dict:
    """{"code": ..., "train": ...}: the configuration in code and in a train config (None where the
    workload has none), written by the workload that runs `task`."""
    return workload_for_task(task).apply_hint(cfg)
