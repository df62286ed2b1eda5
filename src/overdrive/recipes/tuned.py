"""The cache of `overdrive tune` winners, keyed by model signature and machine fingerprint.

`accelerate(model, recipe="tuned")` looks here: the winner tuned for a model with the same
parameter names and shapes, on a machine with the same fingerprint (CPU/GPU model, torch build)
and thread count. A recipe tuned on an H100 says nothing about an A100, and one tuned for a
128-wide model says nothing about a 4096-wide one, so both must match. Engines count only where
the winner uses them: installing onnx (or torchao, for a winner that does not use it) changes no
speed and keeps the entry; the engines the winner ran on are stored with it, and an entry whose
engines changed since is not used, with what changed. Where no entry matches but one for this model
exists from another machine state, the fallback says so, and what differs.
"""

from __future__ import annotations

import hashlib
import json
import os

from overdrive.env import EnvReport
from overdrive.io import load_json_bounded
from overdrive.formats import find_format
from overdrive.recipes.recipe import Recipe

__all__ = ["model_signature", "machine_fingerprint", "tuned_path", "save_tuned", "load_tuned"]


def model_signature(model) -> str:
    """A short hash of the model's parameter names and shapes (not their values): the same
    architecture at the same sizes gives the same signature, whatever the weights."""
    parts = [f"{n}:{tuple(p.shape)}" for n, p in model.named_parameters()]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def machine_state(env: EnvReport) -> dict:
    """What decides which recipe is fastest here, readable: the CPU (model, ISA, bf16 units), the GPUs
    (name, SM, memory) and the torch build. Not which engines are installed (`recipe_engines` stores
    those the winner uses), nor the probe time or measured rates (those vary run to run)."""
    cpu = env.platform.get("cpu", {})
    return {"cpu": f"{cpu.get('model')} ({cpu.get('arch')}, {cpu.get('isa')}, {cpu.get('count')} cores)",
            "cpu_flags": ",".join(sorted(k for k, v in (cpu.get("flags") or {}).items() if v)),
            "torch": f"{env.torch.get('version')}" + (f" CUDA {env.torch.get('cuda')}" if env.torch.get("cuda") else ""),
            "gpus": ";".join(f"{g.name}/{g.cc[0]}.{g.cc[1]}/{round(g.mem_gib)}" for g in env.gpus) or "none"}


def machine_fingerprint(env: EnvReport) -> str:
    """A short hash of `machine_state`."""
    st = machine_state(env)
    return hashlib.sha256("|".join(f"{k}={st[k]}" for k in sorted(st)).encode()).hexdigest()[:16]


def recipe_engines(recipe: Recipe, env: EnvReport) -> dict[str, str]:
    """The engines `recipe` runs on here (as resolved on `env`), each with its status and version."""
    from overdrive.recipes import resolve

    try:
        r = resolve(recipe, env)
    except Exception:  # noqa: BLE001 — a recipe that no longer resolves stores no engines (it is re-tuned)
        return {}
    used = set()
    if r.fp8_backend in ("torchao", "emulated"):
        used.add("torchao")
    if r.fp8_backend == "transformer_engine":
        used.add("transformer_engine")
    fmt = find_format(r.fp8_scaling) if r.fp8_backend else None
    if fmt is not None and fmt.probed:  # the env reports this format's own status (`env.engines`)
        used.add(fmt.kind)
    fields = " ".join(str(x) for x in (r.optimizer, r.norm, r.loss))
    used |= {e for e, words in (("apex", ("apex",)), ("liger_kernel", ("liger", "fused-linear")),
                                ("transformer_engine", ("te-", "transformer_engine"))) if any(w in fields for w in words)}
    if r.optimizer == "torch-fused":
        used.add("fused_adamw")
    if r.compile not in ("off", "none", None):
        used |= {"torch.compile", "triton"}
    return {e: f"{env.engines[e].status} {env.engines[e].version or ''}".strip() for e in sorted(used)
            if e in env.engines}


