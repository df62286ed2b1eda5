"""The "Apply:" line: how to use a measured configuration, usable as printed and carrying its whole recipe.

One builder for the bench's recommendation and the report's next step (they used to be two, and one
dropped the click model's bf16). GPT: the recipe name is written from the recipe's fields
(`recipes.recipe_name`), so `accelerate(recipe=...)`, `train.recipe` and `--set` all parse it back to
the same fields. Click model: the DLRM, its optimizers and the AMP dtype of `train_step`.
"""

from __future__ import annotations

from dataclasses import fields

__all__ = ["apply_hint", "recipe_of"]


def recipe_of(cfg: dict) -> str:
    """The configuration's recipe in the name grammar: its own name when that parses back to its
    recorded fields, else a name written from the fields (so nothing is left out)."""
    from overdrive.recipes import Recipe, parse_recipe_name, recipe_name

    name, rec = str(cfg.get("name")), cfg.get("recipe")
    if not isinstance(rec, dict):
        return name
    known = [f.name for f in fields(Recipe) if f.name != "name"]
    try:
        r = Recipe(**{k: v for k, v in rec.items() if k in known})
    except (TypeError, ValueError):
        return name
    for cand in (name, rec.get("name")):
        try:
            p = parse_recipe_name(str(cand))
        except ValueError:
            continue
        if all(getattr(p, k) == getattr(r, k) for k in known):
            return p.name
    return recipe_name(r)


def apply_hint(cfg: dict, task: str) -> dict:
    """{"code": ..., "train": ...}: the configuration in code and in a train config (GPT; the click
    model has no train config, "train" is None)."""
    if task == "gpt":
        name = recipe_of(cfg)
        return {"code": f'overdrive.accelerate(model, recipe="{name}")',
                "train": f'train.recipe = "{name}"  (or --set train.recipe={name})'}
    o = cfg.get("options") or {}
    opt = o.get("optimizer", "dense-adamw")
    sparse = opt != "dense-adamw"
    prec = cfg.get("precision") or (cfg.get("recipe") or {}).get("precision")
    amp = {"bf16": ", amp_dtype=torch.bfloat16", "fp16": ", amp_dtype=torch.float16"}.get(prec, "")
    code = (f'model = DLRM(spec, embedding="{o.get("embedding", "embeddingbag")}", sparse={sparse}); '
            f'opts = build_optimizers(model, "{opt}"); train_step(model, opts, batch{amp})')
    return {"code": code, "train": None}
