"""`overdrive train --report-to mlflow` end to end: the run's loss history read back with MLflow's own
API equals metrics.jsonl, the recipe (asked by its Lightning name) and the machine are the params,
gradient_accumulation_steps sets the micro-batch; a missing tracker package is one line, exit 2."""

import json
import os

import pytest

from overdrive.cli import main

CONFIG = """
[model]
size = "tiny"
[optimizer]
lr = 3e-3
warmup_steps = 2
[train]
steps = 6
seq_len = 32
global_batch = 8
gradient_accumulation_steps = 2
recipe = "32-true"
eval_every = 0
log_every = 2
checkpoint_every = 0
out_dir = "{out}"
"""


@pytest.fixture
def cfg(tmp_path, monkeypatch):
    for k in ("MLFLOW_TRACKING_URI", "MLFLOW_ALLOW_FILE_STORE", "MLFLOW_EXPERIMENT_NAME"):
        monkeypatch.delenv(k, raising=False)
    p = tmp_path / "c.toml"
    p.write_text(CONFIG.format(out=tmp_path / "run"))
    return p


def test_train_report_to_mlflow_leaves_a_run_mlflow_reads_back(cfg, tmp_path, capsys):
    pytest.importorskip("mlflow", reason="the trackers extra (mlflow-skinny) is not installed")
    from mlflow import MlflowClient

    assert main(["train", str(cfg), "--report-to", "mlflow"]) == 0
    run_dir = tmp_path / "run"
    assert "logging to MLflow" in capsys.readouterr().err
    logged = [json.loads(x) for x in open(run_dir / "metrics.jsonl")]
    c = MlflowClient(tracking_uri="file:" + str(run_dir / "mlruns"))
    (run,) = c.search_runs([c.get_experiment_by_name("overdrive").experiment_id])
    hist = [(m.step, m.value) for m in c.get_metric_history(run.info.run_id, "loss")]
    assert hist == [(r["step"], r["loss"]) for r in logged if "loss" in r] and [s for s, _ in hist] == [2, 4, 6]
    assert {"step_ms", "tokens_per_s", "grad_norm", "lr"} <= set(run.data.metrics)
    p = run.data.params
    assert p["recipe.name"] == "fp32" and p["ran.precision"] == "fp32" and len(p["machine.fingerprint"]) == 16
    assert run.info.status == "FINISHED"
    conf = json.load(open(run_dir / "config.json"))["train"]
    assert conf["grad_accum_steps"] == 2 and conf["micro_batch"] == 4  # 8 sequences / 2 micro-steps, one rank
    assert json.load(open(run_dir / "recipe.json"))["recipe"]["name"] == "fp32"


def test_a_tracker_that_is_not_installed_is_one_line_before_any_work(cfg, tmp_path, capsys, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "mlflow" else real(n, *a))
    assert main(["train", str(cfg), "--report-to", "mlflow"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("overdrive: error:") and "pip install mlflow" in err[-1] and "overdrive[trackers] extra" in err[-1]
    assert not os.path.exists(tmp_path / "run")
