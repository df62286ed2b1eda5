"""The one launcher: starts a policy's workers (`measure.worker`), and is the parent's end of the
protocol, with a timeout on every answer.

How a worker starts is the policy's choice, made here:
- spawn: a fresh interpreter per candidate, no shared allocator or caches (bench);
- forkserver with `preload`: forked from a server that has only imported torch and Overdrive (no
  tensor op, no thread pool, no compile cache yet), so each candidate starts as clean as a fresh
  interpreter without paying torch's import (11 s measured on a loaded 2-core host) once per
  candidate (tune). Spawn where the platform has no fork server.
Every worker dies with its parent (`measure.procs`: PR_SET_PDEATHSIG), gets the compile threads of
the parent's `ThreadPlan` (its torch threads travel in the spec), and is started without re-running
the caller's script unless a function it needs lives there (`main_not_rerun`).
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from overdrive.measure.procs import bound_to_parent, stop_process
from overdrive.measure.threads import ThreadPlan
from overdrive.measure.worker import LocalConn, Program, worker_main

__all__ = ["Launcher", "Worker", "Failure", "call_all", "main_not_rerun", "worker_context"]


FORK_SAFE = "overdrive.measure.fork_safe"
"""Imported first in the fork server: its imports must not initialise CUDA (see that module)."""


def fork_server_is_safe() -> bool:
    """True where a fork server's imports cannot initialise the CUDA driver: a torch built without
    CUDA, or one whose NVML counts the devices (then `is_available()` never calls `cuInit` under
    `fork_safe`). Asked without initialising CUDA here either."""
    import torch

    if not torch.backends.cuda.is_built() or torch.version.hip:
        return True
    try:
        return torch.cuda._device_count_nvml() >= 0  # -1: NVML could not count (no NVML, a bad mask)
    except Exception:  # noqa: BLE001 — a private helper that moved: spawn, the safe choice
        return False


def worker_context(preload: Sequence[str] | None = None):
    """forkserver with `preload` imported in the server (after `fork_safe`) where the platform has one,
    preload is given and the server's imports cannot initialise CUDA; spawn otherwise. A preloaded
    module that is not installed (torchao) is skipped."""
    if not preload or "forkserver" not in mp.get_all_start_methods() or not fork_server_is_safe():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload([FORK_SAFE] + [m for m in preload if m != FORK_SAFE])
    return ctx


@contextlib.contextmanager
def main_not_rerun(fns: Iterable[Callable | None] = ()):
    """A new process re-runs the caller's script to rebuild `__main__` (multiprocessing's rule), so a
    script calling tune() without an `if __name__ == "__main__":` guard would start tune again in
    every worker. The workers need `__main__` only when a function they are sent lives there;
    otherwise the script's path is hidden while the worker starts, as for an interactive session."""
    main = sys.modules.get("__main__")
    if main is None or any(getattr(f, "__module__", None) == "__main__" for f in fns) \
            or "__file__" not in vars(main):
        yield
        return
    path = main.__dict__.pop("__file__")
    try:
        yield
    finally:
        main.__file__ = path


@dataclass(frozen=True)
class Failure:
    """Why a call got no answer: the worker's own report, or what the parent saw."""

    kind: str
    """user | oom | backend (the worker's report) | crashed (it died) | timeout (no answer in time)"""
    reason: str
    exitcode: int | None = None
    """A crashed worker's exit code (None while it could not be read)."""


class Worker:
    """The parent's end of one worker: send a command, wait for its reply, stop it."""

    def __init__(self, conn, proc=None, *, grace_s: float = 2.0) -> None:
        self.conn, self.proc, self.grace_s = conn, proc, grace_s
        self.failure: Failure | None = None
        """What ended it, when a send already found it dead."""

    def _died(self) -> Failure:
        self.stop()  # reaped first: a process that just died has no exit code until joined
        code = self.proc.exitcode if self.proc is not None else None
        self.failure = Failure("crashed", f"worker process died (exit code {code})", code)
        return self.failure

    def send(self, msg: tuple) -> Failure | None:
        if self.conn is None:
            return self.failure or Failure("crashed", "worker already stopped")
        try:
            self.conn.send(msg)
        except (BrokenPipeError, ConnectionResetError, OSError):
            return self._died()
        return None

    def receive(self, timeout: float) -> dict | Failure:
        """The reply within `timeout` s; on a failure the worker is stopped."""
        if self.conn is None:
            return self.failure or Failure("crashed", "worker already stopped")
        try:
            if not self.conn.poll(max(0.05, timeout)):
                self.stop()
                return Failure("timeout", f"no answer within {timeout:.0f} s (hung)")
            reply = self.conn.recv()
        except (EOFError, BrokenPipeError, ConnectionResetError, OSError):
            return self._died()
        if "error" in reply:
            self.stop()
            return Failure(reply.get("kind", "backend"), reply["error"])
        return reply

    def call(self, msg: tuple, timeout: float) -> dict | Failure:
        return self.send(msg) or self.receive(timeout)

    def stop(self, grace_s: float | None = None) -> None:
        """Join briefly, then kill: never leave one running."""
        stop_process(self.proc, grace_s=self.grace_s if grace_s is None else grace_s)
        self.conn = None


def call_all(workers: list[Worker], msgs: list[tuple], timeout: float) -> list[dict | Failure]:
    """`call` on several workers at once: every command sent first, then the replies collected."""
    sent = [w.send(m) for w, m in zip(workers, msgs)]
    return [f if f is not None else w.receive(timeout) for w, f in zip(workers, sent)]


class Launcher:
    """Starts a policy's workers. `isolate=False` serves the protocol in this process (tests)."""

    def __init__(self, program: Program, *, plan: ThreadPlan, preload: Sequence[str] | None = None,
                 isolate: bool = True, travels: Iterable[Callable | None] = (), grace_s: float = 2.0) -> None:
        self.program, self.plan, self.isolate, self.grace_s = program, plan, isolate, grace_s
        self.travels = tuple(travels)
        """The user's functions sent to the workers (they need `__main__` when one lives there)."""
        self.ctx = worker_context(preload) if isolate else None

    def start(self, first: tuple | None = None) -> Worker:
        """A new worker, sent `first` (its setup, or a one-shot command) at once."""
        if not self.isolate:
            w = Worker(LocalConn(self.program), grace_s=self.grace_s)
        else:
            parent, child = self.ctx.Pipe()
            # Forked by the fork server, a worker's parent is the server (which exits with us): no pid check.
            ppid = os.getpid() if self.ctx.get_start_method() == "spawn" else None
            proc = self.ctx.Process(target=bound_to_parent, args=(worker_main, ppid, child, self.program,
                                                                  self.plan.compile_threads), daemon=True)
            with main_not_rerun(self.travels):
                proc.start()
            child.close()  # only the worker holds its end: if it dies, recv() sees EOF at once
            w = Worker(parent, proc, grace_s=self.grace_s)
        if first is not None:
            w.send(first)
        return w
