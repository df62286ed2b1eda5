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

from typing import Any

from overdrive.measure.worker import Task as _CoreTask

__all__ = ["Workload", "Task"]


class Task(_CoreTask):
    """One configuration inside its worker: set up from `spec` (threads, env, clock and memory baseline
    by the measurement core's `Task`), then `step()` until told to stop."""

    def __init__(self, spec: dict) -> None:
        super().__init__(spec)
        self.inject: dict = dict(spec.get("inject") or {})
        """Test-only faults and settings, passed in by tests (never read from the environment)."""
        self.step_i = 0

    def step(self) -> dict:
        raise NotImplementedError

    def quality(self) -> dict | None:
        """Held-out metrics at the fixed parity step (None: the loss curve is the quality)."""
        return None


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
