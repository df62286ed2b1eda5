"""`overdrive tune` end to end on CPU: user models of two widths, a user loss and a dict batch, an HF
model from a config, the winner reloaded and trained, and bad input as one line + exit 2."""

import json
import math
import os

import pytest
import torch

import overdrive
from overdrive.cli import main
from overdrive.recipes import Recipe

USER_CODE = '''
import torch
from torch import nn


class Tagger(nn.Module):
    """Not our GPT: an embedding + MLP tagger, returning logits."""

    def __init__(self, width):
        super().__init__()
        self.emb = nn.Embedding(64, width)
        self.mlp = nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width))
        self.norm = nn.LayerNorm(width)
        self.out = nn.Linear(width, 5)

    def forward(self, ids):
        h = self.emb(ids)
        return self.out(self.norm(h + self.mlp(h)))


def narrow():
    return Tagger(32)


def wide():
    return Tagger(96)


def batch(step):
    g = torch.Generator().manual_seed(step)
    return {"ids": torch.randint(0, 64, (8, 16), generator=g), "tags": torch.randint(0, 5, (8, 16), generator=g)}


def loss(model, b):
    return nn.functional.cross_entropy(model(b["ids"]).flatten(0, 1), b["tags"].flatten())


def broken():
    raise RuntimeError("no weights here")


def bad_batch(step):
    return 42


def ids_only(step):
    return {"ids": torch.randint(0, 64, (8, 16))}
'''


@pytest.fixture(scope="module")
def user(tmp_path_factory):
    d = tmp_path_factory.mktemp("user")
    (d / "models.py").write_text(USER_CODE)
    return str(d / "models.py")


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    overdrive.get_env()  # probed (or read from the real disk cache) before the cache folder moves
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # tune's winners go to a fresh folder


def _train_a_few(model, recipe, b, loss_fn, steps=3):
    acc = overdrive.accelerate(model, recipe)
    losses = []
    for i in range(steps):
        with acc.autocast():
            loss = loss_fn(acc.model, b(i))
        acc.backward(loss)
        acc.step()
        losses.append(loss.item())
    return acc, losses


@pytest.mark.slow
def test_cli_narrow_model_user_loss_dict_batch_json_and_out(user, tmp_path, capsys):
    out = tmp_path / "out"
    rc = main(["tune", f"{user}:narrow", "--batch", f"{user}:batch", "--loss", f"{user}:loss", "--budget-s", "45",
               "--candidates", "fp32,amp-bf16", "--json", "--out", str(out)])
    assert rc == 0
    res = json.loads(capsys.readouterr().out)
    rows = {r["name"]: r for r in res["candidates"]}
    assert list(rows) == ["baseline", "fp32", "amp-bf16"]
    for r in rows.values():
        assert {"name", "status", "step_ms", "speedup", "speedup_ci", "loss_delta_pct", "safe", "resolved"} <= set(r)
    base = rows["baseline"]
    assert base["status"] == "ok" and base["speedup"] == 1.0 and base["step_ms"] > 0 and base["safe"]
    assert res["best"] in rows and res["summary"]
    opt = rows["fp32"]["resolved"]["optimizer"]  # torch-fused, or what the doctor says works here
    assert opt != "for-loop" and f"{opt} AdamW" in rows["fp32"]["ran"]
    for name in ("fp32", "amp-bf16"):  # measured and safety-checked, or stopped with a reason
        assert rows[name]["status"] in ("ok", "eliminated", "stopped", "skipped"), rows[name]
        assert rows[name]["status"] in ("ok", "eliminated") or rows[name]["reason"]
    # The winner line is honest about the rule: a winner's interval lies above 1.0.
    win = rows[res["best"]]
    assert res["best"] == "baseline" or win["speedup_ci"][0] > 1.0
    assert {p.name for p in out.iterdir()} >= {"results.json", "report.html", "recipe.json"}
    rec = Recipe.load(str(out / "recipe.json"))
    assert rec.name == res["best"]
    ns = {}
    exec(compile(USER_CODE, "models", "exec"), ns)
    acc, losses = _train_a_few(ns["narrow"](), rec, ns["batch"], ns["loss"])
    assert all(math.isfinite(x) for x in losses)
    # The winner is cached for this model on this machine.
    acc = overdrive.accelerate(ns["narrow"](), "tuned")
    assert acc.resolved.decisions[0].requested == "tuned" and not acc.resolved.decisions[0].fallback
    assert acc.resolved.recipe == rec


@pytest.mark.slow
def test_python_api_wide_model(user, tmp_path):
    res = overdrive.tune(f"{user}:wide", f"{user}:batch", loss_fn=f"{user}:loss", budget_s=35,
                         candidates=["fp32+foreach"])
    assert [r["name"] for r in res.rows] == ["baseline", "fp32+foreach"]
    assert res.rows[0]["n"] >= 2 and isinstance(res.best, Recipe)
    assert res.meta["signature"] and res.meta["elapsed_s"] <= 35
    p = res.save(str(tmp_path / "o"))
    assert Recipe.load(os.path.join(p, "recipe.json")) == res.best
    assert main(["report", p]) == 0  # the page is the report's: rendered from the results save wrote
    assert "overdrive tune" in open(os.path.join(p, "report.html")).read()


@pytest.mark.slow
def test_cli_hf_model_from_config(tmp_path, capsys):
    pytest.importorskip("transformers")
    cfg = {"model_type": "gpt2", "n_layer": 1, "n_embd": 32, "n_head": 2, "vocab_size": 128, "n_positions": 32}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    rc = main(["tune", "--hf", str(tmp_path / "config.json"), "--budget-s", "40", "--candidates", "fp32", "--json"])
    assert rc == 0
    res = json.loads(capsys.readouterr().out)
    assert res["candidates"][0]["status"] == "ok" and res["candidates"][0]["step_ms"] > 0
    assert "GPT2" in res["workload"]


@pytest.mark.slow
def test_bad_input_is_one_line_and_exit_2(user, tmp_path, capsys):
    def err(argv):
        rc = main(argv)
        e = capsys.readouterr().err.strip().splitlines()
        return rc, e[-1] if e else ""

    rc, line = err(["tune", str(tmp_path / "nope.py") + ":f", "--batch", f"{user}:batch", "--budget-s", "30"])
    assert rc == 2 and "not found" in line and line.startswith("overdrive: error:")
    rc, line = err(["tune", f"{user}:broken", "--batch", f"{user}:batch", "--budget-s", "40"])
    assert rc == 2 and "the model factory raised RuntimeError: no weights here" in line
    rc, line = err(["tune", f"{user}:narrow", "--batch", f"{user}:bad_batch", "--budget-s", "40"])
    assert rc == 2 and "returned int" in line
    rc, line = err(["tune", f"{user}:narrow", "--batch", f"{user}:batch", "--budget-s", "40"])
    assert rc == 2 and "model(**batch) fails" in line and "pass --loss" in line  # "tags" is no forward argument
    rc, line = err(["tune", f"{user}:narrow", "--batch", f"{user}:ids_only", "--budget-s", "40"])
    assert rc == 2 and "not a scalar loss: pass --loss" in line  # logits, and no --loss
    rc, line = err(["tune", f"{user}:narrow", "--batch", f"{user}:batch", "--loss", f"{user}:loss",
                    "--budget-s", "0.5"])
    assert rc == 2 and "too small for even the baseline" in line and "--budget-s" in line
    rc, line = err(["tune", f"{user}:narrow", "--batch", f"{user}:batch", "--candidates", "fp33"])
    assert rc == 2 and "unknown recipe" in line
    assert torch.get_num_threads() >= 1
