"""One registry of recipe names: every name Overdrive prints is one `accelerate(recipe=...)`,
`train.recipe`, `bench --configs` and `tune` accept as is.

Grammar:  NAME := PRESET ("+" KNOB)*      e.g. "amp-bf16+compile", "fp32-fused+compile+ckpt"
- PRESET is a key of `PRESETS`, or a spelling users type (`ALIASES`: "bf16", "fp16", "no", "none",
  "float8", ...), case-insensitive.
- KNOB is a named change (`KNOBS`: "compile", "max-autotune", "ckpt", ...) or any `field=value`
  of `Recipe` ("compile=max-autotune", "fp8_backend=torchao", "fp8_min_dim=512").
`recipe_name(recipe)` writes a Recipe back in this grammar (preset + the fewest knobs), so a
name recorded in results or `recipe.json` parses back to the same fields.
"""

from __future__ import annotations

import dataclasses
from dataclasses import fields

from overdrive.recipes.recipe import _FIELDS, ALIASES, KNOBS, PRESETS, Recipe, _preset_key, presets, recipe_name

__all__ = ["get_recipe", "names", "parse_recipe_name", "recipe_name", "canonical_name", "ALIASES", "KNOBS", "ECOSYSTEM",
           "ecosystem_note"]

# Other stacks' names for a recipe: Lightning's `Trainer(precision=...)` strings (lightning.fabric.
# connector's _PRECISION_INPUT). They parse to Overdrive's recipe, which is the name reported back.
ECOSYSTEM: dict[str, tuple[str, str]] = {
    "bf16-mixed": ("amp-bf16", "Lightning's precision"), "16-mixed": ("amp-fp16", "Lightning's precision"),
    "16": ("amp-fp16", "Lightning's precision (16-mixed)"), "32-true": ("fp32", "Lightning's precision"),
    "32": ("fp32", "Lightning's precision (32-true)"),
    # Lightning's TransformerEnginePrecision uses TE's DelayedScaling() unless given another recipe.
    "transformer-engine": ("fp8-delayed+te", "Lightning's precision (TransformerEnginePrecision, DelayedScaling)"),
}
# Lightning's names with no Overdrive recipe: refused with what to use instead.
_NOT_OURS: dict[str, str] = {
    "bf16-true": "bf16 weights with no fp32 master copy; Overdrive keeps fp32 weights: use bf16-mixed (amp-bf16)",
    "16-true": "fp16 weights with no fp32 master copy; Overdrive keeps fp32 weights: use 16-mixed (amp-fp16)",
    "64-true": "float64 training is not an Overdrive recipe: use 32-true (fp32)",
    "transformer-engine-float16": "TE FP8 over fp16 weights; Overdrive's TE FP8 keeps fp32 weights: use "
                                  "transformer-engine (fp8-delayed+te)",
}


def ecosystem_note(text: str) -> str | None:
    """"Lightning's precision 'bf16-mixed' is Overdrive's amp-bf16" for another stack's name, else None."""
    head = str(text).strip().split("+")[0].strip().lower()
    if head not in ECOSYSTEM:
        return None
    target, whose = ECOSYSTEM[head]
    return f"{whose} '{head}' is Overdrive's {target}"


_KNOB_ALIASES = {"ac": "ckpt", "checkpoint": "ckpt", "compiled": "compile", "flce": "fused-ce",
                 "fused": "fused-adamw", "emulate": "emulated"}

def names() -> list[str]:
    """The preset names, in the order they are documented."""
    return list(presets())


def _fix() -> str:
    return (f"presets are {', '.join(PRESETS)} (spellings like bf16, fp16, no also work); add knobs with '+', "
            "e.g. amp-bf16+compile (knobs: overdrive.recipes.KNOBS, or +field=value)")


def _coerce(field: str, text: str):
    default = _FIELDS[field].default
    if isinstance(default, bool):
        if text.lower() not in ("true", "false", "1", "0", "yes", "no", "on", "off"):
            raise ValueError(f"recipe knob {field}={text!r}: use true or false")
        return text.lower() in ("true", "1", "yes", "on")
    if isinstance(default, int):
        try:
            return int(text)
        except ValueError:
            raise ValueError(f"recipe knob {field}={text!r}: needs an integer") from None
    return text


def parse_recipe_name(text: str) -> Recipe:
    """A Recipe from a name in the grammar above; ValueError naming the bad part and the valid ones."""
    parts = [p.strip() for p in str(text).strip().split("+")]
    if not parts or not parts[0]:
        raise ValueError(f"empty recipe name {text!r}: {_fix()}")
    head = parts[0].lower()
    if head in _NOT_OURS:
        raise ValueError(f"recipe '{parts[0]}' (Lightning's precision): {_NOT_OURS[head]}")
    if head in ECOSYSTEM:  # another stack's name: its recipe, then the user's own knobs
        return parse_recipe_name("+".join([ECOSYSTEM[head][0], *parts[1:]]))
    key = _preset_key(head)
    known = presets()
    if key not in known:
        raise ValueError(f"unknown recipe '{parts[0]}': {_fix()}")
    r = known[key]
    changes: dict = {}
    for knob in parts[1:]:
        k = knob.lower()
        if "=" in k:
            fld, _, val = k.partition("=")
            fld = fld.strip().replace("-", "_")
            if fld not in _FIELDS or fld == "name":
                raise ValueError(f"recipe knob '{knob}' in {text!r}: no field {fld!r}; fields are "
                                 f"{', '.join(f for f in _FIELDS if f != 'name')}")
            changes[fld] = _coerce(fld, val.strip())
        else:
            k = _KNOB_ALIASES.get(k, k)
            if k not in KNOBS:
                raise ValueError(f"unknown recipe knob '{knob}' in {text!r}: knobs are {', '.join(KNOBS)} "
                                 "or field=value")
            changes.update(KNOBS[k])
    if not changes:
        return r
    r = dataclasses.replace(r, **changes)  # Recipe validates every value here
    return dataclasses.replace(r, name=recipe_name(r, base=key))


def canonical_name(text: str) -> str:
    """The printed form of any accepted spelling: "bf16" -> "amp-bf16", "fp32+compile" -> "fp32+compile"."""
    return parse_recipe_name(text).name


def get_recipe(recipe: str | Recipe, **overrides) -> Recipe:
    """A preset by name (any spelling `parse_recipe_name` accepts, e.g. "bf16", "fp8+compile"), or a
    Recipe as is, with optional field overrides (the name then records them: "amp-bf16+compile=default")."""
    base = recipe if isinstance(recipe, Recipe) else parse_recipe_name(recipe)
    if overrides:
        unknown = set(overrides) - {f.name for f in fields(Recipe)}
        if unknown:
            raise ValueError(f"unknown recipe field(s) {', '.join(sorted(unknown))}: fields are "
                             f"{', '.join(f.name for f in fields(Recipe))}")
        name = overrides.pop("name", None)
        base = dataclasses.replace(base, **overrides)
        base = dataclasses.replace(base, name=name or recipe_name(base))
    return base
