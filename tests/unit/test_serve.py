"""Inference latency statistics and SLO batch, the KV-cache decode, and export round trips."""

import importlib.util
import json

import numpy as np
import pytest
import torch

from fakes import machine
from overdrive.env import build_report
from overdrive.models import GPT, gpt_config
from overdrive.recsys import DLRM, DLRMServing, padded_ids, synthetic_clicks
from overdrive.serve.export import ExportError, export_for_serving, slo_batch_from, triton_config
from overdrive.bench.workloads.inference import LATENCY_SUITES, _pct, _summarize, run_latency


def test_percentiles_and_slo_batch():
    s = _pct([float(x) for x in range(1, 101)])
    assert s["p50"] == pytest.approx(50.5) and s["p95"] == pytest.approx(95.05)
    assert s["p99"] is None and "p99 needs 368" in s["note"]  # 100 samples cannot bound a p99
    s = _pct([float(x) for x in range(1, 401)])
    assert s["p99"] == pytest.approx(396.01)
    stats = {("fp32", 1): {"p50": 1.0, "p95": 2.0, "p99": 3.0, "n": 10},
             ("fp32", 64): {"p50": 5.0, "p95": 8.0, "p99": 9.5, "n": 10},
             ("fp32", 256): {"p50": 20.0, "p95": 30.0, "p99": 40.0, "n": 10},
             ("bf16", 1): "failed: boom", ("bf16", 64): {"p50": 4.0, "p95": 5.0, "p99": 6.0, "n": 10},
             ("bf16", 256): {"p50": 9.0, "p95": 9.5, "p99": 9.9, "n": 10}}
    out = _summarize(stats, {"fp32": None, "bf16": None, "gone": "no GPU"}, (1, 64, 256), 10.0, "examples/s")
    assert out["modes"]["fp32"]["slo_batch"] == 64  # p99 9.5 <= 10; 256 misses
    assert out["modes"]["fp32"]["slo_throughput"] == pytest.approx(64 / 0.005)
    assert out["modes"]["bf16"]["slo_batch"] == 256 and out["modes"]["bf16"]["batches"]["1"]["status"] == "failed: boom"
    assert out["modes"]["gone"]["status"] == "unavailable"
    assert out["best"]["mode"] == "bf16" and out["best"]["batch"] == 256


def test_kv_cache_decode_matches_full_forward():
    torch.manual_seed(0)
    m = GPT(gpt_config("tiny")).eval()
    x = torch.randint(0, 256, (3, 21))
    with torch.no_grad():
        full, _ = m(x)
        caches = [{} for _ in m.blocks]
        first = m.decode(x[:, :13], caches, 0)
        for t in range(13, 21):
            last = m.decode(x[:, t:t + 1], caches, t)
    assert torch.allclose(first[:, 0], full[:, 12], atol=1e-5)
    assert torch.allclose(last[:, 0], full[:, 20], atol=1e-5)


def test_serving_wrapper_matches_training_model():
    torch.manual_seed(0)
    b = synthetic_clicks(40, seed=2)
    m = DLRM().eval()
    with torch.no_grad():
        assert torch.allclose(torch.sigmoid(m(b)), DLRMServing(m)(b.dense, padded_ids(b, 5)), atol=1e-6)


