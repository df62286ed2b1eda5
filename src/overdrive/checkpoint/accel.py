"""`acc.save(dir)` / `acc.load(dir)` for an Accelerated model, through folder.py: sharded under FSDP2
(each rank writes its shards), reshardable on load (a folder saved on 2 ranks loads on 1 and the
other way round), atomic, verified (manifest + SHA-256) and read through the allow-list reader.

Exact: each rank's extra file holds the scheduler, the GradScaler's state_dict, the step counters and
that rank's RNG state (torch, CUDA, numpy, Python), so a loaded run draws the same dropout masks the
uninterrupted one would have. `dir` is replaced only if it is an acc.save() folder (our manifest):
`acc.save(".")` refuses instead of deleting the working directory.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from overdrive.checkpoint.folder import CheckpointError, load_folder, recover_folder, save_folder
from overdrive.checkpoint.manifest import is_ours, read_manifest
from overdrive.checkpoint.rng import rng_state, set_rng_state
from overdrive.errors import UserError

__all__ = ["save_state", "load_state"]


def _rank_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _states(acc) -> dict:
    model_sd, optim_sd = get_state_dict(acc.model, acc.optimizer if acc.optimizer is not None else [])
    return {"model": model_sd, "optim": optim_sd} if acc.optimizer is not None else {"model": model_sd}


def _path(path: str) -> str:
    p = os.path.abspath(os.fspath(path).rstrip("/") or "/")
    if p == os.path.abspath(os.sep) or p == os.path.expanduser("~"):
        raise UserError(f"acc.save({path!r}): that is {'/' if p == os.sep else 'your home folder'}, not a checkpoint "
                        "folder: pass a new folder, e.g. acc.save('checkpoints/step_100')")
    return p


def _older_save(path: str) -> bool:
    """A folder an earlier acc.save() wrote (before manifests): only DCP files and accelerate.pt."""
    if os.path.islink(path) or not os.path.isdir(path):
        return False
    names = os.listdir(path)
    return "accelerate.pt" in names and ".metadata" in names and \
        all(n in (".metadata", "accelerate.pt") or n.endswith(".distcp") for n in names)


def save_state(path: str, acc) -> str:
    rank, world = _rank_world()
    path = _path(path)
    if os.path.lexists(path) and not is_ours(path) and not _older_save(path) and \
            not (os.path.isdir(path) and not os.listdir(path)):
        raise UserError(f"acc.save({path}): that path holds files acc.save() did not write (no manifest.json): "
                        "refusing to replace it; pass a new folder or one an earlier acc.save() wrote")
    extra = {"scheduler": acc.scheduler.state_dict() if acc.scheduler is not None else None,
             "scaler": acc.scaler.state_dict() if acc.scaler is not None else None,
             "steps": acc.steps, "micro": acc._micro, "skipped": int(acc._skipped), "world": world,
             "rng": rng_state(),
             # the data position of each prepared DataLoader (epoch, samples consumed over all ranks)
             "dataloaders": [d.state_dict() for d in getattr(acc, "dataloaders", [])]}
    try:
        return save_folder(path, _states(acc), extra, rank=rank, world=world, info={"kind": "accelerate"},
                           also_ours=_older_save)
    except CheckpointError as e:
        raise UserError(str(e)) from None


def load_state(path: str, acc) -> list[str]:
    """Restore what save_state wrote; returns what could not be restored exactly (said by the caller)."""
    rank, world = _rank_world()
    path = os.path.abspath(os.fspath(path).rstrip("/"))
    recover_folder(path, rank=rank, world=world)  # a save killed between its two renames
    m = read_manifest(path) if os.path.isdir(path) else None
    if m is not None and m.get("kind") not in (None, "accelerate"):
        raise UserError(f"{path} is a `{m.get('kind')}` checkpoint, not an acc.save() folder: pass the folder "
                        "acc.save() returned")
    if m is None and os.path.isfile(os.path.join(path, "accelerate.pt")):
        raise UserError(f"{path} was written by an older acc.save() without a manifest (no integrity check "
                        "possible): load it with that version and save it again")
    state = _states(acc)
    try:
        extra = load_folder(path, state, rank=rank, world=world)
        set_state_dict(acc.model, acc.optimizer if acc.optimizer is not None else [],
                       model_state_dict=state["model"], optim_state_dict=state.get("optim", {}))
    except CheckpointError as e:
        raise UserError(str(e) if os.path.isdir(path) else
                        f"{path} is not an acc.save() folder: pass the folder acc.save() returned") from None
    except Exception as e:
        raise UserError(f"cannot load {path}: {type(e).__name__} (saved from another model?)") from None
    if acc.scheduler is not None and extra.get("scheduler") is not None:
        acc.scheduler.load_state_dict(extra["scheduler"])
    if acc.scaler is not None and extra.get("scaler") is not None:
        acc.scaler.load_state_dict(extra["scaler"])
    acc.steps = int(extra["steps"])
    acc._micro = int(extra.get("micro", 0))
    acc._skipped = torch.full((), int(extra.get("skipped", 0)), dtype=torch.int64, device=acc.device)
    _load_positions(acc, extra.get("dataloaders") or [], path)
    notes = []
    if int(extra.get("world", 1)) != world:
        notes.append(f"saved on {extra.get('world')} ranks, loaded on {world}: the RNG continues rank 0's")
    notes += set_rng_state(extra["rng"]) if "rng" in extra else ["no RNG state saved"]
    return notes


def _load_positions(acc, saved: list, path: str) -> None:
    loaders = getattr(acc, "dataloaders", [])
    if saved and len(saved) != len(loaders):
        raise UserError(f"{path} holds the positions of {len(saved)} prepared DataLoader(s), this run prepared "
                        f"{len(loaders)}: prepare the same loaders, in the same order, before acc.load()")
    for d, st in zip(loaders, saved):
        d.load_state_dict(st)
