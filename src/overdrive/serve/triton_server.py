"""A real `tritonserver` on a model repository: started on 127.0.0.1 only, READY checked through
/v2/repository/index, statistics read from /v2/models/<m>/stats, and stopped with everything it
started (the python backend's stub processes) — no process outlives it.

The server runs in a process group of its own; stop() sends SIGTERM (Triton drains in-flight requests,
unloads the models, whose stubs exit), waits, then SIGKILLs the group if anything is left.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

__all__ = ["TritonServer", "TritonServerError", "free_port", "port_taken", "group_alive", "HOST"]

HOST = "127.0.0.1"
"""Loopback only: a server started here is never reachable from another machine."""


class TritonServerError(RuntimeError):
    """The server did not start or a model did not load; the message quotes the server's own error line."""


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def port_taken(port: int) -> bool:
    """Whether 127.0.0.1:`port` cannot be bound (another server has it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((HOST, port))
        except OSError:
            return True
    return False


def group_alive(pgid: int) -> bool:
    """Whether a process of process group `pgid` is still running (a zombie waiting for its reaper, e.g. a
    stub orphaned to a PID 1 that reaps late, is not running)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    import psutil

    for p in psutil.process_iter(["status"]):
        try:
            if os.getpgid(p.pid) == pgid and p.info["status"] != psutil.STATUS_ZOMBIE:
                return True
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return False


def _end_with_parent() -> None:
    """In the server's process, before exec: SIGTERM from the kernel when the process that started it dies
    (Linux PR_SET_PDEATHSIG), so even a SIGKILLed bench leaves no server behind."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _get(url: str, *, data: bytes | None = None, timeout: float = 2.0):
    req = urllib.request.Request(url, data=data, method="POST" if data is not None else "GET")
    with urllib.request.urlopen(req, timeout=timeout) as r:  # noqa: S310 — a 127.0.0.1 URL we built
        body = r.read()
    return json.loads(body) if body else None


class TritonServer:
    """tritonserver on `repo` (HTTP on 127.0.0.1:`port`, gRPC and metrics off). A context manager."""

    def __init__(self, repo: str, *, port: int | None = None, env=None, log_path: str | None = None) -> None:
        from overdrive.serve.triton_env import ensure_env

        self.repo = os.path.abspath(repo)
        self.env = env or ensure_env()
        self.port = port or free_port()
        self.url = f"http://{HOST}:{self.port}"
        self.log_path = log_path or tempfile.mkstemp(prefix="tritonserver-", suffix=".log")[1]
        self.proc: subprocess.Popen | None = None

    def command(self) -> list[str]:
        return [self.env.server, "--model-repository", self.repo, "--backend-directory", self.env.backends,
                "--http-address", HOST, "--http-port", str(self.port), "--allow-grpc", "false",
                "--allow-metrics", "false", "--exit-timeout-secs", "10", "--strict-readiness", "true",
                "--disable-auto-complete-config", "--log-verbose", "0"]

    def environment(self) -> dict:
        """The server's environment: the project-made one activated, as Triton's EXECUTION_ENV_PATH would (its
        bin/ first on PATH: the stub's embedded Python finds its site-packages through it; its lib/ first on
        LD_LIBRARY_PATH: this Python's libpython), and none of this process's Python settings."""
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")}
        env["VIRTUAL_ENV"] = self.env.root
        env["PATH"] = os.path.join(self.env.root, "bin") + os.pathsep + env.get("PATH", "/usr/bin:/bin")
        env["LD_LIBRARY_PATH"] = os.path.join(self.env.root, "lib") + (
            os.pathsep + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
        return env

    def start(self, *, timeout_s: float = 120.0) -> TritonServer:
        log = open(self.log_path, "wb")
        # A session of its own: the stubs it forks share its process group, which stop() ends as one.
        self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True, env=self.environment(),
                                     preexec_fn=_end_with_parent if sys.platform.startswith("linux") else None)
        log.close()
        try:
            self.wait_ready(timeout_s=timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def _log_errors(self) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                lines = [ln.strip() for ln in f if ln.startswith("E") or "error:" in ln]
        except OSError:
            return ""
        lines = [ln for ln in lines if "CudaDriverHelper" not in ln]  # no GPU here: expected, harmless
        return lines[-1][:300] if lines else ""

    def index(self) -> list[dict]:
        """/v2/repository/index: every model with its version and state (READY, UNAVAILABLE + reason)."""
        return _get(f"{self.url}/v2/repository/index", data=b"{}") or []

    def wait_ready(self, *, timeout_s: float = 120.0) -> list[dict]:
        """Until the server answers and every model in the repository is READY; else one line naming why."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise TritonServerError(f"tritonserver exited ({self.proc.returncode}) on {self.repo}: "
                                        f"{self._log_errors() or 'see ' + self.log_path}")
            try:
                models = self.index()
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                time.sleep(0.2)
                continue
            bad = [m for m in models if m.get("state") != "READY"]
            if models and not bad:
                return models
            if any(m.get("state") == "UNAVAILABLE" for m in bad):
                m = bad[0]
                raise TritonServerError(f"Triton did not load {m['name']}: {m.get('reason') or self._log_errors()}")
            time.sleep(0.2)
        raise TritonServerError(f"tritonserver was not READY within {timeout_s:.0f} s ({self._log_errors() or 'see ' + self.log_path})")

    def stats(self, model: str) -> dict:
        """Triton's own statistics of `model` (/v2/models/<m>/stats): counts and cumulative ns per stage."""
        return (_get(f"{self.url}/v2/models/{model}/stats") or {}).get("model_stats", [{}])[0]

    def cpu_seconds(self) -> float:
        """User + system CPU time of the server and its stubs so far."""
        import psutil

        try:
            p = psutil.Process(self.proc.pid)
            procs = [p, *p.children(recursive=True)]
        except (psutil.Error, AttributeError):
            return 0.0
        total = 0.0
        for q in procs:
            try:
                t = q.cpu_times()
                total += t.user + t.system
            except psutil.Error:
                pass
        return total

    def stop(self, *, grace_s: float = 15.0) -> None:
        """SIGTERM, then SIGKILL to the whole group after `grace_s`: nothing it started is left."""
        if self.proc is None:
            return
        pgid = self.proc.pid
        if self.proc.poll() is None:
            try:
                os.killpg(pgid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                pass
        deadline = time.monotonic() + 2
        while group_alive(pgid) and time.monotonic() < deadline:  # stubs still unloading exit after the server
            time.sleep(0.1)
        if group_alive(pgid):
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            deadline = time.monotonic() + 5
            while group_alive(pgid) and time.monotonic() < deadline:
                time.sleep(0.05)
        if self.proc.poll() is None:
            self.proc.wait(timeout=5)
        self.proc = None

    def __enter__(self) -> TritonServer:
        return self.start() if self.proc is None else self

    def __exit__(self, *exc) -> None:
        self.stop()
