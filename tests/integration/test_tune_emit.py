"""Done when: `overdrive tune --emit accelerate --emit trainer` on a user's own model writes files that
accelerate's launcher (into an Accelerator) and transformers.TrainingArguments load as written; the
results carry FLOP/s counted on that model; --report-to mlflow logs each candidate."""

import json

import pytest

from overdrive.cli import main

USER_CODE = '''
import torch
from torch import nn


class Scorer(nn.Module):
    """A user's model (not our GPT): two-tower MLP scorer."""

    def __init__(self):
        super().__init__()
        self.a = nn.Sequential(nn.Linear(48, 96), nn.GELU(), nn.Linear(96, 32))
        self.b = nn.Linear(48, 32)

    def forward(self, x, y):
        return nn.functional.mse_loss((self.a(x) * self.b(x)).sum(-1), y)


def make():
    return Scorer()


def batch(step):
    g = torch.Generator().manual_seed(step)
    return torch.randn(64, 48, generator=g), torch.randn(64, generator=g)
'''


def _accelerate_env(path):
    """What `accelerate launch --config_file path` puts in the environment its Accelerator reads."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_simple_launcher_cmd_env

    args = launch_command_parser().parse_args(["--config_file", str(path), "train.py"])
    args, _, _ = _validate_launch_command(args)
    return {k: v for k, v in prepare_simple_launcher_cmd_env(args)[1].items() if k.startswith("ACCELERATE_")}


@pytest.mark.slow
def test_tune_emit_accelerate_and_trainer_load_as_written(tmp_path, monkeypatch, capsys):
    pytest.importorskip("accelerate", reason="the hf extra (accelerate) is not installed")
    pytest.importorskip("mlflow", reason="the trackers extra (mlflow-skinny) is not installed")
    from accelerate import Accelerator
    from mlflow import MlflowClient
    from transformers import HfArgumentParser, TrainingArguments

    for k in ("MLFLOW_TRACKING_URI", "MLFLOW_ALLOW_FILE_STORE", "MLFLOW_EXPERIMENT_NAME"):
        monkeypatch.delenv(k, raising=False)
    import overdrive

    overdrive.get_env()  # probed (or read from the real disk cache) before the cache folder moves
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # tune's winner goes to a fresh folder
    user = tmp_path / "models.py"
    user.write_text(USER_CODE)
    out = tmp_path / "tuned"
    rc = main(["tune", f"{user}:make", "--batch", f"{user}:batch", "--budget-s", "40", "--candidates", "fp32",
               "--out", str(out), "--json", "--emit", "accelerate", "--emit", "trainer", "--report-to", "mlflow"])
    assert rc == 0
    res = json.loads(capsys.readouterr().out)
    # FLOPs counted on this model: forward 2*64*(48*96 + 96*32 + 48*32), backward 2x (x needs no grad: dW only for
    # the first layers of each tower, dX and dW for a[2])
    f = 2 * 64 * (48 * 96 + 96 * 32 + 48 * 32)
    assert res["flops"]["per_step"] == f + (2 * 64 * 48 * 96 + 2 * 2 * 64 * 96 * 32 + 2 * 64 * 48 * 32)
    for r in res["candidates"]:
        if r["step_ms"]:
            assert r["tflops"] == pytest.approx(res["flops"]["per_step"] / (r["step_ms"] / 1e3) / 1e12)
    best = next(r for r in res["candidates"] if r["name"] == res["best"])
    (args,) = HfArgumentParser(TrainingArguments).parse_json_file(str(out / "training_args.json"),
                                                                  allow_extra_keys=False)
    assert args.bf16 == (best["resolved"]["precision"] == "bf16") and args.use_cpu
    for k, v in _accelerate_env(out / "accelerate_config.yaml").items():
        monkeypatch.setenv(k, v)
    mp = {"fp32": "no", "bf16": "bf16", "fp16": "fp16"}[best["resolved"]["precision"]]
    assert Accelerator().mixed_precision == mp
    assert json.load(open(out / "emit.json"))["recipe"] == res["best"]
    c = MlflowClient(tracking_uri="file:" + str(out / "mlruns"))
    (run,) = c.search_runs([c.get_experiment_by_name("overdrive").experiment_id])
    assert run.data.params["winner.name"] == res["best"] and "baseline/step_ms" in run.data.metrics
    losses = json.load(open(out / "results.json"))["candidates"][0]["losses"]
    assert [m.value for m in c.get_metric_history(run.info.run_id, "baseline/loss")] == pytest.approx(losses)
