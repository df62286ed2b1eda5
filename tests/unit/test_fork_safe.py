"""tune's fork server must not initialise CUDA: a worker forked after `cuInit` fails its first CUDA call
(pytorch#83973), and torchao's float8 import asks `torch.cuda.is_available()`, which runs `cuInit`
through `cudaGetDeviceCount` unless PYTORCH_NVML_BASED_CUDA_CHECK=1. Tested on a faked CUDA build: the
server's imports, in the server's order, may ask NVML but never the CUDA runtime or torch's lazy init."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from overdrive.measure import launch
from overdrive.tuning.measure import PRELOAD

HARNESS = r"""
import importlib, importlib.util, json, os, sys
import torch, torch.cuda as c
calls = []
nvml = lambda: os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK") == "1"
# On a CUDA build, is_available() and device_count() run cudaGetDeviceCount (cuInit) unless NVML answers;
# anything that needs the device runs torch's lazy init (torch/cuda/__init__.py).
c.is_available = lambda: calls.append("is_available -> cudaGetDeviceCount") if not nvml() else False
c.device_count = lambda: calls.append("device_count -> cudaGetDeviceCount") or 0 if not nvml() else 0
c._lazy_init = lambda: calls.append("torch.cuda._lazy_init")
for name in json.loads(sys.argv[1]):
    if importlib.util.find_spec(name.split(".")[0]) is None:
        continue                                   # as the fork server does: a missing module is skipped
    importlib.import_module(name)
print(json.dumps(calls))
"""


def _server_imports(modules: list[str]) -> list[str]:
    out = subprocess.run([sys.executable, "-c", HARNESS, json.dumps(modules)], capture_output=True, text=True,
                         timeout=300, env={**__import__("os").environ, "PYTORCH_NVML_BASED_CUDA_CHECK": ""})
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_fork_servers_imports_never_initialise_cuda():
    pytest.importorskip("torchao.float8")
    # Without the guard, the same imports do reach cuInit: the fake is one that can fail.
    assert _server_imports(list(PRELOAD)), "torchao.float8's import no longer asks the CUDA runtime: update this test"
    # What the server really imports: the guard first, then tune's preload.
    ctx = launch.worker_context(PRELOAD)
    if ctx.get_start_method() != "forkserver":
        pytest.skip("no fork server on this platform")
    import multiprocessing.forkserver as fs

    modules = fs._forkserver._preload_modules
    assert modules[0] == launch.FORK_SAFE
    assert _server_imports(list(modules)) == []


def test_spawn_where_nvml_cannot_count(monkeypatch):
    import torch

    monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: True)
    monkeypatch.setattr(torch.cuda, "_device_count_nvml", lambda: -1)
    assert launch.worker_context(PRELOAD).get_start_method() == "spawn"
    monkeypatch.setattr(torch.cuda, "_device_count_nvml", lambda: 8)
    assert launch.worker_context(PRELOAD).get_start_method() in ("forkserver", "spawn")
    assert launch.fork_server_is_safe()
