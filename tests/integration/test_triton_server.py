"""A real Triton Inference Server (tritonserver 2.51 from the nvidia-pytriton wheel) on an exported user
model: READY through /v2/repository/index, HTTP answers equal to eager, a short open-loop stream all
answered, and no server process left, also after a SIGTERM to a bench that runs one. Skips, with one
reason, where the wheel's server cannot run or its environment cannot be made (no PyPI)."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
import user_models

pytestmark = pytest.mark.slow

RANKER = user_models.RANKER


@pytest.fixture(scope="module")
def triton_env():
    from overdrive.serve.triton_bench import triton_unavailable
    from overdrive.serve.triton_env import TritonEnvError, ensure_env

    why = triton_unavailable()
    if why:
        pytest.skip(f"no real Triton server here: {why}")
    try:
        return ensure_env(say=lambda m: None)
    except TritonEnvError as e:
        pytest.skip(f"no real Triton server here: {e}")


def _servers(env) -> set[int]:
    """Running tritonserver and stub processes of this environment."""
    import psutil

    out = set()
    for p in psutil.process_iter(["cmdline", "status"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if env.root in cmd and p.info["status"] != psutil.STATUS_ZOMBIE:
            out.add(p.pid)
    return out


def test_exported_user_model_is_ready_and_answers_as_eager(tmp_path, triton_env):
    import tritonclient.http as http

    from overdrive.cli import main
    from overdrive.serve.triton_client import drive
    from overdrive.serve.triton_server import TritonServer

    (tmp_path / "ranker.py").write_text(RANKER)
    f = f"{tmp_path}/ranker.py"
    assert main(["export", f"{f}:make_ranker", "--inputs", f"{f}:example", "--dynamic", "ids:1", "--max-batch", "16",
                 "--out", str(tmp_path / "out")]) == 0
    before = _servers(triton_env)
    with TritonServer(str(tmp_path / "out" / "triton_local"), env=triton_env) as s:
        assert s.index() == [{"name": "make_ranker", "version": "1", "state": "READY"}]
        ns: dict = {}
        exec(RANKER, ns)
        model = ns["make_ranker"]().eval()
        client = http.InferenceServerClient(s.url.removeprefix("http://"))
        for batch, bag in ((1, 3), (5, 9)):  # other batch sizes and bag lengths than the export's example
            d, ids = torch.randn(batch, 4), torch.randint(0, 50, (batch, bag))
            ins = [http.InferInput("dense", list(d.shape), "FP32"), http.InferInput("ids", list(ids.shape), "INT64")]
            ins[0].set_data_from_numpy(d.numpy())
            ins[1].set_data_from_numpy(ids.numpy())
            got = client.infer("make_ranker", ins).as_numpy("output")
            with torch.no_grad():
                ref = model(d, ids).numpy()
            assert got.shape == (batch, 1)  # dims [ 1 ] with reshape [ ]: the model's (B,) as Triton returns it
            np.testing.assert_allclose(got[:, 0], ref, rtol=1e-5, atol=1e-6)
        payload = []
        for name, a in (("dense", np.ones((1, 4), np.float32)), ("ids", np.zeros((1, 6), np.int64))):
            i = http.InferInput(name, list(a.shape), "FP32" if a.dtype == np.float32 else "INT64")
            i.set_data_from_numpy(a)
            payload.append(i)
        p = drive(s.url, "make_ranker", [payload], 100.0, n=150, server=s)
        assert p["answered"] == p["sent"] == 150 and not p["failed"] and p["triton_stats"]["requests"] == 150
        assert p["latency_ms"]["p50"] > 0 and p["latency_ms"]["p99"] is None  # 150 samples cannot bound a p99
        pgid = s.proc.pid
    from overdrive.serve.triton_server import group_alive

    assert not group_alive(pgid) and _servers(triton_env) <= before


def _bench(tmp_path, *extra):
    (tmp_path / "ranker.py").write_text(RANKER)
    f = f"{tmp_path}/ranker.py"
    cmd = [sys.executable, "-m", "overdrive", "bench", "--workload", "inference", "--quick", "--model",
           f"{f}:make_ranker", "--inputs", f"{f}:example", "--dynamic", "ids:1", "--server", "triton", *extra]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "200"})


def test_bench_on_a_real_server_reports_measured_beside_simulated(tmp_path, triton_env):
    before = _servers(triton_env)
    p = _bench(tmp_path, "--slo-ms", "20", "--out", str(tmp_path / "b"))
    out = p.communicate(timeout=1500)[0]
    assert p.returncode == 0, out[-3000:]
    r = json.loads((tmp_path / "b" / "results.json").read_text())
    t = r["triton"]
    if t["status"] != "ok":  # the simulation served nothing (e.g. every verdict withheld on a busy host)
        assert "not run" in out
        return
    q = t["requests"]
    assert q["answered"] + q["failed"] + q["not_sent"] == sum(p["scheduled"] for p in t["points"])
    assert t["simulated_rate"] > 0 and "measured/simulated" in out and not t["leftover_processes"]
    assert (tmp_path / "b" / "triton_latency_vs_rate.png").stat().st_size > 5000
    assert _servers(triton_env) <= before


def test_sigterm_to_the_bench_leaves_no_server(tmp_path, triton_env):
    before = _servers(triton_env)
    p = _bench(tmp_path, "--slo-ms", "20")
    try:
        deadline = time.monotonic() + 1200
        while time.monotonic() < deadline and not (_servers(triton_env) - before):
            if p.poll() is not None:
                pytest.fail("the bench ended before it started a server: " + p.stdout.read()[-2000:])
            time.sleep(0.5)
        assert _servers(triton_env) - before, "no server was started within the time bound"
        p.send_signal(signal.SIGTERM)
        p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
    for _ in range(40):  # the server drains and its stubs exit
        if _servers(triton_env) <= before:
            break
        time.sleep(0.25)
    assert _servers(triton_env) <= before
