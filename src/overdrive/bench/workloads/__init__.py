"""Bench workloads: one module each, one protocol (`base.Workload`), one registry.

Adding a workload is one file plus one line in `WORKLOADS`; the CLI (`bench --workload`), the
runner's worker processes, the analysis, the results writer and the report read this mapping and
nothing else (none of them names a workload).
"""

from __future__ import annotations

from overdrive.bench.workloads.base import BaseWorkload, Task, Workload
from overdrive.bench.workloads.gpt import GPTWorkload
from overdrive.bench.workloads.inference import InferenceWorkload
from overdrive.bench.workloads.recsys import RecsysWorkload

__all__ = ["WORKLOADS", "Workload", "BaseWorkload", "Task", "get_workload", "workload_for_task", "all_suites", "get_suite",
           "default_suite_name", "workload_of", "suite_title"]

WORKLOADS: dict[str, Workload] = {
    "transformer": GPTWorkload(),
    "recsys": RecsysWorkload(),
    "inference": InferenceWorkload(),
}


def get_workload(name: str) -> Workload:
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload '{name}': workloads are {', '.join(WORKLOADS)}")
    return WORKLOADS[name]


def workload_for_task(task: str) -> Workload:
    """The workload that runs a `Suite.task` ("gpt", "recsys", ...)."""
    for w in WORKLOADS.values():
        if w.task == task:
            return w
    raise ValueError(f"unknown bench task {task!r}: tasks are {', '.join(w.task for w in WORKLOADS.values())}")


def all_suites() -> dict:
    """Every training suite by name (a latency workload's suites are its own kind)."""
    out: dict = {}
    for w in WORKLOADS.values():
        if isinstance(w, Workload):
            out.update(w.suites)
    return out


def get_suite(name: str):
    """A training suite by name, from any workload."""
    suites = all_suites()
    if name not in suites:
        raise ValueError(f"unknown suite '{name}': suites are {', '.join(suites)}")
    return suites[name]


def default_suite_name(has_gpu: bool, quick: bool, workload: str = "transformer") -> str:
    return get_workload(workload).default_suite(has_gpu=has_gpu, quick=quick)


def workload_of(results: dict):
    """The workload that wrote these results (by the suite's task), or None for a task this version
    does not know (a newer writer's): its rows still render, with generic columns."""
    try:
        return workload_for_task((results.get("suite") or {}).get("task", "gpt"))
    except ValueError:
        return None


def suite_title(results: dict) -> str:
    """One line saying what was measured, for tables and reports (written by the workload)."""
    s = results["suite"]
    w = workload_of(results)
    if w is None:
        return f"suite {s.get('name')} (task {s.get('task')!r}: not a workload of this version)"
    return w.title(s)
