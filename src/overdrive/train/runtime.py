"""Process-group life: a timeout from the config, a heartbeat that names the rank that stopped
answering, and ranks that die with their launcher.

gloo's default timeout is 30 minutes: a stuck rank would hold the job that long. The timeout comes
from `train.dist_timeout_s`. When a collective times out, the rank that noticed reads every rank's
last heartbeat (step and time, kept in the launcher's TCPStore) and names the rank that is behind.
Under torchrun a daemon thread watches the parent: when the launcher is SIGKILLed its workers are
re-parented, notice it within a second and exit, instead of training on as orphans.
"""

from __future__ import annotations

import datetime as _dt
import os
import sys
import threading
import time

import torch
import torch.distributed as dist

__all__ = ["dist_setup", "RankTimeout", "Heartbeat", "is_timeout", "watch_launcher"]


class RankTimeout(RuntimeError):
    """A collective timed out; the message names the rank that stopped answering."""


def dist_setup(*, force: bool = False, timeout_s: float = 600.0) -> tuple[int, int, str]:
    """(rank, world, device); joins the process group under torchrun."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if force and "MASTER_ADDR" not in os.environ:
        raise ValueError("train.fsdp = \"on\" needs torchrun (it sets MASTER_ADDR): torchrun --nproc_per_node=1 "
                         "-m overdrive train CONFIG")
    if (world > 1 or force) and not dist.is_initialized():
        dist.init_process_group("nccl" if device == "cuda" else "gloo", timeout=_dt.timedelta(seconds=timeout_s))
        if device == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        watch_launcher()
    return rank, world, device


def is_timeout(e: BaseException) -> bool:
    """A collective that gave up on a peer (gloo: "Timed out waiting", or the peer's socket closed)."""
    msg = str(e).lower()
    return any(s in msg for s in ("timed out", "timeout", "connection closed by peer", "connection reset"))


class Heartbeat:
    """Each rank records its step in the process group's store; on a timeout, who is behind?"""

    def __init__(self, rank: int, world: int) -> None:
        self.rank, self.world = rank, world
        self.store = None
        if world > 1:
            try:
                self.store = dist.distributed_c10d._get_default_store()
            except (RuntimeError, AttributeError, ValueError):  # no store, no names: the timeout still holds
                self.store = None

    def beat(self, step: int) -> None:
        if self.store is not None:
            self.store.set(f"overdrive/heartbeat/{self.rank}", f"{step} {time.time():.3f}")

    def _get(self, key: str) -> str | None:
        try:
            return self.store.get(key).decode() if self.store.check([key]) else None
        except Exception:  # the store lives with the launcher; it may be gone too
            return None

    def blame(self, step: int, timeout_s: float) -> str:
        """One line naming the rank(s) that stopped answering.

        Every healthy rank hits the same timeout in the same collective within moments and says so in
        the store; a rank that has not said so within a few seconds is the one that stopped."""
        if self.store is None:
            return (f"rank {self.rank}: no answer from the other ranks within train.dist_timeout_s={timeout_s:g} s "
                    f"at step {step}")
        try:
            self.store.set(f"overdrive/timed_out/{self.rank}", str(step))
        except Exception:
            pass
        deadline = time.time() + min(5.0, timeout_s)
        silent = []
        while time.time() < deadline:
            silent = [r for r in range(self.world) if self._get(f"overdrive/timed_out/{r}") is None]
            if not silent:
                break
            time.sleep(0.2)
        if not silent:
            return f"rank {self.rank}: a collective timed out after {timeout_s:g} s at step {step} on every rank"

        def last(r: int) -> str:
            hb = self._get(f"overdrive/heartbeat/{r}")
            if hb is None:
                return "never reported a step"
            s, t = hb.split()
            return f"last reached step {s}, {time.time() - float(t):.0f} s ago"

        who = "; ".join(f"rank {r} ({last(r)})" for r in silent)
        return (f"{who} stopped answering: rank {self.rank} gave up after train.dist_timeout_s={timeout_s:g} s "
                f"at step {step}")


_watching = False


def watch_launcher(poll_s: float = 0.5) -> None:
    """Under torchrun, exit when the launcher (our parent) dies: its workers must not train on."""
    global _watching
    if _watching or "TORCHELASTIC_RUN_ID" not in os.environ and "LOCAL_RANK" not in os.environ:
        return
    parent = os.getppid()
    _watching = True

    def _watch() -> None:
        while True:
            time.sleep(poll_s)
            if os.getppid() != parent:  # re-parented: the launcher is gone
                print(f"overdrive: rank {os.environ.get('RANK', '?')}: the launcher (pid {parent}) is gone; "
                      "stopping", file=sys.stderr, flush=True)
                os._exit(1)

    threading.Thread(target=_watch, name="overdrive-launcher-watch", daemon=True).start()
