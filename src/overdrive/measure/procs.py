"""Worker processes that end with their parent.

A worker busy in a step does not read its pipe, so a parent killed by SIGTERM used to leave it running
until the step batch ended (~20 s measured). Two guards: the kernel kills a worker when its parent
dies (Linux PR_SET_PDEATHSIG), and `parent_ends_on_sigterm` turns SIGTERM into SystemExit in the
parent, so its `finally` blocks stop the workers and write nothing half-done.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading

__all__ = ["bound_to_parent", "bind_to_parent", "parent_ends_on_sigterm", "stop_process"]

_PR_SET_PDEATHSIG = 1


def bind_to_parent(parent_pid: int | None = None) -> bool:
    """In a worker: ask the kernel for SIGKILL when the parent dies; exit at once if it already has.
    Returns whether the guard is in place (Linux only; elsewhere the parent's SIGTERM handler is it)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(0)  # the parent died before the guard was set: nobody is waiting for us
    return True


def bound_to_parent(target, parent_pid, *args) -> None:
    """A Process target: bind to the parent, then run `target(*args)` (picklable for spawn).
    `parent_pid`: the pid expected as our parent (spawn), or None when a fork server is the parent
    (it exits when its client does, and the kernel then ends us)."""
    bind_to_parent(parent_pid)
    target(*args)


@contextlib.contextmanager
def parent_ends_on_sigterm():
    """While inside: SIGTERM raises SystemExit(143) in the main thread, so cleanup runs (workers
    stopped, locks released); later SIGTERMs are ignored until the block is left, so cleanup finishes. Outside the main thread this is a no-op (signals go to the main one)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _raise(signum, frame):
        # Once: a second SIGTERM during the cleanup this starts would cut it short (a server's stubs left running).
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise SystemExit(128 + signum)

    old = signal.signal(signal.SIGTERM, _raise)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def stop_process(proc, *, grace_s: float = 0.5) -> None:
    """Join a worker briefly, then kill it: never leave one running."""
    if proc is None:
        return
    try:
        if grace_s <= 0 and proc.is_alive():
            proc.kill()  # no grace: the parent is going away (SIGTERM, an error)
        proc.join(timeout=grace_s)
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=2)
    except (AssertionError, ValueError, OSError):  # not started, or already closed
        pass
