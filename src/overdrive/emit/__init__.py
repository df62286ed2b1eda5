"""Overdrive picks, your stack runs it: the winning recipe written as another stack's own configuration.

    overdrive tune --model models.py:make --batch models.py:batch --out tuned --emit accelerate --emit trainer
    overdrive emit tuned --for lightning --for torchtitan          # later, from the tune folder
    overdrive.emit.emit("tuned", stacks=["accelerate"], out="tuned")

| stack       | file                   | loads with                                                        |
|-------------|------------------------|-------------------------------------------------------------------|
| accelerate  | accelerate_config.yaml | accelerate launch --config_file (-> Accelerator)                  |
| trainer     | training_args.json     | HfArgumentParser(TrainingArguments).parse_json_file / **kwargs    |
| torchtitan  | torchtitan.toml        | torchtitan ConfigManager: --job.config_file (0.2.x JobConfig)     |
| lightning   | lightning_trainer.yaml | LightningCLI --config, or Trainer(**cfg["trainer"])               |

What a stack cannot express is one line each, in the file's header (YAML/TOML), in emit.json and on
the console; nothing is dropped silently. emit.json lists every file written, so a re-emit replaces
only its own files, never one a user put there.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass

from overdrive.emit.hf import accelerate_config, training_args
from overdrive.emit.others import lightning_config, torchtitan_config
from overdrive.emit.target import Target, load_target
from overdrive.errors import UserError
from overdrive.io import load_json_bounded

__all__ = ["STACKS", "emit", "Emitted", "load_target", "Target", "parse_stacks"]

STACKS = {"accelerate": ("accelerate_config.yaml", accelerate_config),
          "trainer": ("training_args.json", training_args),
          "torchtitan": ("torchtitan.toml", torchtitan_config),
          "lightning": ("lightning_trainer.yaml", lightning_config)}


@dataclass(frozen=True, kw_only=True)
class Emitted:
    stack: str
    path: str
    config: dict
    cannot: list[str]
    """What the stack cannot express, one line each."""


def _text(s) -> str:
    """Text for a comment line: a newline or any other control character from a (possibly tampered) tune
    folder would start a config line of its own, so each is written escaped."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(s))


def _key(k) -> str:
    # A bare key only when it is one; anything else quoted (YAML and TOML both read a JSON string as a key).
    return k if isinstance(k, str) and re.fullmatch(r"[A-Za-z0-9_-]+", k) else json.dumps(str(k))


def _scalar(v, toml: bool) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, list):
        return "[" + ", ".join(_scalar(x, toml) for x in v) + "]"
    if isinstance(v, dict) and toml:
        return "{ " + ", ".join(f"{_key(k)} = {_scalar(x, toml)}" for k, x in v.items()) + " }"
    return json.dumps(str(v))  # a JSON string is a valid YAML and TOML basic string


def _yaml(d: dict, indent: int = 0) -> list[str]:
    out = []
    for k, v in d.items():
        if isinstance(v, dict):
            out.append(" " * indent + f"{_key(k)}:")
            out += _yaml(v, indent + 2)
        else:
            out.append(" " * indent + f"{_key(k)}: {_scalar(v, False)}")
    return out


def _toml(d: dict, prefix: str = "") -> list[str]:
    out, tables = [], []
    for k, v in d.items():
        if isinstance(v, dict):
            tables.append((k, v))
        else:
            out.append(f"{_key(k)} = {_scalar(v, True)}")
    for k, v in tables:
        name = f"{prefix}.{_key(k)}" if prefix else _key(k)
        if any(not isinstance(x, dict) for x in v.values()):
            out += ["", f"[{name}]"]
        out += _toml(v, name)
    return out


def _render(stack: str, cfg: dict, cannot: list[str], t: Target) -> str:
    if stack == "trainer":
        return json.dumps(cfg, indent=2) + "\n"
    what = "torchtitan 0.2.x (--job.config_file; 0.3 configures in Python)" if stack == "torchtitan" else stack
    head = [f"# {what} configuration written by `overdrive emit` from recipe {_text(t.recipe.name)} ({_text(t.where)}).",
            *(["# Not expressible here (one line each):"] + [f"#   - {_text(c)}" for c in cannot] if cannot else [])]
    body = _toml(cfg) if stack == "torchtitan" else _yaml(cfg)
    return "\n".join(head + [""] + [x for x in body if x or stack == "torchtitan"]).strip() + "\n"


def parse_stacks(stacks) -> list[str]:
    names = [s.strip().lower() for x in ([stacks] if isinstance(stacks, str) else stacks) for s in str(x).split(",")]
    names = list(dict.fromkeys(n for n in names if n))
    bad = [n for n in names if n not in STACKS]
    if bad or not names:
        raise UserError(f"--emit/--for {bad[0] if bad else '(none)'!r}: stacks are {', '.join(STACKS)}")
    return names


def _our_index(path: str) -> dict:
    """emit.json as an earlier emit wrote it ({} when there is none); a file of that name that is not
    ours is the user's: refused, never replaced."""
    if not os.path.lexists(path):
        return {}
    try:
        doc = load_json_bounded(path, what="emit.json")
    except (OSError, ValueError, RecursionError):
        doc = None
    if not (isinstance(doc, dict) and isinstance(doc.get("files"), dict) and "recipe" in doc and "ran" in doc):
        raise UserError(f"{path} exists and overdrive emit did not write it: move it, or pass another --out")
    return doc


def emit(src: str | Target, *, stacks, out: str, env=None) -> list[Emitted]:
    """Write the winner of `src` (a tune folder, its results.json, or a recipe.json) for each stack into `out`."""
    from overdrive.io import check_writable, write_atomic

    names = parse_stacks(stacks)
    t = src if isinstance(src, Target) else load_target(src, env=env)
    check_writable(out, flag="--out")  # a file, or a folder that cannot be made: one line
    index_path = os.path.join(out, "emit.json")
    index = _our_index(index_path)
    ours = set(index.get("files", {}))
    for n in names:  # every file checked before any is written: a refusal leaves nothing half-emitted
        path = os.path.join(out, STACKS[n][0])
        if os.path.lexists(path) and STACKS[n][0] not in ours:
            raise UserError(f"{path} exists and overdrive emit did not write it: move it, or pass another --out")
    done = []
    for n in names:
        fname, fn = STACKS[n]
        path = os.path.join(out, fname)
        cfg, cannot = fn(t)
        write_atomic(path, _render(n, cfg, cannot, t))
        done.append(Emitted(stack=n, path=path, config=cfg, cannot=cannot))
    files = dict(index.get("files", {}))
    files.update({os.path.basename(e.path): {"stack": e.stack, "cannot": e.cannot} for e in done})
    write_atomic(index_path, json.dumps({"recipe": t.recipe.name, "ran": {k: t.ran.get(k) for k in (
        "precision", "fp8_backend", "fp8_scaling", "optimizer", "norm", "loss", "compile", "activation_checkpointing")},
        "where": t.where, "source": t.source, "files": files}, indent=2) + "\n")
    return done
