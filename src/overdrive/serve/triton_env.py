"""The environment a real Triton Inference Server runs in here, made and cached by the project.

The `nvidia-pytriton` wheel ships `tritonserver` (2.51 in 0.7.0) with its python backend and one
python-backend stub per Python version; it has no onnxruntime backend (that is in Triton's container),
so the exported ONNX model is served by the python backend running ONNX Runtime. Two things a user
should never meet are settled here once:
- the stub imports numpy and onnxruntime from the environment it runs in, and needs numpy < 2 (with
  numpy 2 a returned output fails "output tensor shape does not match size of output"); the project's
  own environment keeps numpy 2, so the server gets a virtual environment of its own, named by
  Triton's EXECUTION_ENV_PATH (python_backend: stub_launcher.cc sources <env>/bin/activate, then runs
  the stub with <env>/lib first on LD_LIBRARY_PATH; pb_env.cc takes a folder as it is);
- the stub does not see PYTHONPATH, and the backend looks for it beside libtriton_python.so: the stub
  for this Python is copied there, and this Python's libpython is linked into <env>/lib.
nvidia-pytriton pins numpy < 2, so it is installed into that environment, not the project's (the
`triton` extra brings tritonclient only). The environment is made once per (Python, versions), under
a lock, and marked complete last: a half-made one is made again.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass

__all__ = ["TritonEnvError", "TritonEnv", "unavailable_reason", "ensure_env", "ready_env", "env_dir", "PYTRITON"]

PYTRITON = "nvidia-pytriton==0.7.0"
"""The wheel the server binary comes from (tritonserver 2.51, python backend, stubs for Python 3.8-3.13)."""
_MIN_GLIBC = (2, 35)  # the wheel is manylinux_2_35_x86_64


class TritonEnvError(RuntimeError):
    """The server's environment cannot be had here; the message says why and what to do, in one line."""


@dataclass(frozen=True)
class TritonEnv:
    root: str
    """The virtual environment (EXECUTION_ENV_PATH of the python-backend models)."""
    server: str
    """The tritonserver binary."""
    backends: str
    """--backend-directory (python/ with libtriton_python.so and the stub for this Python)."""


def unavailable_reason() -> str | None:
    """Why the wheel's tritonserver cannot run on this machine, or None when it can."""
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"):
        return (f"the nvidia-pytriton wheel's tritonserver is for x86-64 Linux, this is {sys.platform} "
                f"{platform.machine()}: use Triton's container (docs/serving.md)")
    lib, ver = platform.libc_ver()
    try:
        have = tuple(int(x) for x in ver.split(".")[:2])
    except ValueError:
        have = (0, 0)
    if lib != "glibc" or have < _MIN_GLIBC:
        return (f"the nvidia-pytriton wheel needs glibc >= {'.'.join(map(str, _MIN_GLIBC))}, this has {lib} {ver}: "
                "use Triton's container")
    if not (3, 8) <= sys.version_info[:2] <= (3, 13):
        return f"the wheel's python-backend stubs are for Python 3.8-3.13, this is {platform.python_version()}"
    if not sysconfig.get_config_var("Py_ENABLE_SHARED"):
        return ("this Python has no shared libpython, which the python-backend stub loads: use a Python built with "
                "--enable-shared (Debian's, pyenv with PYTHON_CONFIGURE_OPTS=--enable-shared) or Triton's container")
    return None


def _onnxruntime_pin() -> str:
    """The ONNX Runtime the bench measured (this environment's), so the server runs the same numerics."""
    try:
        from importlib.metadata import version

        return f"onnxruntime=={version('onnxruntime')}"
    except Exception:  # noqa: BLE001 — not installed here: any release that still supports numpy 1.x
        return "onnxruntime>=1.18"


def _requirements() -> list[str]:
    return ["numpy<2", _onnxruntime_pin(), PYTRITON]


