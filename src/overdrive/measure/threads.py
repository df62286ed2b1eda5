"""Threads per worker from the cores and the workers active at once, and the host's load, recorded.

Measured on the project's 2-core hosts: torch's default (every core) in each of several workers ran a
step 4-5x slower than one thread, because the workers and the other tenants fight for the cores (an
OpenMP team waits for its slowest thread). So a worker gets the cores left to it: the machine's cores
shared among the workers that step at the same time, less what the host's other load already takes.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["ThreadPlan", "plan_threads", "host_load", "load_report", "usable_cores"]


def usable_cores() -> int:
    """The cores this process may run on (the affinity mask, e.g. a container's cpuset)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def host_load() -> float | None:
    """The host's load: the 1-minute load average, or the processes runnable right now (Linux's
    /proc/loadavg, less this one) when higher: the average lags a minute behind two CPU hogs that
    just started. None where the OS says neither."""
    try:
        avg = float(os.getloadavg()[0])
    except (AttributeError, OSError):
        avg = None
    try:
        with open("/proc/loadavg") as f:
            now = float(f.read().split()[3].split("/")[0]) - 1  # "3/250": 3 runnable, this one included
    except (OSError, ValueError, IndexError):
        now = None
    vals = [v for v in (avg, now) if v is not None]
    return max(vals) if vals else None


def load_report(*, read: Callable[[], float | None] = host_load, cores: int | None = None) -> dict:
    """The host's load (host_load) against the cores, for a results file: busy when more runnable
    work than cores."""
    n = cores or os.cpu_count() or 1
    ld = read()
    if ld is None:  # no /proc/loadavg (some containers): say so rather than guess
        return {"load1": None, "cores": n, "per_core": None, "busy": None, "at": time.time()}
    return {"load1": round(ld, 2), "cores": n, "per_core": round(ld / n, 2), "busy": ld > n, "at": time.time()}


@dataclass(frozen=True)
class ThreadPlan:
    threads: int
    """torch intra-op threads per worker."""
    compile_threads: int
    """TORCHINDUCTOR_COMPILE_THREADS per worker."""
    cores: int
    active: int
    """Workers that step at the same time."""
    load: float | None
    """The host's 1-minute load average when planned (other tenants included)."""
    source: str
    """'auto' (from cores, workers and load) or 'user' (--threads)."""

    def to_dict(self) -> dict:
        return {"threads": self.threads, "compile_threads": self.compile_threads, "cores": self.cores,
                "active_workers": self.active, "load_1min": self.load, "source": self.source}

    def describe(self) -> str:
        load = f", load {self.load:.1f}" if self.load is not None else ""
        how = "set by --threads" if self.source == "user" else f"{self.cores} cores, {self.active} worker(s) at once{load}"
        return f"{self.threads} thread(s) per worker ({how})"


def plan_threads(*, active: int, user: int | None = None, cores: int | None = None,
                 load: float | None = None, own_running: int = 0) -> ThreadPlan:
    """Threads per worker. `active`: workers stepping at once; `own_running`: our processes already
    counted in `load` (the parent, busy while planning), so they are not charged twice."""
    cores = cores or usable_cores()
    load = host_load() if load is None else load
    active = max(1, active)
    if user:
        t = max(1, int(user))
        return ThreadPlan(t, max(1, cores // active), cores, active, load, "user")
    share = max(1, cores // active)
    if load is not None:
        # Cores the other tenants keep busy (load is a run-queue length: a load of 3 on 2 cores
        # leaves none free; we still get one thread, never zero).
        free = cores - max(0.0, load - own_running)
        share = max(1, min(share, int(free + 0.5)))
    return ThreadPlan(share, max(1, cores // active), cores, active, load, "auto")
