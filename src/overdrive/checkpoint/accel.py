"""`acc.save(dir)` / `acc.load(dir)` for an Accelerated model, through folder.py: sharded under FSDP2
(each rank writes its shards), reshardable on load (a folder saved on 2 ranks loads on 1 and the
other way round), atomic, verified (manifest + SHA-256) and read through the allow-list reader.

Exact: each rank's extra file holds the scheduler, the GradScaler's state_dict, the step counters and
that rank's RNG state (torch, CUDA, numpy, Python), so a loaded run draws the same dropout masks the
uninterrupted one would have. `dir` is replaced only if it is an acc.save() folder (our manifest):
`acc.save(".")` refuses instead of deleting the working directory.
"""

from __future__ import annotations

import logging
import os

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from overdrive.checkpoint.folder import CheckpointError, _one_error, load_folder, recover_folder, save_folder
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
    p = os.path.abspath(os.path.expanduser(os.fspath(path)).rstrip("/") or "/")  # "~": the home folder, refused
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


def _save_lock(path: str, rank: int, world: int):
    """Rank 0 holds an flock on PARENT/.NAME.lock (beside the folder, which a save renames away) for the
    whole save: a second process saving to the same folder is refused in one line instead of the two
    saves interleaving into a checkpoint that verifies but mixes both. The same lock as `train`'s."""
    from overdrive.train.rundir import RunDirError, RunLock

    lock, err = None, None
    if rank == 0:
        parent, name = os.path.split(path)
        try:
            lock = RunLock(parent, name=f".{name}.lock", what=f"acc.save({path})", transient=True,
                           holder="another process saving there",
                           fix="save each process to its own folder, or wait for that save").acquire(
                lambda m: logging.getLogger("overdrive").warning("acc.save: %s", m))
        except RunDirError as e:
            err = str(e)
        except OSError as e:
            err = f"acc.save({path}): cannot lock it ({e.strerror}): pass a folder you can write to"
    err = _one_error(err, world)
    if err:
        if lock is not None:
            lock.release()
        raise UserError(err)
    return lock


def save_state(path: str, acc) -> str:
    rank, world = _rank_world()
    path = _path(path)
    lock = _save_lock(path, rank, world)
    try:
        return _save_state(path, acc, rank, world)
    finally:
        if lock is not None:
            lock.release()


def _save_state(path: str, acc, rank: int, world: int) -> str:
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
    if not os.fspath(path).strip():  # abspath("") is the working directory: never load that by accident
        raise UserError("acc.load(''): pass the folder acc.save() returned")
    path = os.path.abspath(os.path.expanduser(os.fspath(path))).rstrip("/") or "/"
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
        # every field read back is checked before anything (the model's own tensors included) is changed
        extra = load_folder(path, state, rank=rank, world=world, check_extra=lambda x: _check_extra(x, path, rank, acc),
                            exact="model")
        set_state_dict(acc.model, acc.optimizer if acc.optimizer is not None else [],
                       model_state_dict=state["model"], optim_state_dict=state.get("optim", {}))
    except CheckpointError as e:
        raise UserError(str(e) if os.path.isdir(path) else
                        f"{path} is not an acc.save() folder: pass the folder acc.save() returned") from None
    except UserError:
        raise
    except Exception as e:
        raise UserError(f"cannot load {path}: {type(e).__name__} (saved from another model?)") from None
    notes = []
    try:
        if acc.scheduler is not None and extra.get("scheduler") is not None:
            acc.scheduler.load_state_dict(extra["scheduler"])
        if acc.scaler is not None and extra.get("scaler") is not None:
            acc.scaler.load_state_dict(extra["scaler"])
    except Exception as e:  # noqa: BLE001 — a resealed extra file whose states are the wrong shape
        raise UserError(f"cannot load {path}: its scheduler/GradScaler state does not fit ({type(e).__name__}): "
                        "load it with the scheduler and precision it was saved with") from None
    if acc.scaler is not None and extra.get("scaler") is None:
        notes.append("saved without a GradScaler (not fp16): this run's loss scale starts fresh")
    elif acc.scaler is None and extra.get("scaler") is not None:
        notes.append("saved with a GradScaler (fp16): this run has none, its loss scale is dropped")
    acc.steps = int(extra["steps"])
    acc._micro = int(extra.get("micro", 0))
    acc._skipped = torch.full((), int(extra.get("skipped", 0)), dtype=torch.int64, device=acc.device)
    _load_positions(acc, extra.get("dataloaders") or [], path)
    if int(extra.get("world", 1)) != world:
        notes.append(f"saved on {extra.get('world')} ranks, loaded on {world}: the RNG continues rank 0's")
    notes += set_rng_state(extra["rng"]) if "rng" in extra else ["no RNG state saved"]
    return notes


def _check_extra(extra: dict, path: str, rank: int, acc=None) -> None:
    """The counters and states of extra_rank*.pt are untrusted (a file can be resealed with its manifest):
    each of the right type and range, or one line naming the field."""
    def count(v, lo):
        return isinstance(v, int) and not isinstance(v, bool) and lo <= v < 2 ** 62

    bad = [f"steps {extra.get('steps')!r}" for _ in [0] if not count(extra.get("steps"), 0)]
    bad += [f"{k} {extra.get(k)!r}" for k, lo in (("micro", 0), ("skipped", 0), ("world", 1))
            if k in extra and not count(extra[k], lo)]
    bad += [f"{k} ({type(extra[k]).__name__})" for k in ("scheduler", "scaler", "rng")
            if extra.get(k) is not None and not isinstance(extra[k], dict)]
    dl = extra.get("dataloaders")
    if dl is not None and not (isinstance(dl, list) and all(isinstance(d, dict) for d in dl)):
        bad.append(f"dataloaders ({type(dl).__name__})")
    if isinstance(extra.get("rng"), dict) and not _rng_fits(extra["rng"]):
        bad.append("an RNG state that does not restore")
    if bad:
        raise CheckpointError(f"cannot load {path}: extra_rank{rank}.pt holds {', '.join(bad)}, not what acc.save() "
                              "writes "
                        "(a count >= 0, a state dict): the file was edited; load another checkpoint")


    if acc is not None:  # before the model changes, not after
        try:
            _load_positions(acc, dl or [], path, check_only=True)
        except UserError as e:
            raise CheckpointError(str(e)) from None


def _rng_fits(state: dict) -> bool:
    """Whether set_rng_state takes `state`: tried, then this process's generators put back as they were."""
    now = rng_state()
    try:
        set_rng_state(state)
        return True
    except Exception:  # noqa: BLE001 — any way a resealed state can be wrong (a key, a type, a length)
        return False
    finally:
        set_rng_state(now)


def _load_positions(acc, saved: list, path: str, *, check_only: bool = False) -> None:
    loaders = getattr(acc, "dataloaders", [])
    if saved and len(saved) != len(loaders):
        raise UserError(f"{path} holds the positions of {len(saved)} prepared DataLoader(s), this run prepared "
                        f"{len(loaders)}: prepare the same loaders, in the same order, before acc.load()")
    if check_only:
        return
    for d, st in zip(loaders, saved):
        d.load_state_dict(st)
