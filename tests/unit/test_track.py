"""Trackers through their own libraries, read back with each library's own reader: MLflow's local
file store (MlflowClient), W&B's offline run file (its protobuf records), TensorBoard's event files
(EventAccumulator); acc.log with accelerate(report_to=...); --report-to refusals in one line."""

import glob
import json
import os
import struct
import time

import pytest
import torch
from torch import nn

import overdrive
from overdrive.env import build_report
from overdrive.errors import UserError
from overdrive.track import open_trackers, parse_report_to

CPU = build_report({"device": "cpu", "gpus": [], "cpu_bf16": False, "checks": {}, "packages": {}})
PARAMS = {"recipe": {"name": "amp-bf16", "precision": "bf16"}, "machine": {"fingerprint": "abc123", "gpus": 0}}


@pytest.fixture
def clean_env(monkeypatch):
    for k in ("MLFLOW_TRACKING_URI", "MLFLOW_ALLOW_FILE_STORE", "MLFLOW_EXPERIMENT_NAME", "WANDB_MODE",
              "WANDB_API_KEY", "WANDB_PROJECT"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("HOME", os.environ.get("HOME", "/tmp"))  # no ~/.netrc is created, only read


def _mlflow_history(uri: str, metric: str):
    from mlflow import MlflowClient

    c = MlflowClient(tracking_uri=uri)
    exp = c.get_experiment_by_name("overdrive")
    (run,) = c.search_runs([exp.experiment_id])
    return run, [(m.step, m.value) for m in c.get_metric_history(run.info.run_id, metric)]


def test_report_to_names_are_checked_and_a_missing_package_names_the_extra(monkeypatch):
    assert parse_report_to(None) == [] and parse_report_to("none") == []
    with pytest.raises(UserError, match="trackers are tensorboard, mlflow, wandb"):
        parse_report_to("neptune")
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "wandb" else real(n, *a))
    with pytest.raises(UserError) as e:
        parse_report_to("tensorboard,wandb")
    assert "overdrive[trackers] extra" in str(e.value) and "wandb" in str(e.value)
    assert "\n" not in str(e.value)


def test_mlflow_local_file_store_read_back_with_mlflows_api(tmp_path, clean_env):
    pytest.importorskip("mlflow", reason="the trackers extra (mlflow-skinny) is not installed")
    trk = open_trackers("mlflow", out_dir=str(tmp_path), run_name="r1", params=PARAMS)
    assert os.environ["MLFLOW_ALLOW_FILE_STORE"] == "true" and "MLFLOW_ALLOW_FILE_STORE=true" in trk.where[0]
    for step, loss in enumerate([2.5, 2.0, 1.75]):
        trk.log({"loss": torch.tensor(loss), "step_ms": 10.0 + step, "tokens_per_s": 1000.0, "note": "x"}, step=step)
    trk.close()
    run, hist = _mlflow_history("file:" + str(tmp_path / "mlruns"), "loss")
    assert hist == [(0, 2.5), (1, 2.0), (2, 1.75)]
    assert run.info.status == "FINISHED" and run.info.run_name == "r1"
    assert run.data.params["recipe.precision"] == "bf16" and run.data.params["machine.fingerprint"] == "abc123"
    assert set(run.data.metrics) == {"loss", "step_ms", "tokens_per_s"}  # the string was not sent


