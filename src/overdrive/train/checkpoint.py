"""Sharded, crash-safe checkpoints with torch.distributed.checkpoint (DCP).

Layout: RUN/checkpoints/step_0000100/ (DCP shards + .metadata + one extra_rankN.pt per rank with
the step, scheduler, RNG and data position), and RUN/checkpoints/latest naming the newest.
A save writes into step_N.tmp/ and is renamed into place by rank 0 only after every rank has
finished: a crash (even SIGKILL) mid-save leaves a .tmp folder that is ignored, and the previous
checkpoint stays loadable. The last `keep_last` are kept.
"""

from __future__ import annotations

import os
import shutil
import time
import warnings

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from overdrive.io import write_atomic

__all__ = ["save_checkpoint", "load_checkpoint", "latest_checkpoint", "CheckpointError", "load_model_weights"]


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used; the message says which and what to do."""


def _barrier(world: int) -> None:
    if world > 1:
        dist.barrier()


def _ckpt_root(run_dir: str) -> str:
    return os.path.join(run_dir, "checkpoints")


def save_checkpoint(run_dir: str, step: int, model, optimizer, extra: dict, *, rank: int, world: int,
                    keep_last: int) -> str:
    root = _ckpt_root(run_dir)
    final = os.path.join(root, f"step_{step:07d}")
    tmp = final + ".tmp"
    if rank == 0:
        os.makedirs(root, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
    _barrier(world)
    model_sd, optim_sd = get_state_dict(model, optimizer)
    with warnings.catch_warnings():  # "assuming the intent is to save in a single process": it is
        warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=tmp, no_dist=world == 1)
    torch.save(extra, os.path.join(tmp, f"extra_rank{rank}.pt"))
    if os.environ.get("OVERDRIVE_TEST_SAVE_SLEEP"):  # tests: a window in which to SIGKILL a save
        time.sleep(float(os.environ["OVERDRIVE_TEST_SAVE_SLEEP"]))
    _barrier(world)
    if rank == 0:
        if os.path.exists(final):
            shutil.rmtree(final)
        os.rename(tmp, final)
        write_atomic(os.path.join(root, "latest"), os.path.basename(final) + "\n")
        done = sorted(d for d in os.listdir(root) if d.startswith("step_") and not d.endswith(".tmp"))
        for old in done[:-keep_last]:
            shutil.rmtree(os.path.join(root, old), ignore_errors=True)
    _barrier(world)
    return final


def _complete(path: str) -> bool:
    return os.path.isdir(path) and os.path.exists(os.path.join(path, ".metadata")) and \
        os.path.exists(os.path.join(path, "extra_rank0.pt"))


def latest_checkpoint(run_dir: str) -> str | None:
    """The newest complete checkpoint of a run (the `latest` pointer, else a scan); None if none."""
    root = _ckpt_root(run_dir)
    if not os.path.isdir(root):
        return None
    try:
        with open(os.path.join(root, "latest")) as f:
            p = os.path.join(root, f.read().strip())
        if _complete(p):
            return p
    except OSError:
        pass
    done = sorted(d for d in os.listdir(root) if d.startswith("step_") and not d.endswith(".tmp"))
    for d in reversed(done):
        if _complete(os.path.join(root, d)):
            return os.path.join(root, d)
    return None


def load_checkpoint(path: str, model, optimizer, *, rank: int, world: int) -> dict:
    """Restore model and optimizer (resharding to this world size); returns this rank's extra state."""
    if not _complete(path):
        raise CheckpointError(f"{path} is not a complete checkpoint (.metadata or extra_rank0.pt missing): "
                              "delete it or resume from an earlier one")
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd}
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
            dcp.load(state, checkpoint_id=path, no_dist=world == 1)
    except Exception as e:
        raise CheckpointError(f"cannot load {path}: {type(e).__name__}: {str(e).splitlines()[0][:200]} "
                              "(was it written for another model size?)") from None
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    mine = os.path.join(path, f"extra_rank{rank}.pt")
    if not os.path.exists(mine):  # resuming on more ranks than saved: rank 0's step and schedule
        mine = os.path.join(path, "extra_rank0.pt")
    return torch.load(mine, weights_only=True)


def load_model_weights(path: str, model) -> None:
    """Model weights only, from a checkpoint folder (no optimizer), into a plain model."""
    if not _complete(path):
        raise CheckpointError(f"{path} is not a complete checkpoint")
    sd = {"model": model.state_dict()}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
        dcp.load(sd, checkpoint_id=path, no_dist=True)
    model.load_state_dict(sd["model"])
