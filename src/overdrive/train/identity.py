"""A run's identity: what `--resume` must not change without saying so. Stored in every checkpoint's
manifest and compared before anything is loaded; a difference is refused, naming each field, unless
the user passes --allow-changes (then it is said)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable

from overdrive.checkpoint import latest_checkpoint, read_manifest

__all__ = ["RunMismatch", "run_identity", "identity_changes", "check_identity"]


class RunMismatch(ValueError):
    """--resume with settings that differ from the checkpoint's run (and no --allow-changes)."""


def run_identity(cfg, model) -> dict:
    """The model's shape, the recipe, the seed, the data, the batch and the optimizer settings (not the
    step count, the intervals or the micro-batch: more steps or a smaller micro-batch is the same run)."""
    t = cfg.train
    ident = {"model": dataclasses.asdict(model.config), "recipe": t.recipe, "seed": t.seed, "seq_len": t.seq_len,
             "global_batch": t.global_batch, "data": dataclasses.asdict(cfg.data),
             "optimizer": dataclasses.asdict(cfg.optimizer),
             "teacher": dataclasses.asdict(cfg.teacher) if cfg.teacher else None}
    return json.loads(json.dumps(ident))  # as the manifest stores it (tuples become lists)


def _flat(d, prefix: str = "") -> dict:
    if not isinstance(d, dict):
        return {prefix: d}
    out = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def identity_changes(saved: dict, now: dict) -> list[str]:
    """'key: saved -> now' for every field that differs."""
    a, b = _flat(saved), _flat(now)
    return [f"{k}: {a.get(k, '(unset)')!r} -> {b.get(k, '(unset)')!r}" for k in sorted(set(a) | set(b))
            if a.get(k) != b.get(k)]


def check_identity(run_dir: str, run_id: str, identity: dict, *, allow_changes: bool,
                   say: Callable[[str], None]) -> None:
    """Compare `identity` with the newest checkpoint's (read on every rank: the same file, the same answer)."""
    newest = latest_checkpoint(run_dir, run_id=run_id)
    if newest is None:
        return
    saved = (read_manifest(newest) or {}).get("identity")
    if not isinstance(saved, dict):
        say(f"{newest} records no run identity (an older version's checkpoint): settings not compared")
        return
    changes = identity_changes(saved, identity)
    if not changes:
        return
    listed = "; ".join(changes[:6]) + (f" and {len(changes) - 6} more" if len(changes) > 6 else "")
    if not allow_changes:
        raise RunMismatch(f"--resume with settings that differ from the checkpoint's run ({listed}): restore them, "
                          "or pass --allow-changes to continue with the new ones")
    say(f"resuming with changed settings (--allow-changes): {listed}")
