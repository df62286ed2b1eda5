"""Sharded, crash-safe, verified checkpoints with torch.distributed.checkpoint (DCP).

Layout: RUN/checkpoints/step_0000100/ (DCP shards + .metadata + one extra_rankN.pt per rank with
the step, scheduler, RNG and data position + manifest.json), and RUN/checkpoints/latest naming the
newest. A save writes into step_N.tmp/; once every rank has finished, the ranks hash the files in
parallel, rank 0 writes the manifest (last, atomically) and renames the folder into place. A crash
(even SIGKILL) mid-save leaves a .tmp folder that is ignored, and the previous checkpoint stays
loadable. `keep_last` prunes only checkpoints of the same run (the run id is in each manifest).

Loading verifies the manifest (sizes + SHA-256) and reads `.metadata` through an allow-list
unpickler (integrity.py): a damaged newest checkpoint is reported in one line and the newest intact
one is used instead; a tampered one never runs code.
"""

from __future__ import annotations

import os
import shutil
import warnings
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from overdrive.io import write_atomic
from overdrive.train.integrity import (SafeReader, UnsafeCheckpoint, hash_files, read_manifest, verify_manifest,
                                       write_manifest)

__all__ = ["save_checkpoint", "load_checkpoint", "latest_checkpoint", "resume_checkpoint", "CheckpointError",
           "load_model_weights", "verify_checkpoint"]


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used; the message says which and what to do."""


def _barrier(world: int) -> None:
    if world > 1:
        dist.barrier()


def _gather(obj, world: int) -> list:
    if world == 1:
        return [obj]
    out = [None] * world
    dist.all_gather_object(out, obj)
    return out


def _ckpt_root(run_dir: str) -> str:
    return os.path.join(run_dir, "checkpoints")


def _quiet_dcp():
    w = warnings.catch_warnings()
    w.__enter__()
    warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")  # single process: it is
    return w


def _steps(root: str) -> list[str]:
    if not os.path.isdir(root):
        return []
    return sorted(d for d in os.listdir(root) if d.startswith("step_") and not d.endswith(".tmp"))


def save_checkpoint(run_dir: str, step: int, model, optimizer, extra: dict, *, rank: int, world: int,
                    keep_last: int, run_id: str = "", on_written: Callable[[str], None] | None = None) -> str:
    """Save, verify-able and atomically; `on_written(tmp_dir)` is called once this rank's files are
    written, before the rename (tests use it to kill a save half-way)."""
    root = _ckpt_root(run_dir)
    final = os.path.join(root, f"step_{step:07d}")
    tmp = final + ".tmp"
    if rank == 0:
        os.makedirs(root, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
    _barrier(world)
    model_sd, optim_sd = get_state_dict(model, optimizer)
    w = _quiet_dcp()
    try:
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=tmp, no_dist=world == 1)
    finally:
        w.__exit__(None, None, None)
    torch.save(extra, os.path.join(tmp, f"extra_rank{rank}.pt"))
    if on_written:
        on_written(tmp)
    _barrier(world)
    parts = _gather(hash_files(tmp, rank=rank, world=world), world)
    if rank == 0:
        files = {k: v for p in parts for k, v in p.items()}
        write_manifest(tmp, files, run_id=run_id, step=step, world=world)
        if os.path.exists(final):
            shutil.rmtree(final)
        os.rename(tmp, final)
        write_atomic(os.path.join(root, "latest"), os.path.basename(final) + "\n")
        _prune(root, run_id, keep_last)
    _barrier(world)
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
    return all(os.path.exists(os.path.join(path, f)) for f in (".metadata", "extra_rank0.pt", "manifest.json"))


def _candidates(run_dir: str, run_id: str | None) -> list[str]:
    """Complete checkpoints, newest first (the `latest` pointer first), of `run_id` when given."""
    root = _ckpt_root(run_dir)
    out = [os.path.join(root, d) for d in reversed(_steps(root))]
    try:
        with open(os.path.join(root, "latest")) as f:
            pointed = os.path.join(root, f.read().strip())
        if pointed in out:
            out.remove(pointed)
            out.insert(0, pointed)
    except OSError:
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
    if not _complete(path):
        return "incomplete (.metadata, extra_rank0.pt or manifest.json missing)"
    errs = [e for e in _gather(verify_manifest(path, rank=rank, world=world), world) if e]
    return errs[0] if errs else None


def _load(path: str, model, optimizer, *, rank: int, world: int) -> dict:
    SafeReader(path).read_metadata()  # the trust check first, in our words, before DCP sees the folder
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd}
    w = _quiet_dcp()
    try:
        dcp.load(state, storage_reader=SafeReader(path), no_dist=world == 1)
    finally:
        w.__exit__(None, None, None)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    mine = os.path.join(path, f"extra_rank{rank}.pt")
    if not os.path.exists(mine):  # resuming on more ranks than saved: rank 0's step and schedule
        mine = os.path.join(path, "extra_rank0.pt")
    return torch.load(mine, weights_only=True)


def _why(e: BaseException) -> str:
    # DCP's CheckpointException derives from BaseException and carries each rank's failure.
    if isinstance(e, CheckpointException) and getattr(e, "failures", None):
        e = next(iter(e.failures.values()))
        e = getattr(e, "exception", e)
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {(text[0] if text else '')[:200]}"


def load_checkpoint(path: str, model, optimizer, *, rank: int, world: int) -> dict:
    """Verify, then restore model and optimizer (resharding to this world size); returns this rank's
    extra state. Any failure is a one-line CheckpointError."""
    bad = verify_checkpoint(path, rank=rank, world=world)
    if bad:
        raise CheckpointError(f"{path} is damaged: {bad}")
    try:
        return _load(path, model, optimizer, rank=rank, world=world)
    except UnsafeCheckpoint as e:
        raise CheckpointError(f"{path}: {e}") from None
    except (Exception, CheckpointException) as e:
        raise CheckpointError(f"cannot load {path}: {_why(e)} (was it written for another model size?)") from None


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
        errs = [x for x in _gather(err, world) if x]  # every rank takes the same decision
        if not errs:
            if tried:
                more = f" (and {len(tried) - 1} more)" if len(tried) > 1 else ""
                say(f"{tried[0]}{more}; resuming from the newest intact one, {path}")
            return path, extra
        tried.append(errs[0])
    if tried:
        raise CheckpointError(f"no checkpoint under {_ckpt_root(run_dir)} can be used (newest: {tried[0]}): "
                              "restore them or start afresh with --overwrite")
    return None, None


def load_model_weights(path: str, model) -> None:
    """Model weights only, from a verified checkpoint folder (no optimizer), into a plain model."""
    bad = verify_checkpoint(path)
    if bad:
        raise CheckpointError(f"{path} is not a usable checkpoint: {bad}")
    sd = {"model": model.state_dict()}
    w = _quiet_dcp()
    try:
        SafeReader(path).read_metadata()
        dcp.load(sd, storage_reader=SafeReader(path), no_dist=True)
        model.load_state_dict(sd["model"])
    except UnsafeCheckpoint as e:
        raise CheckpointError(f"{path}: {e}") from None
    except (Exception, CheckpointException) as e:
        raise CheckpointError(f"cannot load {path}: {_why(e)} (was it written for another model size?)") from None
    finally:
        w.__exit__(None, None, None)
