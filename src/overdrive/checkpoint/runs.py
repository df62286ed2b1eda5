"""A run's checkpoints: RUN/checkpoints/step_0000100/ (one folder.py folder each) and
RUN/checkpoints/latest naming the newest. `keep_last` prunes only checkpoints of the same run (the
run id is in each manifest); a damaged newest checkpoint is reported in one line and the newest
intact one is used instead; entries that are not ours (a `latest` folder, a `step_N` file, another
tool's files) are never deleted, and named when they are in the way.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable

from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from overdrive.checkpoint.folder import (CheckpointError, gather, load_folder, recover_folder, save_folder,
                                         verify_folder)
from overdrive.checkpoint.manifest import PARTIAL, is_ours, read_manifest
from overdrive.io import write_atomic

__all__ = ["save_checkpoint", "load_checkpoint", "latest_checkpoint", "resume_checkpoint", "verify_checkpoint",
           "load_model_weights", "check_checkpoint_root", "clean_partial_saves"]

# What an interrupted save of an earlier version left (no partial marker yet): DCP shards and our files.
_LEGACY_TMP = (".metadata", "manifest.json")


def ckpt_root(run_dir: str) -> str:
    return os.path.join(run_dir, "checkpoints")


def _steps(root: str) -> list[str]:
    if not os.path.isdir(root):
        return []
    return sorted(d for d in os.listdir(root) if d.startswith("step_") and not d.endswith((".tmp", ".old"))
                  and os.path.isdir(os.path.join(root, d)) and not os.path.islink(os.path.join(root, d)))


def check_checkpoint_root(run_dir: str) -> None:
    """Refuse, before any training, a checkpoints/ folder whose `latest` we could not write."""
    latest = os.path.join(ckpt_root(run_dir), "latest")
    if os.path.lexists(latest) and (os.path.islink(latest) or not os.path.isfile(latest)):
        raise CheckpointError(f"{latest} is not the small text file overdrive writes there (a folder or a link): "
                              "move it away, or set another train.out_dir")


def _partial_of_ours(path: str) -> bool:
    if is_ours(path):
        return True
    try:  # a .tmp of an earlier version: only DCP shards and our own files
        names = os.listdir(path)
    except OSError:
        return False
    return bool(names) and all(n.endswith(".distcp") or n.startswith("extra_rank") or n in _LEGACY_TMP
                               or n.startswith(".tmp-") for n in names)


def clean_partial_saves(run_dir: str) -> list[str]:
    """Delete the .tmp folders interrupted saves left (ours only; the run's lock is held, so no
    save is under way). Returns what was deleted."""
    root, gone = ckpt_root(run_dir), []
    if not os.path.isdir(root):
        return gone
    for n in sorted(os.listdir(root)):  # a save killed between its two renames: its whole copy goes back first
        if n.startswith("step_") and n.endswith((".tmp", ".old")):
            recover_folder(os.path.join(root, n[:-4]))
    for n in sorted(os.listdir(root)):
        p = os.path.join(root, n)
        if n.startswith("step_") and n.endswith((".tmp", ".old")) and not os.path.islink(p) and os.path.isdir(p) \
                and _partial_of_ours(p):
            shutil.rmtree(p, ignore_errors=True)
            gone.append(p)
    return gone


def save_checkpoint(run_dir: str, step: int, model, optimizer, extra: dict, *, rank: int, world: int,
                    keep_last: int, run_id: str = "", on_written: Callable[[str], None] | None = None,
                    identity: dict | None = None) -> str:
    """Save step `step` atomically and verifiably (see folder.py); point `latest` at it; prune."""
    root = ckpt_root(run_dir)
    final = os.path.join(root, f"step_{step:07d}")
    if rank == 0 and os.path.isdir(final) and not os.path.islink(final) and not is_ours(final) \
            and _partial_of_ours(final):
        shutil.rmtree(final)  # an earlier version's incomplete step folder
    model_sd, optim_sd = get_state_dict(model, optimizer)
    info = {"kind": "train", "run_id": run_id, "step": step}
    if identity is not None:
        info["identity"] = identity
    save_folder(final, {"model": model_sd, "optim": optim_sd}, extra, rank=rank, world=world, info=info,
                on_written=on_written)
    if rank == 0:
        write_atomic(os.path.join(root, "latest"), os.path.basename(final) + "\n")
        _prune(root, run_id, keep_last)
    return final


def _run_of(path: str) -> str | None:
    m = read_manifest(path)
    return m.get("run_id") if m else None


def _prune(root: str, run_id: str, keep_last: int) -> None:
    """Delete this run's older checkpoints; another run's (or a foreign folder's) are not ours to delete."""
    mine = [d for d in _steps(root) if _run_of(os.path.join(root, d)) == run_id]
    for old in mine[:-keep_last]:
        shutil.rmtree(os.path.join(root, old), ignore_errors=True)


def _complete(path: str) -> bool:
    return all(os.path.isfile(os.path.join(path, f)) for f in (".metadata", "extra_rank0.pt", "manifest.json")) \
        and not os.path.exists(os.path.join(path, PARTIAL))


def _candidates(run_dir: str, run_id: str | None) -> list[str]:
    """Complete checkpoints, newest first (the `latest` pointer first), of `run_id` when given."""
    root = ckpt_root(run_dir)
    out = [os.path.join(root, d) for d in reversed(_steps(root))]
    try:
        with open(os.path.join(root, "latest")) as f:
            pointed = os.path.join(root, f.read(256).strip())
        if pointed in out:
            out.remove(pointed)
            out.insert(0, pointed)
    except (OSError, UnicodeDecodeError):  # missing, a folder, binary: the scan decides
        pass
    return [p for p in out if _complete(p) and (run_id is None or _run_of(p) == run_id)]


def latest_checkpoint(run_dir: str, *, run_id: str | None = None, verify: bool = False) -> str | None:
    """The newest complete checkpoint of a run (the `latest` pointer, else a scan); None if none.
    verify=True also checks sizes and SHA-256 against the manifest (single process)."""
    for p in _candidates(run_dir, run_id):
        if not verify or verify_checkpoint(p) is None:
            return p
    return None


def verify_checkpoint(path: str, *, rank: int = 0, world: int = 1) -> str | None:
    """None if the checkpoint is intact, else the first problem found (collective when world > 1)."""
    return verify_folder(path, rank=rank, world=world)


def load_checkpoint(path: str, model, optimizer, *, rank: int, world: int) -> dict:
    """Verify, then restore model and optimizer (resharding to this world size); returns this rank's
    extra state. Any failure is a one-line CheckpointError."""
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd}
    extra = load_folder(path, state, rank=rank, world=world, check_extra=lambda x: _check_train_extra(x, path, rank))
    try:
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    except Exception as e:
        raise CheckpointError(f"cannot load {path}: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
                              " (was it written for another model size?)") from None
    return extra


