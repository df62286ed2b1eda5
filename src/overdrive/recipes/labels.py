"""Say what ran, not what was asked: a candidate's label carries its fallbacks, and candidates that
resolve to the same effective recipe are one measurement.

    fp8 → bf16 (fallback: torchao missing)       no FP8 engine here, so bf16 autocast ran
    fp8 → fp8 emulated (fallback: no FP8 GPU)    torchao emulation: numerics only, never a speed
    nvfp4 → nvfp4 emulated (fallback: no SM 10.x GPU)
"""

from __future__ import annotations

import json

from overdrive.env import EnvReport
from overdrive.formats import FORMATS, find_format, kinds
from overdrive.recipes.resolve import ResolvedRecipe

__all__ = ["ran_label", "what_runs", "effective_key", "low_precision_format"]


def low_precision_format(fp8_scaling: str | None, precision: str = "fp8") -> str:
    """The format's own word (`Format.kind`: mxfp8, nvfp4) for the block-scaled formats, else the precision
    ("fp8" for the per-tensor FP8 variants)."""
    f = find_format(fp8_scaling)
    return f.kind if f is not None and f.kind != f.bits else precision


def _engines(env: EnvReport) -> str:
    ao, te = env.engine("torchao"), env.engine("transformer_engine")
    return f"transformer_engine {te.status}, torchao {ao.status}"


def what_runs(r: ResolvedRecipe) -> str:
    """The precision that runs, in a word or two: fp32, bf16, fp16, fp8 (torchao, tensorwise),
    fp8 emulated, mxfp8 (transformer_engine), nvfp4 emulated."""
    if r.fp8_backend:
        fmt = low_precision_format(r.fp8_scaling, r.precision)
        if r.emulated:
            return f"{fmt} emulated"
        return f"{fmt} ({r.fp8_backend})" if fmt != r.precision else f"{fmt} ({r.fp8_backend}, {r.fp8_scaling})"
    return r.precision


def _short(d, env: EnvReport) -> str:
    """A fallback's cause in a few words (the full reason stays in the resolved recipe)."""
    if d.field == "fp8":
        ao, te = env.engine("torchao"), env.engine("transformer_engine")
        if not any(g.capabilities.get("fp8") for g in env.gpus):
            causes = ["no FP8 GPU"]
            if d.chosen.startswith("none"):
                causes.append(f"torchao {ao.status}" if not ao.ok else "torchao cannot emulate")
            return ", ".join(causes)
        if not te.ok and not ao.ok:
            return _engines(env)
        return f"{d.requested} → {d.chosen}"
    if d.field in kinds():
        f = next(f for f in FORMATS.values() if f.kind == d.field)
        if not any(g.capabilities.get(d.field) for g in env.gpus):
            return f"no SM {f.min_cc[0]}.x GPU"
        if d.chosen == "emulated":
            return _engines(env)
        return f"{d.requested} → {d.chosen}"
    return f"{d.field} {d.requested} → {d.chosen}"


def ran_label(name: str, r: ResolvedRecipe, env: EnvReport) -> str:
    """`name` when it ran as asked, else `name → what ran (fallback: cause)`."""
    falls = r.fallbacks
    if not falls:
        return name
    asked = r.recipe.precision
    ran = what_runs(r)
    head = f"{name} → {ran}" if ran != asked else f"{name} → " + ", ".join(f"{d.field} {d.chosen}" for d in falls)
    return f"{head} (fallback: {'; '.join(_short(d, env) for d in falls)})"


def same_recipe_text(names: list[str], ran: str | None) -> str:
    """What the other names of a merged row mean, beside its name, said so that none reads as if it ran:
    ' (fp8, mxfp8 asked for fp8 and fell back to this recipe here: bf16 ran)' for fallbacks,
    ' (the same recipe here as fp32-fused)' for names that ask for what ran. `ran`: what_runs() (None:
    not recorded, every name is said as the same recipe)."""
    from overdrive.recipes import PRESETS

    def asked(n: str) -> str | None:
        rec = PRESETS.get(n.split("+")[0])
        if rec is None or rec.precision == "auto":
            return None
        return low_precision_format(rec.fp8_scaling, rec.precision)

    fell = [n for n in names if ran and asked(n) is not None and not ran.startswith(asked(n))]
    same = [n for n in names if n not in fell]
    parts = [f"the same recipe here as {', '.join(same)}"] if same else []
    if fell:
        formats = ", ".join(dict.fromkeys(asked(n) for n in fell))
        parts.append(f"{', '.join(fell)} asked for {formats} and fell back to this recipe here: {ran} ran")
    return f" ({'; '.join(parts)})" if parts else ""


def effective_key(r: ResolvedRecipe, options: dict | None = None, extra: dict | None = None) -> str:
    """Equal for two candidates that run the same thing here: the resolved fields without the
    requested recipe and the decision log, plus task options (and any test injection)."""
    d = r.to_dict()
    d.pop("recipe")
    d.pop("decisions")
    return json.dumps([d, options or {}, extra or {}], sort_keys=True, default=str)
