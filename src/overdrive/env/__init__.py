"""What this machine is and what it can really run. The only package that probes hardware.

    from overdrive.env import get_env
    env = get_env()            # cached per process
    env.best_precision, env.fp8_backend, env.engine("apex").status

Everyone else asks `get_env()` (or is handed an EnvReport); nobody else imports an optional
engine to see whether it works.
"""

from __future__ import annotations

import json
import threading
from importlib import resources

from overdrive.env.catalog import GPU_CATALOG, GpuSpec, gpu_by_key, lookup_gpu
from overdrive.env.engines import STATUSES, EngineStatus
from overdrive.env.probing import collect_facts
from overdrive.env.report import SCHEMA_VERSION, EnvReport, GpuInfo, build_report, gpu_capabilities

__all__ = [
    "get_env", "set_env", "env_schema", "EnvReport", "EngineStatus", "GpuInfo", "GpuSpec", "GPU_CATALOG",
    "SCHEMA_VERSION", "STATUSES", "build_report", "collect_facts", "gpu_by_key", "lookup_gpu",
    "gpu_capabilities",
]

_lock = threading.Lock()
_cached: EnvReport | None = None


def get_env(*, refresh: bool = False) -> EnvReport:
    """The environment report for this process (probed once, then cached)."""
    global _cached
    with _lock:
        if _cached is None or refresh:
            _cached = build_report(collect_facts())
        return _cached


def set_env(report: EnvReport | None) -> None:
    """Install a report (e.g. one probed by a parent process, or a fake in tests)."""
    global _cached
    with _lock:
        _cached = report


def env_schema() -> dict:
    """The JSON Schema that `overdrive doctor --json` output validates against."""
    return json.loads(resources.files("overdrive.env").joinpath("schema.json").read_text())