def test_latency_quick_runs_on_this_machine():
    import dataclasses

    env = build_report(machine(None))
    # The quick suite's shape, shrunk: what is checked is the protocol, not this host's speed.
    suite = dataclasses.replace(LATENCY_SUITES["inference-quick"], recsys_batches=(1, 16), gpt_size="tiny",
                                prefill_len=16, prefill_batches=(1,), decode_context=16, decode_batches=(1, 4),
                                table_scale=0.01, rounds=3, reps=7, serve_batches=(1, 4), serve_reps=5,
                                pair_budget_s=0.0)
    r = run_latency(suite, env, slo_ms=10.0)
    assert r["schema"] == "overdrive.latency/1"
    assert set(r["workloads"]) == {"recsys", "gpt_prefill", "gpt_decode"}
    rec = r["workloads"]["recsys"]["modes"]
    assert rec["cuda-graphs"]["status"] == "unavailable"
    b1 = rec["fp32-inference_mode"]["batches"]["1"]
    assert b1["p50"] > 0 and b1["p95"] is None and b1["p99"] is None and b1["n"] == 21  # 21 samples: no p95, p99
    sv = r["serving"]
    assert sv["engines"]["eager"]["status"] == "ok" and "busy" in sv["load"]
    assert set(sv["engines"]["eager"]["service"]) == {"1", "4"}
    # 8 rounds of at least 5 calls (more when they are short), twins at 1 and 4 as many as eager there.
    rk = sv["reps_per_key"]
    assert [p["n"] for p in sv["noise_floor"]["pairs"]] == [[8 * rk["eager@1"]] * 2, [8 * rk["eager@4"]] * 2]
    assert all(5 <= r <= 100 for r in rk.values())
    for e in sv["engines"].values():  # a verdict with its interval, or none with its reason: never a bare rate
        if e["status"] == "ok":
            assert (e["verdict"] == "given") == bool(e["best"]) and (e["verdict"] == "withheld") == bool(e["withheld"])
            assert not e["best"] or e["best"]["ci"][0] <= e["best"]["rate"] <= e["best"]["ci"][1]


@pytest.mark.slow  # torch.export of two models: ~30 s on 2 cores
@pytest.mark.parametrize("kind,size", [("recsys", None), ("gpt", "tiny")])
def test_export_round_trip_and_triton_repo(tmp_path, kind, size):
    rep = export_for_serving(kind, str(tmp_path), size=size or "cpu-student", max_batch=64, onnx=False)
    assert rep["checks"]["torch.export"] < 1e-4 and rep["triton_platform"] == "pytorch_libtorch"
    loaded = torch.export.load(str(tmp_path / "model.pt2")).module()
    if kind == "recsys":
        b = synthetic_clicks(5, seed=11)  # another batch size than at export: the batch dim is dynamic
        out = loaded(b.dense, padded_ids(b, 5))
        assert out.shape == (5, 1) and ((0 < out) & (out < 1)).all()
    from overdrive.serve.triton_repo import parse_config

    cfg = parse_config((tmp_path / "triton" / rep["name"] / "config.pbtxt").read_text())
    assert cfg.name == rep["name"] and cfg.max_batch_size == 64  # the folder's name, not a file's
    assert list(cfg.dynamic_batching.preferred_batch_size) == []  # nothing measured: Triton's defaults
    assert json.loads((tmp_path / "export.json").read_text())["max_batch"] == 64


@pytest.mark.slow  # the dynamo ONNX exporter: ~30 s on 2 cores
@pytest.mark.skipif(not importlib.util.find_spec("onnxruntime"), reason="onnxruntime not installed")
def test_onnx_export_round_trip(tmp_path):
    rep = export_for_serving("recsys", str(tmp_path), max_batch=128, onnx=True)
    assert rep["checks"]["onnxruntime"] < 1e-4 and rep["triton_platform"] == "onnxruntime_onnx"
    # The Triton folder is self-contained: model.onnx and the external data it names, checked from there.
    assert rep["checks"]["triton onnxruntime"] < 1e-4
    version = tmp_path / "triton" / "click_model" / "1"
    here = {p.name for p in tmp_path.iterdir() if p.name.startswith("model.onnx")}
    assert {p.name for p in version.iterdir()} == here and len(here) >= 1
    import onnxruntime as ort

    sess = ort.InferenceSession(str(version / "model.onnx"), providers=["CPUExecutionProvider"])
    b = synthetic_clicks(3, seed=5)
    m = DLRM()
    m.load_state_dict(torch.export.load(str(tmp_path / "model.pt2")).module().model.model.state_dict())
    for bag in (1, 5, 8):  # the bag length is a dynamic dimension: onnxruntime takes any
        out = sess.run(None, {"dense": b.dense.numpy(), "ids": padded_ids(b, bag).numpy()})[0]
        with torch.no_grad():
            ref = DLRMServing(m.eval())(b.dense, padded_ids(b, bag))
        assert out.shape == (3, 1) and np.allclose(out[:, 0], ref.numpy(), atol=1e-5)
    from overdrive.serve.triton_repo import check_repository, parse_config

    assert check_repository(str(tmp_path / "triton"))[0]["ran"]
    cfg = parse_config((tmp_path / "triton" / "click_model" / "config.pbtxt").read_text())
    assert cfg.name == "click_model" and [list(i.dims) for i in cfg.input] == [[13], [26, -1]]