def _root() -> str:
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(root, "overdrive", "tuned")


def tuned_path(signature: str, fingerprint: str, threads: int | None = None) -> str:
    """One entry per model, machine (torch version included in the fingerprint) and thread count: a
    recipe measured with 1 thread on a busy host says little about 16 threads on a quiet one."""
    return os.path.join(_root(), fingerprint, f"{signature}.json" if not threads else f"{signature}-t{threads}.json")


def _read(p: str) -> dict | None:
    try:
        d = load_json_bounded(p, what="a tuned recipe")
        return d if isinstance(d, dict) else None
    except (OSError, ValueError, RecursionError):
        return None


def save_tuned(recipe: Recipe, *, signature: str, fingerprint: str, summary: str, threads: int | None = None,
               confident: bool = True, env: EnvReport | None = None) -> tuple[str, bool]:
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
    extra = {"machine": machine_state(env), "engines": recipe_engines(recipe, env)} if env is not None else {}
    write_atomic(p, json.dumps({"recipe": recipe.to_dict(), "signature": signature, "fingerprint": fingerprint,
                                "threads": threads, "confident": confident, "summary": summary, **extra},
                               indent=2) + "\n")
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
        return None, (f"no tuned recipe for this model (signature {sig}) on this machine (fingerprint {fp})"
                      + _older(sig, fp, env) + ": run `overdrive tune` or overdrive.tune() first")
    except (OSError, ValueError, TypeError, KeyError) as e:
        return None, f"the tuned recipe at {p} is unreadable ({e}): run `overdrive tune` again"
    engines = d.get("engines") if isinstance(d.get("engines"), dict) else {}  # a file is untrusted input
    changed = [f"{str(e)[:40]} was {str(was)[:40]!r} when tuned, is {_engine_now(env, e)!r} now"
               for e, was in engines.items() if _engine_now(env, e) != was]
    if changed:
        return None, (f"the tuned recipe {str(rec.name)[:40]!r} for this model is stale: it runs on engines that "
                      f"changed ({'; '.join(changed)}): run `overdrive tune` again")
    from overdrive.recipes.recipe import recipe_name

    named = recipe_name(rec)  # the name says what the fields are: a cached name is never trusted
    if rec.name != named:
        import dataclasses

        note += f"; cached as {str(rec.name)[:40]!r}, its fields are {named!r}"
        rec = dataclasses.replace(rec, name=named)
    return rec, (f"tuned winner for this model on this machine ({d.get('summary', '')})".replace(" ()", "") + note)


def _engine_now(env: EnvReport, name) -> str:
    e = env.engines.get(name) if isinstance(name, str) else None
    return f"{e.status} {e.version or ''}".strip() if e else "not probed"


def _older(sig: str, fp: str, env: EnvReport) -> str:
    """'; an older entry exists (tuned 3 h ago with torch 2.12.0): torch 2.12.0 -> 2.13.0': an entry for
    this model from another machine state, and what differs from now."""
    import glob
    import time

    found = [q for q in glob.glob(os.path.join(_root(), "*", f"{sig}*.json")) if os.path.dirname(q) != os.path.dirname(
        tuned_path(sig, fp))]
    if not found:
        return ""
    q = max(found, key=os.path.getmtime)
    d = _read(q) or {}
    age = (time.time() - os.path.getmtime(q)) / 60
    when = f"{age:.0f} min ago" if age < 120 else f"{age / 60:.0f} h ago"
    was, now = d.get("machine"), machine_state(env)
    if not isinstance(was, dict):
        what = "it was keyed on every engine's status (an older cache key), so an unrelated install hid it"
    else:
        what = ", ".join(f"{k} {was.get(k)} -> {now[k]}" for k in now if was.get(k) != now[k]) or "the same machine"
    return f"; an older entry for it exists ({q}, tuned {when}; what changed: {what})"