def env_dir() -> str:
    """Where the environment lives: $OVERDRIVE_CACHE (default $XDG_CACHE_HOME/overdrive, else
    ~/.cache/overdrive)/triton-env-py3X-<hash of the requirements and this Python's path>."""
    base = os.environ.get("OVERDRIVE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "overdrive")
    key = hashlib.sha256(repr((_requirements(), sys.base_prefix)).encode()).hexdigest()[:10]
    return os.path.join(base, f"triton-env-py{sys.version_info[0]}{sys.version_info[1]}-{key}")


def _paths(root: str) -> TritonEnv:
    py = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    tritonserver = os.path.join(root, "lib", py, "site-packages", "pytriton", "tritonserver")
    return TritonEnv(root=root, server=os.path.join(tritonserver, "bin", "tritonserver"),
                     backends=os.path.join(tritonserver, "backends"))


def _run(cmd: list[str], what: str) -> None:
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode:
        last = [ln for ln in (p.stderr or p.stdout).strip().splitlines() if ln.strip() and "WARNING" not in ln]
        raise TritonEnvError(f"{what} failed ({last[-1][:200] if last else f'exit {p.returncode}'}); the server's "
                             f"environment needs PyPI once (pip install {' '.join(_requirements())})")


def _make(root: str, say) -> None:
    if os.path.exists(root):
        shutil.rmtree(root)  # an earlier try stopped half-way (no .complete): make it again
    say(f"making the Triton server's environment once in {root} (numpy<2, onnxruntime, {PYTRITON}; ~1-2 min)")
    # The base interpreter, not a venv's: the stub loads this Python's libpython and its standard library.
    base_python = os.path.join(sys.base_prefix, "bin", f"python{sys.version_info[0]}.{sys.version_info[1]}")
    _run([base_python if os.path.exists(base_python) else sys.executable, "-m", "venv", root], "python -m venv")
    pip = [os.path.join(root, "bin", "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    # pytriton's own requirements (tritonclient, grpcio, typer, ...) are for its Python API, which is not used:
    # the binary, the backend and the stubs are all the wheel's files this needs.
    _run(pip + _requirements()[:2], "pip install numpy<2 onnxruntime")
    _run(pip + ["--no-deps", PYTRITON], f"pip install {PYTRITON}")
    env = _paths(root)
    stub = os.path.join(os.path.dirname(env.backends), "python_backend_stubs",
                        f"{sys.version_info[0]}.{sys.version_info[1]}", "triton_python_backend_stub")
    if not os.path.isfile(env.server) or not os.path.isfile(stub):
        raise TritonEnvError(f"{PYTRITON} installed without tritonserver or the stub for Python "
                             f"{platform.python_version()} ({env.server}); use Triton's container")
    shutil.copy2(stub, os.path.join(env.backends, "python", "triton_python_backend_stub"))
    libdir, ldlib = sysconfig.get_config_var("LIBDIR"), sysconfig.get_config_var("LDLIBRARY")
    so = os.path.join(libdir or "", f"{ldlib}.1.0" if ldlib and ldlib.endswith(".so") else ldlib or "")
    if os.path.isfile(so):  # the stub finds this Python's libpython first (<env>/lib leads LD_LIBRARY_PATH)
        os.symlink(so, os.path.join(root, "lib", os.path.basename(so)))


def ready_env() -> TritonEnv | None:
    """The server's environment if it was already made here (nothing installed), else None."""
    root = env_dir()
    return _paths(root) if unavailable_reason() is None and os.path.isfile(os.path.join(root, ".complete")) else None


def ensure_env(*, say=print) -> TritonEnv:
    """The server's environment, made on first use (under a lock: two processes never make it at once)."""
    why = unavailable_reason()
    if why:
        raise TritonEnvError(why)
    import fcntl

    root = env_dir()
    os.makedirs(os.path.dirname(root), exist_ok=True)
    with open(root + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.path.isfile(os.path.join(root, ".complete")):
            _make(root, say)
            with open(os.path.join(root, ".complete"), "w") as f:
                f.write(" ".join(_requirements()) + "\n")
    return _paths(root)
