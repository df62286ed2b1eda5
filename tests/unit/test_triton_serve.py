"""`overdrive serve` and the server's process handling against a fake tritonserver (a small HTTP server
that answers /v2/repository/index and forks a child that ignores SIGTERM, as a stuck stub would): READY
is awaited, SIGTERM/SIGINT end the server and its children, and nothing outlives it. The real binary is
exercised in tests/integration/test_triton_server.py."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from overdrive.errors import UserError

FAKE = r'''
import http.server, json, os, signal, sys, time
port = int(sys.argv[sys.argv.index("--http-port") + 1])
assert sys.argv[sys.argv.index("--http-address") + 1] == "127.0.0.1"
child = os.fork()
if child == 0:  # a "stub" that ignores SIGTERM: only the group's SIGKILL ends it
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    open(os.environ["FAKE_CHILD_PID"], "w").write(str(os.getpid()))
    while True:
        time.sleep(1)
class H(http.server.BaseHTTPRequestHandler):
    def _send(self, obj):
        body = json.dumps(obj).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._send([{"name": "m", "version": "1", "state": os.environ.get("FAKE_STATE", "READY"),
                     "reason": "fake load failure"}])
    def do_GET(self):
        self._send({"model_stats": [{"name": "m", "execution_count": 0}]})
    def log_message(self, *a):
        pass
signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
'''


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(")")[1].split()[0] != "Z"


def _fake(tmp_path):
    from overdrive.serve.triton_env import TritonEnv

    server = tmp_path / "tritonserver"
    server.write_text(f"#!{sys.executable}\n{FAKE}")
    server.chmod(0o755)
    return TritonEnv(root=str(tmp_path), server=str(server), backends=str(tmp_path))


def _local_repo(tmp_path):
    from overdrive.serve.triton_local import write_local_variant

    (tmp_path / "model.onnx").write_bytes(b"not read by the fake")
    spec = {"inputs": [("x", [4], "TYPE_FP32")], "outputs": [("y", [], "TYPE_FP32")]}
    write_local_variant(str(tmp_path / "out"), "m", spec, {"max_batch_size": 8}, [str(tmp_path / "model.onnx")])
    return tmp_path / "out"


def test_server_stop_ends_every_process_it_started(tmp_path, monkeypatch):
    from overdrive.serve.triton_server import TritonServer, group_alive

    monkeypatch.setenv("FAKE_CHILD_PID", str(tmp_path / "child.pid"))
    s = TritonServer(str(_local_repo(tmp_path) / "triton_local"), env=_fake(tmp_path))
    with s:
        assert s.index() == [{"name": "m", "version": "1", "state": "READY", "reason": "fake load failure"}]
        pgid = s.proc.pid
        for _ in range(50):
            if (tmp_path / "child.pid").exists():
                break
            time.sleep(0.1)
        child = int((tmp_path / "child.pid").read_text())
        assert _alive(child)
    assert not group_alive(pgid) and not _alive(child)


def test_a_model_that_does_not_load_is_one_line_naming_it(tmp_path, monkeypatch):
    from overdrive.serve.triton_server import TritonServer, TritonServerError

    monkeypatch.setenv("FAKE_STATE", "UNAVAILABLE")
    monkeypatch.setenv("FAKE_CHILD_PID", str(tmp_path / "child.pid"))
    with pytest.raises(TritonServerError, match="Triton did not load m: fake load failure"):
        TritonServer(str(_local_repo(tmp_path) / "triton_local"), env=_fake(tmp_path)).start(timeout_s=20)


def _serve_in_a_subprocess(tmp_path):
    """`overdrive serve` of a local repository in its own process, on the fake tritonserver."""
    env = _fake(tmp_path)
    out = _local_repo(tmp_path)
    code = textwrap.dedent(f"""
        import sys
        import overdrive.serve.triton_env as te
        te.ensure_env = lambda say=print: te.TritonEnv(root={env.root!r}, server={env.server!r}, backends={env.backends!r})
        from overdrive.cli import main
        sys.exit(main(["serve", {str(out)!r}]))
    """)
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "FAKE_CHILD_PID": str(tmp_path / "child.pid")})


@pytest.mark.parametrize("sig", [signal.SIGTERM, pytest.param(signal.SIGINT, marks=pytest.mark.slow)],
                         ids=["SIGTERM", "SIGINT"])  # ~7 s each (a subprocess importing the CLI): one in make test
def test_serve_runs_in_the_foreground_until_a_signal_and_leaves_nothing(tmp_path, sig):
    p = _serve_in_a_subprocess(tmp_path)
    try:
        line = p.stdout.readline()
        assert "READY m (version 1)" in line and "http://127.0.0.1:" in line, line
        child = int((tmp_path / "child.pid").read_text())
        p.send_signal(sig)
        rest = p.communicate(timeout=60)[0]
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0 and "stopped: tritonserver and its python-backend stubs have exited" in rest
    assert not _alive(child)


def test_serve_refuses_what_it_cannot_serve_in_one_line(tmp_path):
    from overdrive.serve.triton_config import triton_config
    from overdrive.serve.triton_local import find_local_repository

    with pytest.raises(UserError, match="is not a folder"):
        find_local_repository(str(tmp_path / "nope"))
    prod = tmp_path / "triton" / "m"
    prod.mkdir(parents=True)
    spec = {"inputs": [("x", [4], "TYPE_FP32")], "outputs": [("y", [1], "TYPE_FP32")]}
    (prod / "config.pbtxt").write_text(triton_config("m", "onnxruntime_onnx", spec, 8))
    (tmp_path / "triton_local").mkdir()
    with pytest.raises(UserError, match="onnxruntime_onnx needs Triton's container .* serve .*triton_local here"):
        find_local_repository(str(tmp_path / "triton"))
    assert find_local_repository(str(_local_repo(tmp_path))).endswith("out/triton_local")
    (tmp_path / "noonnx").mkdir()
    (tmp_path / "noonnx" / "export.json").write_text("{}")
    with pytest.raises(UserError, match="exported without ONNX"):
        find_local_repository(str(tmp_path / "noonnx"))


def test_where_the_wheel_cannot_run_it_says_why(monkeypatch):
    import platform

    from overdrive.serve import triton_env

    monkeypatch.setattr(platform, "machine", lambda: "aarch64")
    assert "x86-64 Linux" in triton_env.unavailable_reason()
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(platform, "libc_ver", lambda: ("glibc", "2.31"))
    assert "glibc >= 2.35" in triton_env.unavailable_reason()
    monkeypatch.setattr(platform, "libc_ver", lambda: ("glibc", "2.36"))
    monkeypatch.setattr(triton_env.sysconfig, "get_config_var", lambda k: 0)
    assert "no shared libpython" in triton_env.unavailable_reason()
    with pytest.raises(triton_env.TritonEnvError, match="no shared libpython"):
        triton_env.ensure_env()


def test_the_python_model_file_imports_nothing_of_overdrive():
    from overdrive.serve.triton_local import _model_py

    imports = [ln for ln in _model_py().decode().splitlines() if ln.startswith(("import ", "from "))]
    assert imports and not any("overdrive" in ln for ln in imports)  # it runs in the stub's environment alone


def test_the_environment_lives_under_the_cache_the_user_names(monkeypatch, tmp_path):
    from overdrive.serve.triton_env import env_dir, ready_env

    monkeypatch.delenv("OVERDRIVE_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert env_dir().startswith(str(tmp_path / "xdg" / "overdrive" / "triton-env-py"))
    monkeypatch.setenv("OVERDRIVE_CACHE", str(tmp_path / "od"))
    assert env_dir().startswith(str(tmp_path / "od" / "triton-env-py"))
    assert ready_env() is None  # nothing made there: export installs nothing and says how to get the check


def test_a_second_signal_while_stopping_still_ends_everything(tmp_path):
    """Ctrl-C pressed twice: the second signal arrives while stop() waits for the stubs; it must not cut the stop
    short (a traceback, and a stub that ignores SIGTERM left running for good)."""
    p = _serve_in_a_subprocess(tmp_path)
    child = None
    try:
        line = p.stdout.readline()
        assert "READY m (version 1)" in line, line
        child = int((tmp_path / "child.pid").read_text())
        p.send_signal(signal.SIGTERM)
        time.sleep(0.8)  # inside stop(): the server is gone, the stub that ignores SIGTERM is still there
        p.send_signal(signal.SIGINT)
        rest = p.communicate(timeout=60)[0]
    finally:
        if p.poll() is None:
            p.kill()
    try:
        assert p.returncode == 0 and "Traceback" not in rest, rest
        assert "stopped: tritonserver and its python-backend stubs have exited" in rest
        assert not _alive(child)
    finally:
        if child and _alive(child):
            os.kill(child, signal.SIGKILL)


def test_a_second_sigterm_during_a_bench_cleanup_does_not_cut_it_short():
    """bench runs under parent_ends_on_sigterm: the first SIGTERM starts the cleanup (a server's stop), a second
    one inside that cleanup must not raise again and abandon it."""
    from overdrive.measure.procs import parent_ends_on_sigterm

    finished = False
    with pytest.raises(SystemExit):
        with parent_ends_on_sigterm():
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(1)
            finally:  # the cleanup
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.2)
                finished = True
    assert finished
    assert signal.getsignal(signal.SIGTERM) is not signal.SIG_IGN  # left as it was outside


@pytest.mark.parametrize("tamper", ["edited", "added", "link", "pyc", "filename", "env_path"])
def test_serve_runs_only_the_model_py_export_wrote(tmp_path, tamper):
    """The python backend runs the model folder's Python: an export folder handed over with its model.py
    edited (or another .py added, a link, a config naming another file or environment) is refused, and a
    planted bytecode cache is dropped before the server could import it."""
    from overdrive.serve.triton_local import find_local_repository

    out = _local_repo(tmp_path)
    mdir = out / "triton_local" / "m"
    assert find_local_repository(str(out)) == str(out / "triton_local")
    cfg = mdir / "config.pbtxt"
    if tamper == "edited":
        (mdir / "1" / "model.py").write_text((mdir / "1" / "model.py").read_text() + "\nimport os; os.system('id')\n")
    elif tamper == "added":
        (mdir / "1" / "evil.py").write_text("import os\n")
    elif tamper == "link":
        (tmp_path / "x.py").write_bytes((mdir / "1" / "model.py").read_bytes())
        (mdir / "1" / "model.py").unlink()
        (mdir / "1" / "model.py").symlink_to(tmp_path / "x.py")
    elif tamper == "pyc":
        (mdir / "1" / "__pycache__").mkdir()
        (mdir / "1" / "__pycache__" / "model.cpython-311.pyc").write_bytes(b"planted")
        assert find_local_repository(str(out))
        assert not (mdir / "1" / "__pycache__").exists()
        return
    elif tamper == "filename":
        cfg.write_text(cfg.read_text() + '\ndefault_model_filename: "evil.py"\n')
    else:
        cfg.write_text(cfg.read_text() + '\nparameters { key: "EXECUTION_ENV_PATH" value { string_value: "/tmp/e.tgz" } }\n')
    with pytest.raises(UserError, match="export writes|export never"):
        find_local_repository(str(out))


def test_sigterm_to_export_while_its_server_check_runs_leaves_no_process(tmp_path):
    """export loads the repository in a real tritonserver; a SIGTERM then must stop it and its stubs (without a
    handler, Python died at once and a stub outlived it)."""
    env = _fake(tmp_path)
    repo = _local_repo(tmp_path) / "triton_local"
    code = textwrap.dedent(f"""
        import sys, time
        import overdrive.serve.export as ex
        from overdrive.serve.triton_env import TritonEnv
        from overdrive.serve.triton_server import TritonServer

        def export_for_serving(*a, **kw):  # the server check of a real export, with the fake server
            with TritonServer({str(repo)!r}, env=TritonEnv(root={env.root!r}, server={env.server!r},
                                                          backends={env.backends!r})):
                print("checking", flush=True)
                time.sleep(60)

        ex.export_for_serving = export_for_serving
        from overdrive.cli import main
        sys.exit(main(["export", "--out", {str(tmp_path / "x")!r}]))
    """)
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env={**os.environ, "FAKE_CHILD_PID": str(tmp_path / "child.pid")})
    child = None
    try:
        assert "checking" in p.stdout.readline()
        for _ in range(50):
            if (tmp_path / "child.pid").exists():
                break
            time.sleep(0.1)
        child = int((tmp_path / "child.pid").read_text())
        p.send_signal(signal.SIGTERM)
        p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    try:
        assert p.returncode == 143 and not _alive(child)
    finally:
        if child and _alive(child):
            os.kill(child, signal.SIGKILL)