USER_MODEL = """
import torch
from torch import nn


class Ranker(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(50, 8)
        self.lin = nn.Linear(12, 1)

    def forward(self, dense, ids):
        return torch.sigmoid(self.lin(torch.cat([dense, self.emb(ids).sum(1)], 1))).squeeze(1)


def make_ranker():
    torch.manual_seed(0)
    return Ranker()


def example(batch):
    g = torch.Generator().manual_seed(batch)
    return torch.randn(batch, 4, generator=g), torch.randint(0, 50, (batch, 6), generator=g)
"""


@pytest.mark.slow  # two exports (torch.export + dynamo ONNX) of a small model
@pytest.mark.skipif(not importlib.util.find_spec("onnxruntime"), reason="onnxruntime not installed")
def test_export_user_model_file_with_measured_batching(tmp_path, capsys):
    from overdrive.cli import main
    from overdrive.serve.triton_repo import check_repository, parse_config

    (tmp_path / "ranker.py").write_text(USER_MODEL)
    res = {"slo_ms": 5.0, "device": "cpu", "created": "now", "workloads": {},
           "serving": {"engines": {"onnxruntime": {"label": "ORT", "best": {"rate": 9000.0, "config": {
               "max_batch_size": 64, "preferred_batch_size": [32, 64], "max_queue_delay_us": 500, "instances": 1,
               "kind": "KIND_CPU"}}}}}}
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "results.json").write_text(json.dumps(res))
    out = tmp_path / "out"
    user = [f"{tmp_path}/ranker.py:make_ranker", "--inputs", f"{tmp_path}/ranker.py:example", "--dynamic", "ids:1"]
    # The bench measured the built-in click model: not this one's settings.
    capsys.readouterr()
    assert main(["export", *user, "--slo-from", str(tmp_path / "bench"), "--out", str(out)]) == 2
    assert "it measured the built-in click model, not ranker.py:make_ranker" in capsys.readouterr().err
    assert not (out / "triton").exists()
    # Your own model with --max-batch; the bag is a dynamic dim.
    assert main(["export", *user, "--max-batch", "2", "--out", str(out)]) == 0
    [m] = check_repository(str(out / "triton"))
    assert m["name"] == "make_ranker" and m["max_batch_size"] == 2 and m["ran"]
    cfg = parse_config((out / "triton" / "make_ranker" / "config.pbtxt").read_text())
    assert [list(i.dims) for i in cfg.input] == [[4], [-1]] and list(cfg.output[0].dims) == [1]
    assert cfg.output[0].HasField("reshape") and list(cfg.output[0].reshape.shape) == []  # the model's (B,) kept
    import onnxruntime as ort

    sess = ort.InferenceSession(str(out / "triton" / "make_ranker" / "1" / "model.onnx"))
    d, i = torch.randn(1, 4), torch.randint(0, 50, (1, 9))  # batch 1, another bag length than the example
    ns = {}
    exec(USER_MODEL, ns)
    with torch.no_grad():
        ref = ns["make_ranker"]()(d, i)
    got = sess.run(None, {"dense": d.numpy(), "ids": i.numpy()})[0]
    assert got.shape == ref.shape == (1,) and np.allclose(got, ref.numpy(), atol=1e-6)
    # The built-in click model with the measured settings.
    assert main(["export", "--model", "recsys", "--slo-from", str(tmp_path / "bench"), "--out", str(tmp_path / "c")]) == 0
    cfg = parse_config((tmp_path / "c" / "triton" / "click_model" / "config.pbtxt").read_text())
    assert (cfg.max_batch_size, list(cfg.dynamic_batching.preferred_batch_size),
            cfg.dynamic_batching.max_queue_delay_microseconds) == (64, [32, 64], 500)


