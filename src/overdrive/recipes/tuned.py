"""The cache of `overdrive tune` winners, keyed by model signature and machine fingerprint.

`accelerate(model, recipe="tuned")` looks here: the winner tuned for a model with the same
parameter names and shapes, on a machine with the same fingerprint (CPU/GPU model, torch and
engine status as the doctor reports them). A recipe tuned on an H100 says nothing about an A100,
and one tuned for a 128-wide model says nothing about a 4096-wide one, so both must match.
"""

from __future__ import annotations

import hashlib
import json
import os

from overdrive.env import EnvReport
from overdrive.recipes.recipe import Recipe

__all__ = ["model_signature", "machine_fingerprint", "tuned_path", "save_tuned", "load_tuned"]


def model_signature(model) -> str:
    """A short hash of the model's parameter names and shapes (not their values): the same
    architecture at the same sizes gives the same signature, whatever the weights."""
    parts = [f"{n}:{tuple(p.shape)}" for n, p in model.named_parameters()]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def machine_fingerprint(env: EnvReport) -> str:
    """A short hash of what decides which recipe is fastest here: the CPU (model, ISA, bf16 units),
    the GPUs (name, SM, memory), the torch build and which engines work. Not the probe time or
    measured rates (those vary run to run)."""
    cpu = env.platform.get("cpu", {})
    parts = [cpu.get("model"), cpu.get("arch"), cpu.get("isa"), str(cpu.get("count")),
             ",".join(sorted(k for k, v in (cpu.get("flags") or {}).items() if v)),
             env.torch.get("version"), env.torch.get("cuda"),
             ";".join(f"{g.name}/{g.cc[0]}.{g.cc[1]}/{round(g.mem_gib)}" for g in env.gpus),
             ";".join(f"{k}={v.status}" for k, v in sorted(env.engines.items()))]
    return hashlib.sha256("|".join(str(p) for p in parts).encode()).hexdigest()[:16]


def _root() -> str:
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(root, "overdrive", "tuned")


def tuned_path(signature: str, fingerprint: str, threads: int | None = None) -> str:
    """One entry per model, machine (torch version included in the fingerprint) and thread count: a
    recipe measured with 1 thread on a busy host says little about 16 threads on a quiet one."""
    return os.path.join(_root(), fingerprint, f"{signature}.json" if not threads else f"{signature}-t{threads}.json")


def _read(p: str) -> dict | None:
    try:
        with open(p) as f:
            d = json.load(f)
        return d if isinstance(d, dict) else None
    except (OSError, ValueError, RecursionError):
        return None


def save_tuned(recipe: Recipe, *, signature: str, fingerprint: str, summary: str, threads: int | None = None,
               confident: bool = True) -> tuple[str, bool]:
    """Record `recipe` as the tuned winner for this model, machine and thread count; returns (path,
    written). An inconclusive run (`confident=False`: nothing beat the baseline with evidence, or
    the host was too busy to judge) never replaces a confident winner already cached; a cached "keep
    the baseline" (no winner: it changes nothing) is always replaceable, so an entry a faulty run left
    never blocks later runs."""
    from overdrive.io import write_atomic

    p = tuned_path(signature, fingerprint, threads)
    old = _read(p)
    rec = old.get("recipe") if old is not None else None
    kept_baseline = not isinstance(rec, dict) or rec.get("name") == "baseline"  # (an unreadable entry: replaceable)
    if not confident and old is not None and old.get("confident", True) and not kept_baseline:
        return p, False
    write_atomic(p, json.dumps({"recipe": recipe.to_dict(), "signature": signature, "fingerprint": fingerprint,
                                "threads": threads, "confident": confident, "summary": summary}, indent=2) + "\n")
    return p, True


def load_tuned(model, env: EnvReport) -> tuple[Recipe | None, str]:
    """(the cached winner or None, a sentence saying which and why)."""
    import glob

    import torch

    sig, fp = model_signature(model), machine_fingerprint(env)
    threads = torch.get_num_threads()
    p = tuned_path(sig, fp, threads)
    note = ""
    if not os.path.exists(p):  # tuned with another thread count (or before threads were in the key)
        others = sorted(glob.glob(tuned_path(sig, fp, 0)[:-len(".json")] + "*.json"))
        if others:
            p = others[0]
            t = (_read(p) or {}).get("threads")
            note = f"; tuned with {t} thread(s), this process uses {threads}" if t else ""
    from overdrive.io import read_json

    try:
        d = read_json(p, what="tuned recipe")  # the shared reader: one-line errors, deep nesting caught
        rec = Recipe(**d["recipe"])
    except FileNotFoundError:
        return None, (f"no tuned recipe for this model (signature {sig}) on this machine (fingerprint {fp}): "
                      "run `overdrive tune` or overdrive.tune() first")
    except (OSError, ValueError, TypeError, KeyError) as e:
        return None, f"the tuned recipe at {p} is unreadable ({e}): run `overdrive tune` again"
    from overdrive.recipes.names import recipe_name

    named = recipe_name(rec)  # the name says what the fields are: a cached name is never trusted
    if rec.name != named:
        import dataclasses

        note += f"; cached as {str(rec.name)[:40]!r}, its fields are {named!r}"
        rec = dataclasses.replace(rec, name=named)
    return rec, (f"tuned winner for this model on this machine ({d.get('summary', '')})".replace(" ()", "") + note)
