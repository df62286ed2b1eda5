"""What `tune` measures: every preset that resolves to a *distinct* effective recipe here, then the
knobs that matter (compile, optimizer implementation, activation checkpointing, FP8 scaling).

Two names that resolve to the same thing on this machine (e.g. `auto` and `fp32` on a CPU without
bf16 units, or `mxfp8` falling back to `fp8`) are one candidate, measured once, and its row lists
every name. Knobs are expanded in a second stage, only on the precisions that survived the first
(`knob_candidates`), so a CPU where bf16 runs 70x slower does not spend its budget on bf16 variants.
"""

from __future__ import annotations

import dataclasses

from overdrive.recipes.labels import effective_key as _bench_key
from overdrive.env import EnvReport
from overdrive.measure.candidate import Candidate
from overdrive.recipes import PRESETS, Recipe, ResolvedRecipe, get_recipe, resolve

__all__ = ["Candidate", "baseline_recipe", "effective_key", "preset_candidates", "knob_candidates",
           "checkpointing_candidates", "named_candidates", "parse_name", "dedupe", "describe"]

# Knob name (as in the recipe-name grammar "preset+knob") -> the fields it sets.
_KNOBS = {"compile": {"compile": "default"}, "fused-adamw": {"optimizer": "torch-fused"},
          "foreach": {"optimizer": "foreach"}, "for-loop": {"optimizer": "for-loop"},
          "ckpt": {"activation_checkpointing": "full"},
          "ckpt-selective": {"activation_checkpointing": "selective"}}


def baseline_recipe() -> Recipe:
    """Plain PyTorch: fp32, eager, the for-loop AdamW, torch norms. Every speedup is against it."""
    return PRESETS.get("baseline") or Recipe(name="baseline", precision="fp32", optimizer="for-loop", norm="torch")


def effective_key(r: ResolvedRecipe) -> str:
    """What actually runs: the bench's key (resolved fields, not the names or the decision log),
    plus the measured FP8 layer list, which lives in the recipe."""
    return _bench_key(r, extra={"fp8_shapes": r.recipe.fp8_shapes})


def describe(r: ResolvedRecipe) -> str:
    """What ran, in a few words, fallbacks named: 'fp32, eager, for-loop AdamW'."""
    parts = [r.precision if not r.fp8_backend else f"{r.precision} ({r.fp8_backend} {r.fp8_scaling}"
             + (", measured per-layer filter" if r.recipe.fp8_shapes else "") + ")"]
    if r.autocast_dtype:
        parts.append(f"autocast {r.autocast_dtype}" + (" + GradScaler" if r.grad_scaler else ""))
    parts.append("eager" if r.compile == "off" else f"compile {r.compile}")
    parts.append(f"{r.optimizer} AdamW")
    if r.norm != "torch":
        parts.append(f"{r.norm} norms")
    if r.activation_checkpointing != "none":
        parts.append(f"{r.activation_checkpointing} activation checkpointing")
    text = ", ".join(parts)
    fb = [d for d in r.fallbacks if d.field != "loss"]
    if fb:
        text += "; FALLBACK " + "; ".join(f"{d.field}: {d.reason}" for d in fb)
    return text


def _with_knob(base: str, recipe: Recipe, knob: str) -> tuple[str, Recipe]:
    name = f"{base}+{knob}"
    return name, dataclasses.replace(recipe, name=name, **_KNOBS[knob])


def dedupe(specs: list[tuple[str, Recipe]], env: EnvReport, *, stage: str,
           existing: list[Candidate] | None = None) -> list[Candidate]:
    """Resolve each (name, recipe); merge those with the same effective key (into `existing` too).
    Returns only the new candidates; names merged into an existing one are appended to its names."""
    seen = {effective_key(c.resolved): c for c in (existing or [])}
    new: list[Candidate] = []
    for name, rec in specs:
        try:
            res = resolve(rec, env)
        except Exception:  # a recipe that cannot even resolve here is not a candidate
            continue
        key = effective_key(res)
        if key in seen:
            if name not in seen[key].names:
                seen[key].names.append(name)
            continue
        c = Candidate(name=name, recipe=rec, resolved=res, names=[name], stage=stage,
                      baseline=(not existing and not new))
        seen[key] = c
        new.append(c)
    return new


def preset_candidates(env: EnvReport) -> list[Candidate]:
    """Stage 1: the baseline, then every preset, deduplicated by what it runs here."""
    base = baseline_recipe()
    # "auto" last: when it resolves like a concrete preset, the row is named after that preset.
    specs = [(base.name, base)] + [(n, r) for n, r in PRESETS.items() if n not in (base.name, "auto")]
    specs += [("auto", PRESETS["auto"])]
    return dedupe(specs, env, stage="presets")


def _base_name(c: Candidate) -> str:
    return next((n for n in c.names if n in PRESETS and n not in ("auto", "baseline")), c.name)


def knob_candidates(survivors: list[Candidate], env: EnvReport, existing: list[Candidate]) -> list[Candidate]:
    """Stage 2: on each surviving real (not emulated) precision, the optimizer implementations and
    torch.compile. FP8 on real hardware is only tried compiled as well (torchao needs compile to
    be fast: an FP8 FFN ran 3.14 ms vs 0.92 ms fp16 eager in torchao's report)."""
    specs: list[tuple[str, Recipe]] = []
    for c in survivors:
        if c.emulated or c.baseline or c.resolved.activation_checkpointing != "none":
            continue  # the baseline's precision is reached through its preset (fp32), not twice
        name = _base_name(c)
        rec = dataclasses.replace(c.recipe, name=name)
        if not c.resolved.fp8_backend:
            for knob in ("fused-adamw", "foreach", "for-loop"):
                specs.append(_with_knob(name, rec, knob))
        if env.engine_ok("torch.compile") and c.resolved.compile == "off":
            specs.append(_with_knob(name, rec, "compile"))
    return dedupe(specs, env, stage="knobs", existing=existing)


def checkpointing_candidates(survivors: list[Candidate], env: EnvReport,
                             existing: list[Candidate]) -> list[Candidate]:
    """Stage 3, only when memory is the limit: full and selective activation checkpointing."""
    specs = []
    for c in survivors:
        if c.emulated:
            continue
        for knob in ("ckpt", "ckpt-selective"):
            specs.append(_with_knob(c.name, c.recipe, knob))
    return dedupe(specs, env, stage="checkpointing", existing=existing)


def parse_name(name: str) -> Recipe:
    """A recipe name: a preset, or "preset+knob+..." with the knobs above (the grammar of the recipe
    name registry; this also works where that registry has not landed). ValueError names the fix."""
    try:
        return dataclasses.replace(get_recipe(name), name=name)
    except ValueError:
        head, *knobs = [p.strip() for p in name.split("+")]
        if not knobs:
            raise
        rec = get_recipe(head)
        for k in knobs:
            if k not in _KNOBS:
                raise ValueError(f"unknown recipe knob '{k}' in {name!r}: knobs are {', '.join(_KNOBS)}") from None
            rec = dataclasses.replace(rec, **_KNOBS[k])
        return dataclasses.replace(rec, name=name)


def named_candidates(names: list[str], env: EnvReport) -> list[Candidate]:
    """`--configs a,b,c`: exactly these (the baseline is always measured first, as the reference)."""
    base = baseline_recipe()
    specs = [(base.name, base)]
    for n in names:
        specs.append((n, parse_name(n)))  # ValueError names the bad one; the CLI makes it one line
    return dedupe(specs, env, stage="presets")
