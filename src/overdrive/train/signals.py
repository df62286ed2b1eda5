"""SIGTERM/SIGINT during training: finish the step, save, stop with a message.

A preempted cluster job gets SIGTERM and a grace period (torchrun forwards it to every rank and waits
30 s before SIGKILL). Killing at once would lose everything since the last checkpoint; instead the
handler only sets a flag, the trainer folds it into the all-reduce it already does for the loss (so
every rank stops at the same step), saves a checkpoint at that step boundary and raises
TrainingInterrupted. A second signal stops at once (the default action), for a user who means it.
"""

from __future__ import annotations

import signal
import threading

__all__ = ["StopRequest"]

_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopRequest:
    """Context manager: while active, SIGTERM/SIGINT set `requested` instead of killing the process
    (only in the main thread, where Python delivers signals; elsewhere it does nothing)."""

    def __init__(self) -> None:
        self.requested = False
        self.seen = False  # set by the trainer: some rank had `requested` at the last all-reduce
        self.signum = 0
        self._old: dict = {}

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum else "a stop request"

    def _handle(self, signum, frame) -> None:
        if self.requested:  # the second one: do what the signal normally does
            self._restore()
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            signal.raise_signal(signum)
            return
        self.requested, self.signum = True, signum

    def _restore(self) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)
        self._old = {}

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            for s in _SIGNALS:
                self._old[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        self._restore()