def _wandb_records(path: str):
    """The records of a W&B run file (a LevelDB-style log of wandb_internal.Record protobufs)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = open(path, "rb").read()
    assert data[:4] == b":W&B"
    pos, block, buf = 7, 32768, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        buf += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST
            rec = pb.Record()
            rec.ParseFromString(buf)
            buf = b""
            yield rec


def _has_exit_record(path: str) -> bool:
    try:
        return any(r.WhichOneof("record_type") == "exit" for r in _wandb_records(path))
    except Exception:  # a record half-written at this moment
        return False


def test_wandb_offline_run_read_back_from_its_own_records(tmp_path, clean_env):
    pytest.importorskip("wandb", reason="the trackers extra (wandb) is not installed")
    trk = open_trackers("wandb", out_dir=str(tmp_path), run_name="r2", params=PARAMS)
    assert "offline" in trk.where[0]
    for step, loss in enumerate([3.0, 2.0]):
        trk.log({"loss": loss, "step_ms": 5.0}, step=step)
    trk.close()
    (path,) = glob.glob(str(tmp_path / "wandb" / "offline-run-*" / "run-*.wandb"))
    # W&B's service process may still be writing after finish() returns: read once its exit record is in.
    deadline = time.monotonic() + 60
    while not _has_exit_record(path):
        assert time.monotonic() < deadline, "W&B never wrote the run's exit record"
        time.sleep(0.2)
    hist, config = [], {}
    for rec in _wandb_records(path):
        kind = rec.WhichOneof("record_type")
        if kind == "history":
            row = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.history.item}
            hist.append((row["_step"], row["loss"]))
        elif kind == "run":
            config.update({i.key: json.loads(i.value_json) for i in rec.run.config.update})
            assert rec.run.display_name == "r2"
    assert hist == [(0, 3.0), (1, 2.0)]
    assert config["recipe"] == PARAMS["recipe"] and config["machine"] == PARAMS["machine"]


def test_tensorboard_scalars_read_back_with_its_event_reader(tmp_path, clean_env):
    pytest.importorskip("tensorboard", reason="the trackers extra (tensorboard) is not installed")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    trk = open_trackers("tensorboard", out_dir=str(tmp_path), run_name="r3", params=PARAMS)
    trk.log({"loss": 1.5}, step=3)
    trk.log({"loss": 1.25}, step=4)
    trk.close()
    ea = EventAccumulator(str(tmp_path / "tb"))
    ea.Reload()
    assert [(e.step, e.value) for e in ea.Scalars("loss")] == [(3, 1.5), (4, 1.25)]


def test_acc_log_sends_to_mlflow_with_the_recipe_as_params(tmp_path, clean_env):
    pytest.importorskip("mlflow", reason="the trackers extra (mlflow-skinny) is not installed")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    acc = overdrive.accelerate(model, "32-true", env=CPU, report_to="mlflow", run_name="acc",
                               logging_dir=str(tmp_path), gradient_accumulation_steps=2)
    assert acc.grad_accum_steps == 2
    losses = []
    for i in range(4):
        loss = nn.functional.cross_entropy(acc.model(torch.randn(4, 8)), torch.randint(0, 2, (4,)))
        acc.backward(loss)
        if acc.step()["stepped"]:
            acc.log({"loss": loss.detach()})  # at the optimizer step count
            losses.append((acc.steps, float(loss.detach())))
    acc.end_training()
    run, hist = _mlflow_history("file:" + str(tmp_path / "mlruns"), "loss")
    assert [s for s, _ in hist] == [1, 2] and hist == losses
    assert run.data.params["recipe.name"] == "fp32" and run.data.params["grad_accum_steps"] == "2"
    assert run.data.params["machine.device"] == "cpu"


def test_acc_log_without_trackers_does_nothing():
    acc = overdrive.accelerate(nn.Linear(4, 4), "fp32", env=CPU)
    acc.log({"loss": 1.0}, step=1)  # no report_to: nothing to send, no error
    acc.end_training()


def test_tune_and_bench_results_go_to_mlflow_per_candidate(tmp_path, clean_env):
    pytest.importorskip("mlflow", reason="the trackers extra (mlflow-skinny) is not installed")
    from mlflow import MlflowClient

    from overdrive.track import report_results

    tune = {"recipe": {"name": "amp-bf16"}, "workload": "w", "budget_s": 60,
            "candidates": [{"name": "baseline", "step_ms": 20.0, "speedup": 1.0, "tflops": 0.5, "losses": [3.0, 2.5]},
                           {"name": "amp-bf16+compile", "step_ms": 10.0, "speedup": 2.0, "tflops": 1.0, "mfu": None,
                            "losses": [3.0, 2.4, 2.2]}]}
    where = report_results(tune, "mlflow", out=str(tmp_path / "t"), kind="tune", env=CPU)
    assert len(where) == 1 and "MLflow" in where[0]
    c = MlflowClient(tracking_uri="file:" + str(tmp_path / "t" / "mlruns"))
    (run,) = c.search_runs([c.get_experiment_by_name("overdrive").experiment_id])
    assert run.data.params["winner.name"] == "amp-bf16" and run.data.params["machine.device"] == "cpu"
    assert run.data.metrics["amp-bf16_compile/speedup"] == 2.0 and "amp-bf16_compile/mfu" not in run.data.metrics
    hist = c.get_metric_history(run.info.run_id, "amp-bf16_compile/loss")
    assert [(m.step, m.value) for m in hist] == [(0, 3.0), (1, 2.4), (2, 2.2)]
    bench = {"suite": "cpu-quick", "configs": [{"name": "fp32", "step_ms": {"median": 12.0}, "speedup": 1.0,
                                                "models": {"student": {"tokens_per_s": 900.0, "tflops": 0.01}},
                                                "raw": {"student_loss": [4.0, 3.5]}}]}
    report_results(bench, "mlflow", out=str(tmp_path / "b"), kind="bench", env=CPU)
    c = MlflowClient(tracking_uri="file:" + str(tmp_path / "b" / "mlruns"))
    (run,) = c.search_runs([c.get_experiment_by_name("overdrive").experiment_id])
    assert run.data.metrics["fp32/step_ms"] == 12.0 and run.data.metrics["fp32/student/tokens_per_s"] == 900.0
    assert [m.value for m in c.get_metric_history(run.info.run_id, "fp32/student_loss")] == [4.0, 3.5]
    assert run.data.params["suite"] == "cpu-quick"


def test_tune_flags_are_checked_before_the_run(tmp_path, capsys):
    from overdrive.cli import main

    (tmp_path / "m.py").write_text("import torch\ndef f():\n    return torch.nn.Linear(2, 2)\n"
                                   "def b(s):\n    return torch.randn(2, 2)\n")
    base = ["tune", f"{tmp_path}/m.py:f", "--batch", f"{tmp_path}/m.py:b", "--budget-s", "30"]
    assert main(base + ["--emit", "trainer"]) == 2
    assert "--emit writes into the results folder: add --out DIR" in capsys.readouterr().err
    assert main(base + ["--emit", "deepspeed", "--out", str(tmp_path / "o")]) == 2
    assert "stacks are accelerate, trainer, torchtitan, lightning" in capsys.readouterr().err
    assert main(base + ["--report-to", "comet"]) == 2
    assert "trackers are tensorboard, mlflow, wandb" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
