"""`acc.save(dir)` / `acc.load(dir)`: torch.distributed.checkpoint (DCP) for an Accelerated model.

Sharded under FSDP2 (each rank writes its shards), reshardable on load: a folder saved on 2 ranks
loads on 1 and the other way round. Atomic: written to DIR.tmp, renamed to DIR by rank 0 only after
every rank has finished, so a crash mid-save leaves the previous DIR intact.
"""

from __future__ import annotations

import os
import shutil
import warnings

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from overdrive.errors import UserError

__all__ = ["save_state", "load_state"]


def _rank_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _barrier(world: int) -> None:
    if world > 1:
        dist.barrier()


def _states(acc) -> dict:
    model_sd, optim_sd = get_state_dict(acc.model, acc.optimizer if acc.optimizer is not None else [])
    return {"model": model_sd, "optim": optim_sd} if acc.optimizer is not None else {"model": model_sd}


def save_state(path: str, acc) -> str:
    rank, world = _rank_world()
    path = os.path.abspath(path.rstrip("/"))
    tmp = path + ".tmp"
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
    _barrier(world)
    with warnings.catch_warnings():  # "assuming the intent is to save in a single process": it is
        warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
        dcp.save(_states(acc), checkpoint_id=tmp, no_dist=world == 1)
    if rank == 0:  # the same on every rank: written once
        torch.save({"scheduler": acc.scheduler.state_dict() if acc.scheduler is not None else None,
                    "scaler": acc.scaler.state_dict() if acc.scaler is not None else None,
                    "steps": acc.steps, "world": world,
                    # the data position of each prepared DataLoader (epoch, samples consumed over all ranks)
                    "dataloaders": [d.state_dict() for d in getattr(acc, "dataloaders", [])]},
                   os.path.join(tmp, "accelerate.pt"))
    _barrier(world)
    if rank == 0:
        old = path + ".old"
        if os.path.exists(path):
            shutil.rmtree(old, ignore_errors=True)
            os.rename(path, old)
        os.rename(tmp, path)
        shutil.rmtree(old, ignore_errors=True)
    _barrier(world)
    return path


def load_state(path: str, acc) -> None:
    rank, world = _rank_world()
    path = os.path.abspath(path.rstrip("/"))
    if not os.path.exists(os.path.join(path, ".metadata")) or not os.path.exists(os.path.join(path, "accelerate.pt")):
        raise UserError(f"{path} is not a complete acc.save() folder (.metadata or accelerate.pt missing): "
                        "pass the folder acc.save() returned")
    state = _states(acc)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
            dcp.load(state, checkpoint_id=path, no_dist=world == 1)
    except Exception as e:
        raise UserError(f"cannot load {path}: {type(e).__name__}: {str(e).splitlines()[0][:200]} (saved from "
                        "another model, or with an optimizer when this run has none?)") from None
    set_state_dict(acc.model, acc.optimizer if acc.optimizer is not None else [],
                   model_state_dict=state["model"], optim_state_dict=state.get("optim", {}))
    extra = torch.load(os.path.join(path, "accelerate.pt"), weights_only=True)
    if acc.scheduler is not None and extra["scheduler"] is not None:
        acc.scheduler.load_state_dict(extra["scheduler"])
    if acc.scaler is not None and extra["scaler"] is not None:
        acc.scaler.load_state_dict(extra["scaler"])
    acc.steps = int(extra["steps"])
    _load_positions(acc, extra.get("dataloaders") or [], path)


def _load_positions(acc, saved: list, path: str) -> None:
    loaders = getattr(acc, "dataloaders", [])
    if saved and len(saved) != len(loaders):
        raise UserError(f"{path} holds the positions of {len(saved)} prepared DataLoader(s), this run prepared "
                        f"{len(loaders)}: prepare the same loaders, in the same order, before acc.load()")
    for d, st in zip(loaders, saved):
        d.load_state_dict(st)
