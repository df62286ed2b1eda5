"""A plain (non-editable) install works: build the wheel, install it into a fresh venv, and run
`overdrive doctor`, a tiny bench and `report` from there, outside the source tree. The fresh venv
borrows this venv's dependencies (torch, numpy, ...) through a path entry placed after its own
site-packages, so the wheel's overdrive is the one imported and nothing is downloaded."""

import os
import shutil
import subprocess
import sys
import sysconfig
import venv

import pytest

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kw)


def test_wheel_installs_complete_and_runs_doctor_bench_and_report(tmp_path):
    # built from a copy of what git would ship: setuptools reuses an in-tree build/lib, stale files included
    tree = tmp_path / "tree"
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "build")
    shutil.copytree(os.path.join(ROOT, "src"), tree / "src", ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(os.path.join(ROOT, name), tree / name)
    wheels = tmp_path / "wheels"
    cp = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels),
               str(tree)])
    assert cp.returncode == 0, cp.stderr[-2000:]
    (whl,) = wheels.glob("overdrive-*.whl")
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    py = env_dir / "bin" / "python"
    site = _run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
    # pip from this venv installs into the fresh one (--target keeps it off this venv), without dependencies
    cp = _run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile", "--target", site, str(whl)])
    assert cp.returncode == 0, cp.stderr[-2000:]
    with open(os.path.join(site, "zz_borrowed_deps.pth"), "w") as f:  # after the wheel's own files
        f.write(sysconfig.get_paths()["purelib"] + "\n")
    env = {**os.environ, "PYTHONPATH": "", "OMP_NUM_THREADS": "1", "XDG_CACHE_HOME": str(tmp_path / "cache")}
    work = tmp_path / "elsewhere"
    work.mkdir()
    od = [str(py), "-m", "overdrive"]
    where = _run([str(py), "-c", "import overdrive; print(overdrive.__file__)"], cwd=work, env=env)
    assert where.stdout.strip().startswith(site), where.stdout + where.stderr  # the wheel, not the source tree
    cp = _run(od + ["doctor"], cwd=work, env=env)
    assert cp.returncode == 0, cp.stdout[-1500:] + cp.stderr[-1500:]
    out = work / "bench"
    cp = _run(od + ["bench", "--quick", "--rounds", "1", "--no-micro", "--configs", "fp32-fused", "--out", str(out)],
              cwd=work, env=env)
    assert cp.returncode == 0, cp.stdout[-1500:] + cp.stderr[-1500:]
    assert (out / "results.json").is_file()
    cp = _run(od + ["report", str(out)], cwd=work, env=env)  # reads results/results.schema.json from the wheel
    assert cp.returncode == 0, cp.stdout[-1500:] + cp.stderr[-1500:]
    assert "Traceback" not in cp.stderr