def test_export_takes_settings_only_from_a_bench_of_the_same_model(tmp_path):
    from overdrive.serve.export import ExportError, batching_from, model_identity

    (tmp_path / "ranker.py").write_text(USER_MODEL)
    fac, inp = f"{tmp_path}/ranker.py:make_ranker", f"{tmp_path}/ranker.py:example"
    cfg = {"max_batch_size": 64, "preferred_batch_size": [], "max_queue_delay_us": 0, "instances": 1,
           "kind": "KIND_CPU"}

    def bench(identity):
        res = {"slo_ms": 5.0, "device": "cpu", "created": "now", "workloads": {},
               "serving": {"model_identity": identity, "engines": {"onnxruntime": {
                   "label": "ORT", "status": "ok", "best": {"rate": 9000.0, "ci": [8000.0, 9900.0], "config": cfg}}}}}
        (tmp_path / "results.json").write_text(json.dumps(res))
        return str(tmp_path / "results.json")

    mine = model_identity(fac, inp, ["ids:1"])
    # The same files by another path (relative vs absolute), and the same contents: the same model.
    import os

    rel = model_identity(os.path.relpath(fac), os.path.relpath(inp), ["ids:1"])
    assert batching_from(bench(mine), "serving", model=rel)["max_batch_size"] == 64
    assert "note" not in batching_from(bench(mine), "serving", model=rel)  # no other engine measured
    assert "9,000 [8,000-9,900]" in batching_from(bench(mine), "serving", model=mine)["source"]
    with pytest.raises(ExportError, match="it measured the built-in click model, not ranker.py:make_ranker"):
        batching_from(bench(None), "serving", model=mine)  # results from before identities: the click model
    with pytest.raises(ExportError, match="it measured ranker.py:make_ranker with inputs ranker.py:example, not the "
                                          "built-in click model"):
        batching_from(bench(mine), "recsys")
    other = model_identity(fac.replace("make_ranker", "example"), inp)
    with pytest.raises(ExportError, match="not ranker.py:example"):
        batching_from(bench(mine), "serving", model=other)
    with pytest.raises(ExportError, match="with --dynamic ids:1, not \\(none\\)"):  # another ONNX graph than timed
        batching_from(bench(mine), "serving", model=model_identity(fac, inp))
    # The same axis by position or by name is the same model (the identities of loaded models carry axis names).
    from overdrive.serve.export import user_served_model

    by_name = user_served_model(fac, inp, dynamic=["ids:1"]).identity
    assert batching_from(bench(by_name), "serving", model=user_served_model(fac, inp, dynamic=["1:1"]).identity)
    with pytest.raises(ExportError, match="with --dynamic ids:1, not \\(none\\)"):
        batching_from(bench(by_name), "serving", model=user_served_model(fac, inp).identity)
    # Eager surely faster than ONNX Runtime in the same bench: said beside the settings (the ONNX model still ships).
    res = json.loads(open(bench(mine)).read())
    res["serving"]["engines"]["eager"] = {"label": "PyTorch eager fp32 (cpu)", "status": "ok",
                                          "best": {"rate": 90000.0, "ci": [80000.0, 99000.0], "config": cfg}}
    (tmp_path / "results.json").write_text(json.dumps(res))
    got = batching_from(str(tmp_path / "results.json"), "serving", model=mine)
    assert got["note"].startswith("PyTorch eager fp32 (cpu) served this model faster in the same bench: 90,000")
    path = bench(mine)
    (tmp_path / "ranker.py").write_text(USER_MODEL + "\n# edited\n")  # the model file changed since the bench
    with pytest.raises(ExportError, match="ranker.py changed since it was measured"):
        batching_from(path, "serving", model=model_identity(fac, inp, ["ids:1"]))
    (tmp_path / "empty.json").write_text(json.dumps({"slo_ms": 5.0, "workloads": {"recsys": {}}}))
    with pytest.raises(ExportError, match="no serving results in it .*--model .*ranker.py:make_ranker"):
        batching_from(str(tmp_path / "empty.json"), "serving", model=mine)


