"""The protocol every bench workload follows, and what their worker-side tasks share.

A workload is one file and one line in the registry (`bench.workloads.WORKLOADS`); nothing outside
its file asks for it by name. Every workload (`BaseWorkload`) supplies:
- `suites` (its sizes per device) and `default_suite(has_gpu=, quick=)`;
- `check_data(path)`: read the user's `--data FILE` once in the parent, so a bad file fails in one
  line before any worker starts; returns a summary line (e.g. malformed lines by reason);
- `kind`: the results file it writes ("bench": `overdrive.bench/1`, "latency": `overdrive.latency/1`),
  which also says what drives it (`overdrive.bench.run_bench` for "bench"; its own `run` otherwise);
- `title(suite)`: one line saying what was measured, for tables and pages;
- `apply_hint(cfg)`: how to use a measured configuration, usable as printed.

A training workload (`Workload`, the usual kind) is measured in worker processes by the bench's
rounds; it adds `build(spec)` (in the worker, the `Task` for one configuration), `quality_rows(run, base,
suite)` (the quality fields of each model's row: loss parity for GPT, held-out AUC for a click
model), `role_figures(...)` (figures of its own per model, e.g. FLOPs and MFU) and its columns.
A `Task` does one training step at a time, timed with the one `Clock`, and returns, per role,
`{role}_ms`, `{role}_loss` and `{role}_skipped` (an optimizer step GradScaler skipped).
`quality()` is called once, right after step `parity_steps`, so every configuration is judged at
the same point of training whatever the time budget let the timed rounds run.
"""

from __future__ import annotations

from typing import Any

from overdrive.measure.worker import Task as _CoreTask

__all__ = ["BaseWorkload", "Workload", "Task"]


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


class BaseWorkload:
    name: str = ""
    task: str = ""
    """The `Suite.task` key this workload runs (recorded in the results' suite)."""
    kind: str = "bench"
    """Which results file it writes (`overdrive.results`): "bench" (training rounds, driven by
    `overdrive.bench.run_bench`) or "latency" (measured by the workload's own `run`)."""
    help: str = ""
    data_help: str = ""
    roles: tuple[str, ...] = ()
    configs_apply: bool = True
    """False where `--configs` means nothing (inference measures modes, not recipes)."""
    threads_apply: bool = True
    """False where the workload sets its own threads (the inference bench: from the host's load)."""
    serves_models: bool = False
    """True where `--model/--inputs/--dynamic`, `--server` and `--slo-ms` apply (a request stream)."""

    @property
    def suites(self) -> dict[str, Any]:
        raise NotImplementedError

    def default_suite(self, *, has_gpu: bool, quick: bool) -> str:
        raise NotImplementedError

    def check_data(self, path: str) -> str:
        raise NotImplementedError

    def title(self, suite: dict) -> str:
        """One line saying what was measured, from the results' `suite` record."""
        return f"suite {suite.get('name')}: {self.help or self.name}"

    def apply_hint(self, cfg: dict) -> dict:
        """{"code": ..., "train": ... or None}: a measured configuration, usable as printed."""
        raise NotImplementedError


class Workload(BaseWorkload):
    """A workload trained in worker processes by the bench's interleaved rounds."""

    rate_key: str = "examples_per_s"
    """The per-model rate field: "tokens_per_s" or "examples_per_s" (results.json and the CSV)."""
    quality_header: str = "final loss"
    """The column beside the speedup in tables: what this workload's quality (or efficiency) is."""
    loss_header: str = "loss Δ"
    baseline_words: str = "the baseline"
    """What "keep the baseline" means to a user of this workload, in the next step."""

    @property
    def rate_unit(self) -> str:
        return self.rate_key.replace("_per_s", "/s")

    def build(self, spec: dict) -> Task:
        raise NotImplementedError

    def quality_rows(self, run, base, suite) -> dict[str, dict]:
        """role -> the quality fields of that model's row."""
        raise NotImplementedError

    def items_per_step(self, suite) -> int:
        """What one step processes, in the unit of `rate_key` (examples; GPT: tokens)."""
        return suite.batch

    def role_figures(self, role: str, suite, *, rate: float | None, precision: str, gpu, emulated: bool) -> dict:
        """Figures of this workload's own in a model's row (GPT: parameters, FLOPs, TFLOP/s, MFU)."""
        return {}

    def quality_cell(self, m: dict, cfg: dict) -> str:
        """The text of the `quality_header` column for one model's row."""
        v = m.get("final_loss")
        return "-" if v is None else f"{v:.4f}"

    def apply_hint(self, cfg: dict) -> dict:
        return {"code": f"the configuration {cfg.get('name')} (options {cfg.get('options') or {}})", "train": None}

    def next_step(self, cfg: dict, label: str, hint: dict) -> tuple[str, str | None, str | None, str]:
        """(lead, code, train config, tail) of the report's next step for the winner `cfg`."""
        return f"Next step: apply {label}", hint["code"], hint["train"], ""
