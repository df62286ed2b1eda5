"""The protocol every bench workload follows, and what their worker-side tasks share.

A workload is one small class:
- `suites` (its sizes per device) and `default_suite(has_gpu=, quick=)`;
- `check_data(path)`: read the user's `--data FILE` once in the parent, so a bad file fails in one
  line before any worker starts; returns a summary line (e.g. malformed lines by reason);
- `build(spec)`: in the worker process, the `Task` for one configuration;
- `quality_rows(run, base, suite)`: the quality columns it adds to each model's row of the results
  (loss parity for GPT, held-out AUC/log-loss for a click model).
A `Task` does one training step at a time, timed with the one `Clock`, and returns, per role,
`{role}_ms`, `{role}_loss` and `{role}_skipped` (an optimizer step GradScaler skipped).
`quality()` is called once, right after step `parity_steps`, so every configuration is judged at
the same point of training whatever the time budget let the timed rounds run.
"""

from __future__ import annotations

import resource
from typing import Any

from overdrive.measure.rounds import Clock

__all__ = ["Workload", "Task", "process_memory", "rss_mb"]


def rss_mb() -> float:
    try:
        import psutil

        return psutil.Process().memory_info().rss / 2**20
    except Exception:
        return 0.0


def _peak_rss_mb() -> float:
    """This process image's peak RSS. /proc's VmHWM belongs to the current address space; getrusage's
    ru_maxrss does not: Linux carries the pre-exec high-water mark over exec, so a spawned worker would
    report its parent's RSS at fork (the bench's own ~400 MB, or a long test session's GBs) as its floor."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux, where /proc is missing


def process_memory(cuda: bool, rss0: float) -> dict:
    """This process's peak: CUDA max allocated, or peak RSS above the RSS at set-up."""
    if cuda:
        import torch

        return {"kind": "cuda_max_allocated", "peak_mb": torch.cuda.max_memory_allocated() / 2**20}
    return {"kind": "cpu_peak_rss", "peak_mb": _peak_rss_mb() - rss0, "rss_at_start_mb": rss0,
            "peak_rss_mb": _peak_rss_mb()}


class Task:
    """One configuration inside its worker: set up from `spec`, then `step()` until told to stop."""

    def __init__(self, spec: dict) -> None:
        import torch

        from overdrive.env import build_report, set_env

        if spec.get("threads"):
            torch.set_num_threads(spec["threads"])
        env = build_report(spec["env_facts"])
        set_env(env)
        self.env = env
        self.device = env.device
        self.cuda = self.device == "cuda"
        self.clock = Clock(self.cuda)
        self.rss0 = rss_mb()
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
        self.inject: dict = dict(spec.get("inject") or {})
        """Test-only faults and settings, passed in by tests (never read from the environment)."""
        self.step_i = 0

    def step(self) -> dict:
        raise NotImplementedError

    def quality(self) -> dict | None:
        """Held-out metrics at the fixed parity step (None: the loss curve is the quality)."""
        return None

    def memory(self) -> dict:
        return process_memory(self.cuda, self.rss0)


class Workload:
    name: str = ""
    task: str = ""
    """The `Suite.task` key this workload runs."""
    help: str = ""
    data_help: str = ""
    roles: tuple[str, ...] = ()
    configs_apply: bool = True
    """False where `--configs` means nothing (inference measures modes, not recipes)."""

    @property
    def suites(self) -> dict[str, Any]:
        raise NotImplementedError

    def default_suite(self, *, has_gpu: bool, quick: bool) -> str:
        raise NotImplementedError

    def check_data(self, path: str) -> str:
        raise NotImplementedError

    def build(self, spec: dict) -> Task:
        raise NotImplementedError

    def quality_rows(self, run, base, suite) -> dict[str, dict]:
        """role -> the quality fields of that model's row."""
        raise NotImplementedError
