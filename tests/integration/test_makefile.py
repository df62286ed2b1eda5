"""`make demo TORCH=system` on an offline GPU machine keeps the torch it has: run make for real into a
temporary venv, with a fake offline pip (records its calls, fails like pip does without a network) and
a fake "system" torch (a CUDA build's version strings) on the interpreter's path."""

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BASE_PYTHON = shutil.which("python3", path=os.path.join(sys.base_prefix, "bin")) or sys.executable

pytestmark = [pytest.mark.slow, pytest.mark.skipif(shutil.which("make") is None, reason="needs make")]

FAKE_PIP = """#!/bin/sh
echo "$@" >> "{log}"
exit 1   # offline: every download, isolated build or dependency resolution fails
"""


def _system_site(tmp_path: pathlib.Path, with_torch: bool) -> pathlib.Path:
    site = tmp_path / "system-site"
    for dep in ("numpy", "rich", "matplotlib", "psutil") + (("torch",) if with_torch else ()):
        (site / dep).mkdir(parents=True)
        (site / dep / "__init__.py").write_text("")
    if with_torch:
        (site / "torch" / "__init__.py").write_text("__version__ = '2.11.0+cu130'\nclass version:\n    cuda = '13.0'\n")
    return site


def _make(tmp_path, site, *args):
    log = tmp_path / "pip.log"
    pip = tmp_path / "pip"
    pip.write_text(FAKE_PIP.format(log=log))
    pip.chmod(0o755)
    env = dict(os.environ, PYTHONPATH=str(site))
    env.pop("VIRTUAL_ENV", None)
    cp = subprocess.run(["make", "-C", str(ROOT), f"VENV={tmp_path / 'venv'}", f"PYTHON={BASE_PYTHON}",
                         f"PIP={pip}", *args], capture_output=True, text=True, timeout=300, env=env)
    return cp, (log.read_text().splitlines() if log.exists() else [])


def test_torch_system_keeps_the_system_torch_offline(tmp_path):
    site = _system_site(tmp_path, with_torch=True)
    cp, pip_calls = _make(tmp_path, site, "TORCH=system", "run", "ARGS=--version")
    out = cp.stdout + cp.stderr
    assert cp.returncode == 0, out
    assert "include-system-site-packages = true" in (tmp_path / "venv" / "pyvenv.cfg").read_text()
    assert "keeping the system torch 2.11.0+cu130 (CUDA 13.0)" in out
    assert "pip not upgraded (offline?)" in out  # the failed upgrade did not stop the build
    assert "overdrive 0.1.0" in cp.stdout  # linked src/ when pip could not build
    assert any("--no-build-isolation -e ." in c for c in pip_calls), pip_calls
    assert not any("torch" in c for c in pip_calls), f"pip was asked for a torch: {pip_calls}"
    assert not any(c.startswith("install") and " -e " in f" {c} " and "--no-build-isolation" not in c
                   for c in pip_calls), pip_calls
    # the console script works too, and a second run reinstalls nothing
    assert subprocess.run([str(tmp_path / "venv" / "bin" / "overdrive"), "--version"], capture_output=True,
                          text=True, env=dict(os.environ, PYTHONPATH=str(site))).stdout.strip() == "overdrive 0.1.0"
    cp2, calls2 = _make(tmp_path, site, "TORCH=system", "run", "ARGS=--version")
    assert cp2.returncode == 0 and calls2 == pip_calls
    # the default (pinned) mode refuses a venv made to see the system's packages
    cp3, _ = _make(tmp_path, site, "run", "ARGS=--version")
    assert cp3.returncode != 0 and "run 'make clean' first" in cp3.stdout + cp3.stderr


def test_torch_system_without_a_torch_says_so(tmp_path):
    cp, pip_calls = _make(tmp_path, _system_site(tmp_path, with_torch=False), "TORCH=system", "doctor")
    assert cp.returncode != 0
    assert "TORCH=system, but" in cp.stdout + cp.stderr and "has no torch" in cp.stdout + cp.stderr
    assert not any("torch" in c for c in pip_calls)


def test_demo_runs_the_bench_and_the_readme_targets_exist():
    cp = subprocess.run(["make", "-n", "-C", str(ROOT), "demo", "quick", "doctor", "test-fast", "VENV=/nonexistent/v"],
                        capture_output=True, text=True, timeout=60)
    assert cp.returncode == 0, cp.stderr
    assert "-m overdrive bench --out out/bench" in cp.stdout and "bench --quick" in cp.stdout
    assert '-m pytest -q tests -m "not slow"' in cp.stdout