@pytest.mark.slow  # a bench of a user's model under the request stream (~25 s), then its export (~20 s)
@pytest.mark.skipif(not importlib.util.find_spec("onnxruntime"), reason="onnxruntime not installed")
def test_bench_then_export_a_user_model_carries_its_measured_settings(tmp_path):
    import subprocess
    import sys

    from overdrive.serve.triton_repo import check_repository, parse_config

    (tmp_path / "ranker.py").write_text(USER_MODEL)
    user = ["ranker.py:make_ranker", "--inputs", "ranker.py:example", "--dynamic", "ids:1"]

    def od(*args):
        return subprocess.run([sys.executable, "-m", "overdrive", *args], cwd=tmp_path, capture_output=True, text=True,
                              timeout=600)

    cp = od("bench", "--workload", "inference", "--suite", "inference-quick", "--model", user[0], *user[1:],
            "--slo-ms", "5", "--out", "b")
    assert cp.returncode == 0, cp.stderr[-2000:]
    assert "ranker.py:make_ranker under a Poisson request stream" in cp.stdout
    sv = json.loads((tmp_path / "b" / "results.json").read_text())["serving"]
    assert sv["model_identity"]["factory"] == "ranker.py:make_ranker"
    assert sv["model"].startswith("ranker.py:make_ranker")
    ort = sv["engines"]["onnxruntime"]
    assert ort["status"] == "ok" and ort["max_abs_error_vs_eager"] < 1e-5  # checked against eager before timing
    page = (tmp_path / "b" / "report.html").read_text()
    cp = od("export", *user, "--slo-from", "b", "--out", "e")
    if ort.get("best"):
        assert "overdrive export ranker.py:make_ranker --inputs ranker.py:example --dynamic ids:1 --slo-from" in page
        assert cp.returncode == 0, cp.stderr[-2000:]
        [m] = check_repository(str(tmp_path / "e" / "triton"))
        c = ort["best"]["config"]
        cfg = parse_config((tmp_path / "e" / "triton" / "make_ranker" / "config.pbtxt").read_text())
        assert m["ran"] and (cfg.max_batch_size, list(cfg.dynamic_batching.preferred_batch_size),
                             cfg.dynamic_batching.max_queue_delay_microseconds) == \
            (c["max_batch_size"], c["preferred_batch_size"], c["max_queue_delay_us"])
    else:  # a verdict withheld (a busy host) writes nothing unmeasured
        assert cp.returncode == 2 and len(cp.stderr.strip().splitlines()) == 1, cp.stderr
        assert "withheld its verdict" in cp.stderr or "no setting of onnxruntime met" in cp.stderr
        assert not (tmp_path / "e" / "triton").exists()


@pytest.mark.slow  # torch.export of the click model, twice
@pytest.mark.parametrize("mb", [1, 2])
def test_export_max_batch_below_the_example_batch(tmp_path, capsys, mb):
    from overdrive.cli import main
    from overdrive.serve.triton_repo import parse_config

    res = {"slo_ms": 5.0, "workloads": {"recsys": {"best": {"batch": mb}}}}
    (tmp_path / "results.json").write_text(json.dumps(res))
    assert main(["export", "--model", "recsys", "--slo-from", str(tmp_path), "--no-onnx", "--out",
                 str(tmp_path / "o")]) == 0
    cfg = parse_config((tmp_path / "o" / "triton" / "click_model" / "config.pbtxt").read_text())
    assert cfg.max_batch_size == mb
    loaded = torch.export.load(str(tmp_path / "o" / "model.pt2")).module()
    b = synthetic_clicks(mb, seed=3)
    assert loaded(b.dense, padded_ids(b, 5)).shape == (mb, 1)