def _check_train_extra(extra: dict, path: str, rank: int) -> None:
    """The fields a resume reads from extra_rank*.pt (untrusted: a manifest can be resealed), checked before
    any tensor is loaded: a bad one makes the checkpoint damaged (the previous one is used), never a
    traceback or a run resumed at step -100 with a negative learning rate."""
    step = extra.get("step")
    bad = [] if isinstance(step, int) and not isinstance(step, bool) and 0 <= step < 2 ** 62 else [f"step {step!r}"]
    bad += [f"{k} ({type(extra[k]).__name__})" for k in ("rng", "scaler") if extra.get(k) is not None
            and not isinstance(extra[k], dict)]
    if extra.get("scale") is not None and not isinstance(extra["scale"], (int, float)):
        bad.append(f"scale ({type(extra['scale']).__name__})")
    if bad:
        raise CheckpointError(f"{path}: extra_rank{rank}.pt holds {', '.join(bad)}, not what a save writes (a step "
                              "count >= 0, state dicts): the file was edited")


def resume_checkpoint(run_dir: str, model, optimizer, *, run_id: str | None, rank: int, world: int,
                      say: Callable[[str], None]) -> tuple[str | None, dict | None]:
    """Load the newest intact checkpoint of the run; a damaged one is reported through `say` (one line,
    naming it and the one used instead) and skipped. (None, None) if the run has no checkpoint;
    CheckpointError if it has some and none loads."""
    tried: list[str] = []
    for path in _candidates(run_dir, run_id):
        try:
            extra = load_checkpoint(path, model, optimizer, rank=rank, world=world)
            err = None
        except CheckpointError as e:
            extra, err = None, str(e)
        errs = [x for x in gather(err, world) if x]  # every rank takes the same decision
        if not errs:
            if tried:
                more = f" (and {len(tried) - 1} more)" if len(tried) > 1 else ""
                say(f"{tried[0]}{more}; resuming from the newest intact one, {path}")
            return path, extra
        tried.append(errs[0])
    if tried:
        raise CheckpointError(f"no checkpoint under {ckpt_root(run_dir)} can be used (newest: {tried[0]}): "
                              "restore them or start afresh with --overwrite")
    return None, None


def load_model_weights(path: str, model) -> None:
    """Model weights only, from a verified checkpoint folder (no optimizer), into a plain model."""
    sd = {"model": model.state_dict()}
    try:
        load_folder(path, sd, rank=0, world=1)
    except CheckpointError as e:
        raise CheckpointError(str(e).replace(" is damaged:", " is not a usable checkpoint:")) from None
    try:
        model.load_state_dict(sd["model"])
    except Exception as e:
        raise CheckpointError(f"cannot load {path}: {type(e).__name__} (was it written for another model size?)") \
            from None


