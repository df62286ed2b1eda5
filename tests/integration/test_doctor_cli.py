"""`overdrive doctor` as a user runs it, in a subprocess, on this machine."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch

jsonschema = pytest.importorskip("jsonschema")


def _run(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "overdrive", *args], capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def doctor_json():  # a real probe of this machine: 5-30 s
    cp = _run("doctor", "--json")
    assert cp.returncode == 0, cp.stderr
    return json.loads(cp.stdout)


@pytest.mark.slow
def test_doctor_json_validates_and_tells_the_truth(doctor_json):
    from overdrive.env import env_schema

    d = doctor_json
    jsonschema.validate(d, env_schema())
    assert d["torch"]["version"] == torch.__version__
    assert d["platform"]["cpu"]["count"] == os.cpu_count()
    assert len(d["gpus"]) == (torch.cuda.device_count() if torch.cuda.is_available() else 0)
    has_ao = importlib.util.find_spec("torchao") is not None
    assert (d["engines"]["torchao"]["status"] == "missing") == (not has_ao)
    if not torch.cuda.is_available():
        assert d["fp8"]["backend"] is None
        assert d["engines"]["sdpa_efficient"]["status"] == "unsupported"
        assert d["verdict"][0].startswith("FP8: unavailable")
    # fused AdamW works on CPU with torch >= 2.4, and on any CUDA GPU.
    assert d["engines"]["fused_adamw"]["status"] == "ok"


@pytest.mark.slow
def test_doctor_table_and_verdict_with_progress_on_stderr():
    cp = _run("doctor")
    assert cp.returncode == 0, cp.stderr
    for word in ("Platform", "Engines", "Verdict", "transformer_engine", "apex", "torchao", "torch.compile",
                 "Best precision here:"):
        assert word in cp.stdout
    assert "Traceback" not in cp.stdout + cp.stderr
    # each probe is shown as it runs, on stderr (stdout stays the report)
    for line in ("probing torch.compile (inductor) ...", "torch.compile (inductor): done", "probing GPUs (CUDA init)"):
        assert line in cp.stderr
    assert "probing" not in cp.stdout
    for noise in ("_C_mxfp8", "is deprecated", "Failed to load"):
        assert noise not in cp.stdout + cp.stderr


def test_help_everywhere():
    cp = _run("--help")
    assert cp.returncode == 0 and "doctor" in cp.stdout
    for sub in ("doctor", "bench", "report"):
        cp = _run(sub, "--help")
        assert cp.returncode == 0 and "usage" in cp.stdout


def test_bad_flag_exits_2():
    cp = _run("doctor", "--no-such-flag")
    assert cp.returncode == 2 and "unrecognized arguments" in cp.stderr