def test_slo_batch_from_results(tmp_path):
    (tmp_path / "results.json").write_text(json.dumps({"slo_ms": 5, "workloads": {"recsys": {"best": {"batch": 512}}}}))
    assert slo_batch_from(str(tmp_path), "recsys") == 512
    with pytest.raises(ExportError, match="not an inference bench result"):
        slo_batch_from(str(tmp_path), "gpt_prefill")
    spec = {"inputs": [("x", [3], "TYPE_FP32")], "outputs": [("y", [1], "TYPE_FP32")]}
    assert 'platform: "onnxruntime_onnx"' in triton_config("m", "onnxruntime_onnx", spec, 1)


def test_export_refuses_weights_that_do_not_fit(tmp_path):
    torch.save(GPT(gpt_config("tiny")).state_dict(), tmp_path / "gpt.pt")
    (tmp_path / "random.pt").write_bytes(bytes(range(256)) * 8)
    for f, kind in (("gpt.pt", "recsys"), ("random.pt", "gpt"), ("gpt.pt", "gpt")):  # last: tiny into cpu-student
        with pytest.raises(ExportError, match="does not fit") as e:
            export_for_serving(kind, str(tmp_path / "out"), weights=str(tmp_path / f), onnx=False)
        assert "\n" not in str(e.value)
    with pytest.raises(ExportError, match="not a file"):
        export_for_serving("gpt", str(tmp_path / "out"), weights=str(tmp_path), onnx=False)
    assert not (tmp_path / "out" / "model.pt2").exists()


def test_export_cli_refuses_bad_flags_before_work(tmp_path, capsys):
    from overdrive.cli import main

    assert main(["export", "--out", str(tmp_path / "o"), "--max-batch", "0", "--no-onnx"]) == 2
    assert "--max-batch" in capsys.readouterr().err
    (tmp_path / "f").write_text("x")
    assert main(["export", "--out", str(tmp_path / "f" / "o"), "--no-onnx"]) == 2
    assert "--out" in capsys.readouterr().err
    assert main(["export", "models.py", "--out", str(tmp_path / "o")]) == 2
    assert "FILE.py:FACTORY" in capsys.readouterr().err
    assert main(["export", "--inputs", "m.py:f", "--out", str(tmp_path / "o")]) == 2
    assert "pass FILE.py:FACTORY" in capsys.readouterr().err
    assert main(["export", f"{tmp_path}/nope.py:make", "--inputs", f"{tmp_path}/nope.py:x", "--no-onnx",
                 "--out", str(tmp_path / "o")]) == 2
    assert "not found" in capsys.readouterr().err


