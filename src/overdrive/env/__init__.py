"""What this machine is and what it can really run. The only package that probes hardware.

    from overdrive.env import get_env
    env = get_env()            # cached per process
    env.best_precision, env.fp8_backend, env.engine("apex").status

Everyone else asks `get_env()` (or is handed an EnvReport); nobody else imports an optional
engine to see whether it works.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from importlib import resources

from overdrive.env.catalog import GPU_CATALOG, GpuSpec, gpu_by_key, lookup_gpu
from overdrive.env.engines import STATUSES, EngineStatus
from overdrive.env.probing import collect_facts
from overdrive.env.machine import SCHEMA_VERSION, EnvReport, GpuInfo, build_report, gpu_capabilities
from overdrive.io import load_json_bounded

__all__ = [
    "get_env", "set_env", "env_schema", "EnvReport", "EngineStatus", "GpuInfo", "GpuSpec", "GPU_CATALOG",
    "SCHEMA_VERSION", "STATUSES", "build_report", "collect_facts", "gpu_by_key", "lookup_gpu",
    "gpu_capabilities",
]

_lock = threading.Lock()
_cached: EnvReport | None = None


def get_env(*, refresh: bool = False, disk_cache: bool = True,
            on_probe: Callable[[str, str], None] | None = None) -> EnvReport:
    """The environment report for this process (probed once, then cached).

    Probing takes 5-25 s (subprocesses import each engine; torch.compile compiles a function),
    so library callers reuse the facts of a recent probe of the same interpreter and packages
    from disk (a day at most; `overdrive doctor` always probes afresh and refreshes it).
    OVERDRIVE_NO_ENV_CACHE=1 turns the disk cache off. `on_probe(name, state)` hears each probe
    start and end when it really probes (see `collect_facts`).
    """
    global _cached
    with _lock:
        if _cached is None or refresh:
            use_disk = disk_cache and not refresh and not os.environ.get("OVERDRIVE_NO_ENV_CACHE")
            facts = _read_disk_cache() if use_disk else None
            if facts is None:
                facts = collect_facts(on_probe=on_probe) if on_probe else collect_facts()
                _write_disk_cache(facts)
            _cached = build_report(facts)
        return _cached


_CACHE_TTL_S = 24 * 3600


def _cache_path() -> str:
    import hashlib
    import sys
    from importlib import metadata

    import platform

    parts = [platform.node(), sys.executable, SCHEMA_VERSION, os.environ.get("CUDA_VISIBLE_DEVICES", "")]
    for pkg in ("torch", "torchao", "transformer-engine", "transformer_engine", "apex", "liger-kernel", "triton",
                "onnxruntime", "onnxscript", "torchrec", "fbgemm-gpu", "fbgemm-gpu-cpu", "overdrive"):
        try:
            parts.append(f"{pkg}={metadata.version(pkg)}")
        except metadata.PackageNotFoundError:
            parts.append(f"{pkg}=-")
    key = hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(root, "overdrive", f"env-facts-{key}.json")


def _read_disk_cache() -> dict | None:
    import time

    p = _cache_path()
    try:
        if time.time() - os.path.getmtime(p) > _CACHE_TTL_S:
            return None
        return load_json_bounded(p, what="the doctor's cache")
    except (OSError, ValueError):
        return None


def _write_disk_cache(facts: dict) -> None:
    import tempfile

    if any(isinstance(r, dict) and "_timeout" in r for r in (facts.get("probes") or {}).values()):
        # A probe that ran out of time may say more about the host's load than about the machine
        # (a 2-core host at load 20 timed out the SDPA and torchao probes): probe again next time
        # instead of serving "hung" to every library call for a day.
        return
    p = _cache_path()
    try:
        os.makedirs(os.path.dirname(p), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(p), prefix=".tmp-")
        with os.fdopen(fd, "w") as f:
            json.dump(facts, f)
        os.replace(tmp, p)
    except OSError:
        pass  # a read-only home is no reason to fail


def set_env(report: EnvReport | None) -> None:
    """Install a report (e.g. one probed by a parent process, or a fake in tests)."""
    global _cached
    with _lock:
        _cached = report


def env_schema() -> dict:
    """The JSON Schema that `overdrive doctor --json` output validates against."""
    return json.loads(resources.files("overdrive.env").joinpath("schema.json").read_text())
