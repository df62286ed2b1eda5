"""Where a result came from: the code's git commit, package versions, and a fingerprint of the
environment. Every results writer (bench, inference latency, tune) starts from `header()`, so all
results files share one header and two runs can be told apart or matched."""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import subprocess
from importlib import metadata

__all__ = ["versions", "git_commit", "env_fingerprint", "device_name", "header"]

_PACKAGES = ("overdrive", "torch", "numpy", "torchao", "transformer-engine", "liger-kernel", "triton",
             "transformers", "torchrec", "onnxruntime")


def versions() -> dict:
    out = {}
    for pkg in _PACKAGES:
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = None
    return out


def git_commit() -> str | None:
    """HEAD of the checkout the code runs from (+"-dirty" with uncommitted changes); None outside git."""
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        cp = subprocess.run(["git", "-C", here, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
        if cp.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", here, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return cp.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.TimeoutExpired):
        return None


def env_fingerprint(env) -> str:
    """12 hex digits over what decides results here: device, CPU/GPU model, torch build, engines' status."""
    d = env.to_dict()
    key = {"device": env.device, "gpus": [g.name for g in env.gpus], "cpu": d.get("platform", {}).get("cpu", {}).get("model"),
           "torch": d.get("torch", {}).get("version"),
           "engines": {k: v.get("status") for k, v in sorted(d.get("engines", {}).items())}}
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:12]


def device_name(env) -> str:
    return env.gpus[0].name if env.gpus else f"CPU ({env.platform['cpu'].get('model')})"


def header(schema: str, env) -> dict:
    """The fields every results file starts with."""
    return {"schema": schema, "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "git_commit": git_commit(), "versions": versions(), "env": env.to_dict(),
            "env_fingerprint": env_fingerprint(env), "device": device_name(env)}