def test_bench_of_your_own_model_refuses_bad_input_in_one_line(tmp_path, capsys):
    from overdrive.cli import main
    from overdrive.serve.engines import Engine, ServingError, check_engines

    (tmp_path / "m.py").write_text("import torch\n"
                                   "def make():\n    return torch.nn.Linear(4, 1)\n"
                                   "def three():\n    return 3\n"
                                   "def x(b):\n    return torch.randn(b, 4)\n"
                                   "def short(b):\n    return torch.randn(2, 4)\n"
                                   "def boom():\n    raise RuntimeError('no weights here')\n"
                                   "def noarg():\n    return torch.randn(2, 4)\n"
                                   "def wide(b):\n    return torch.randn(b, 7)\n"
                                   "def as_dict(b):\n    return {'x': torch.randn(b, 4)}\n"
                                   "class Mix(torch.nn.Module):\n    def forward(self, x):\n        return x - x.mean(0)\n"
                                   "def mix():\n    return Mix()\n"
                                   "class Nan(torch.nn.Module):\n    def forward(self, x):\n        return x * float('nan')\n"
                                   "def nan():\n    return Nan()\n")
    (tmp_path / "exits.py").write_text("import sys\nsys.exit(3)\n")
    m = str(tmp_path / "m.py")
    cases = [(["--model", f"{m}:make"], "needs example inputs: pass --inputs FILE.py:FN"),
             (["--inputs", f"{m}:x"], "pass --model FILE.py:FACTORY too"),
             (["--model", m, "--inputs", f"{m}:x"], "is not FILE.py:FACTORY"),
             (["--model", f"{m}:three", "--inputs", f"{m}:x"], "returned int, not an nn.Module"),
             (["--model", f"{m}:make", "--inputs", f"{m}:short"],
              "the first dimension of every input must be the batch"),
             (["--model", f"{m}:make", "--inputs", f"{m}:x", "--dynamic", "0:2"], "input 'input' has 2 dimensions"),
             (["--model", f"{tmp_path}/nope.py:make", "--inputs", f"{m}:x"], "not found"),
             (["--model", f"{m}:boom", "--inputs", f"{m}:x"], "raised RuntimeError: no weights here"),
             (["--model", f"{m}:make", "--inputs", f"{m}:noarg"], f"--inputs {m}:noarg(2) raised TypeError"),
             (["--model", f"{m}:make", "--inputs", f"{m}:wide"], "fails on --inputs"),
             (["--model", f"{m}:make", "--inputs", f"{m}:as_dict"], "returned a dict: a served model takes positional"),
             (["--model", f"{m}:mix", "--inputs", f"{m}:x"], "a dynamic batcher would change its answers"),
             (["--model", f"{m}:nan", "--inputs", f"{m}:x"], "returns non-finite values"),
             (["--model", f"{tmp_path}/exits.py:f", "--inputs", f"{m}:x"], "fails to import: SystemExit: 3"),
             (["--model", f"{m}:make", "--inputs", f"{m}:x", "--slo-ms", "nan"], "--slo-ms must be positive")]
    for args, msg in cases:
        assert main(["bench", "--workload", "inference", "--suite", "inference-quick", *args]) == 2, args
        err = capsys.readouterr().err
        assert msg in err and len(err.strip().splitlines()) == 1, (args, err)
        if args[0] == "--model" and args[2:3] == ["--inputs"] and "--slo-ms" not in args:
            # export reads the model the same way, before writing anything
            assert main(["export", args[1], "--inputs", args[3], *args[4:], "--no-onnx",
                         "--out", str(tmp_path / "o")]) == 2, args
            err = capsys.readouterr().err
            assert msg in err and len(err.strip().splitlines()) == 1, (args, err)
            assert not (tmp_path / "o" / "model.pt2").exists()
    assert main(["bench", "--model", f"{m}:make", "--inputs", f"{m}:x"]) == 2  # --workload transformer
    assert "apply to --workload inference" in capsys.readouterr().err
    # A model that fails at a batch its example did not try: one line naming the batch, nothing timed.
    def eager(b):
        if b > 4:
            raise RuntimeError("index out of range in self")
        return np.zeros((b, 1))

    with pytest.raises(ServingError, match="fails in eager PyTorch at batch 16: RuntimeError: index out of range"):
        check_engines([Engine("eager", "eager", eager)], [1, 4, 16])


def test_slo_from_results_with_settings_out_of_range_are_refused_before_anything_is_written(tmp_path, capsys):
    from overdrive.cli import main

    good = {"max_batch_size": 64, "preferred_batch_size": [32, 64], "max_queue_delay_us": 500, "instances": 1,
            "kind": "KIND_CPU"}
    bad = [({"max_batch_size": 10 ** 9}, "max_batch_size 1000000000"), ({"max_batch_size": "64"}, "max_batch_size '64'"),
           ({"max_queue_delay_us": -1}, "max_queue_delay_us -1"), ({"preferred_batch_size": [128]}, "[128]"),
           ({"preferred_batch_size": "abc"}, "'abc'"), ({"instances": 0}, "instances 0"), ({"kind": "GPU"}, "'GPU'")]
    for change, msg in bad:
        res = {"slo_ms": 5.0, "workloads": {}, "serving": {"engines": {"onnxruntime": {
            "label": "ORT", "status": "ok", "best": {"rate": 9000.0, "config": {**good, **change}}}}}}
        (tmp_path / "results.json").write_text(json.dumps(res))
        assert main(["export", "--model", "recsys", "--slo-from", str(tmp_path), "--out", str(tmp_path / "o")]) == 2
        err = capsys.readouterr().err
        assert "its best setting is not a batcher setting" in err and msg in err and len(err.strip().splitlines()) == 1
        assert not (tmp_path / "o" / "triton").exists()
    for broken in ('{"slo_ms": 5, "serving": "x"}', '{"slo_ms": 5, "serving": {"engines": {"onnxruntime": {"status": '
                   '"ok", "best": {"rate": 1, "config": []}}}}}'):
        (tmp_path / "results.json").write_text(broken)
        assert main(["export", "--model", "recsys", "--slo-from", str(tmp_path), "--out", str(tmp_path / "o")]) == 2
        err = capsys.readouterr().err
        assert err.startswith("overdrive: error: --slo-from") and len(err.strip().splitlines()) == 1, err
    assert main(["export", "--model", "recsys", "--max-batch", str(10 ** 8), "--out", str(tmp_path / "o")]) == 2
    assert "--max-batch must be 1..65536" in capsys.readouterr().err


def test_float_flags_refuse_nan_inf_and_non_positive_before_work(capsys):
    from overdrive.cli import main

    for argv, msg in ((["tune", "m.py:f", "--budget-s", "nan"], "--budget-s must be a positive"),
                      (["tune", "m.py:f", "--budget-s", "inf"], "--budget-s must be a positive"),
                      (["tune", "m.py:f", "--lr", "nan"], "--lr must be a positive"),
                      (["tune", "m.py:f", "--lr", "-1"], "--lr must be a positive"),
                      (["bench", "--workload", "inference", "--slo-ms", "nan"], "--slo-ms must be positive"),
                      (["bench", "--workload", "inference", "--slo-ms", "inf"], "--slo-ms must be positive")):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert msg in err and len(err.strip().splitlines()) == 1, (argv, err)


def test_export_refuses_a_withheld_verdict(tmp_path, capsys):
    from overdrive.cli import main

    why = "too busy to judge: the A/A control is beyond ±15% (load 4.1 -> 4.3 on 2 cores, A/A spread ±19.1% per round)"
    res = {"slo_ms": 5.0, "workloads": {}, "serving": {"verdict": "withheld", "withheld": why, "engines": {
        "onnxruntime": {"status": "ok", "label": "ORT", "withheld": why, "best": None,
                        "estimate": {"rate": 9000.0, "config": {"max_batch_size": 64}}}}}}
    (tmp_path / "results.json").write_text(json.dumps(res))
    assert main(["export", "--model", "recsys", "--slo-from", str(tmp_path), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "withheld its verdict" in err and "load 4.1" in err
    assert not (tmp_path / "o" / "triton").exists()  # the estimate is never written as settings


def test_export_takes_the_users_model_as_bench_does_with_model(tmp_path, capsys):
    """`export --model FILE.py:FACTORY` (bench's spelling) reaches the same checks as the positional FILE.py:FACTORY;
    it used to be "invalid choice ... recsys, gpt"."""
    from overdrive.cli import main

    assert main(["export", "--model", f"{tmp_path}/nope.py:make", "--inputs", f"{tmp_path}/nope.py:x", "--no-onnx",
                 "--out", str(tmp_path / "o")]) == 2
    assert "not found" in capsys.readouterr().err
    assert main(["export", "--model", "m.py:make", "--out", str(tmp_path / "o")]) == 2
    assert "needs example inputs" in capsys.readouterr().err
    assert main(["export", "a.py:f", "--model", "b.py:g", "--out", str(tmp_path / "o")]) == 2
    assert "two models" in capsys.readouterr().err
    assert main(["export", "--model", "bert", "--out", str(tmp_path / "o")]) == 2
    assert "recsys, gpt or FILE.py:FACTORY" in capsys.readouterr().err
