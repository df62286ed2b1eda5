"""`overdrive emit`: each file loaded with that stack's own loader (accelerate's launcher into an
Accelerator, transformers' HfArgumentParser/TrainingArguments, torchtitan's ConfigManager, Lightning's
Trainer), what a stack cannot express said one line each, the target read from a tune folder."""

import json
import os
import typing

import pytest

from overdrive.cli import main
from overdrive.emit import STACKS, Target, emit, load_target
from overdrive.env import build_report
from overdrive.errors import UserError
from overdrive.recipes import Recipe

CPU = build_report({"device": "cpu", "gpus": [], "cpu_bf16": True, "checks": {}, "packages": {}})


def _t(recipe="amp-bf16+compile", layers=(), **ran) -> Target:
    base = {"device": "cpu", "precision": "bf16", "fp8_backend": None, "fp8_scaling": None, "optimizer": "torch-fused",
            "norm": "torch", "loss": "cross-entropy", "compile": "default", "activation_checkpointing": "none", "checkpoint_every": 2}
    base.update(ran)
    from overdrive.recipes import parse_recipe_name

    return Target(recipe=parse_recipe_name(recipe), ran=base, where="test", fp8_layers=list(layers))


FP8_AO = dict(recipe="fp8+torchao+fp8_shapes=64x256", precision="fp8", fp8_backend="torchao", fp8_scaling="tensorwise")
FP8_TE = dict(recipe="fp8-delayed+te", precision="fp8", fp8_backend="transformer_engine", fp8_scaling="delayed",
              compile="off")
LAYERS = [{"fqn": "blocks.0.fc", "convert": True}, {"fqn": "blocks.0.proj", "convert": False},
          {"fqn": "head", "convert": False}]


def _accelerate_env(path):
    """What `accelerate launch --config_file path` puts in the environment its Accelerator reads."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_simple_launcher_cmd_env

    args = launch_command_parser().parse_args(["--config_file", str(path), "train.py"])
    args, _, _ = _validate_launch_command(args)
    return {k: v for k, v in prepare_simple_launcher_cmd_env(args)[1].items() if k.startswith("ACCELERATE_")}


def test_accelerate_config_runs_an_accelerator_with_the_recipe(tmp_path, monkeypatch):
    pytest.importorskip("accelerate", reason="the hf extra (accelerate) is not installed")
    from accelerate import Accelerator
    from accelerate.commands.config.config_args import load_config_from_file

    (e,) = emit(_t(), stacks=["accelerate"], out=str(tmp_path))
    cfg = load_config_from_file(e.path)
    assert cfg.mixed_precision == "bf16" and cfg.dynamo_config["dynamo_backend"] == "INDUCTOR" and cfg.use_cpu
    for k, v in _accelerate_env(e.path).items():
        monkeypatch.setenv(k, v)
    assert _accelerate_env(e.path)["ACCELERATE_USE_CPU"] == "True"  # it ran on a CPU: the config says so
    acc = Accelerator()
    assert acc.mixed_precision == "bf16" and acc.state.dynamo_plugin.backend.value == "INDUCTOR"
    assert acc.state.dynamo_plugin.mode == "default"
    assert any("fused=True" in c for c in e.cannot)  # the optimizer is the user's in Accelerate


def test_accelerate_fp8_configs_carry_the_backend_and_the_te_recipe(tmp_path):
    pytest.importorskip("accelerate", reason="the hf extra (accelerate) is not installed")
    pytest.importorskip("torchao", reason="accelerate's launcher checks an FP8 backend is installed")
    (ao,) = emit(_t(layers=LAYERS, **FP8_AO), stacks=["accelerate"], out=str(tmp_path / "ao"))
    env = _accelerate_env(ao.path)
    assert env["ACCELERATE_MIXED_PRECISION"] == "fp8" and env["ACCELERATE_FP8_BACKEND"] == "AO"
    assert any("per-layer FP8 filter (only blocks.0.fc)" in c for c in ao.cannot)
    (te,) = emit(_t(**FP8_TE), stacks=["accelerate"], out=str(tmp_path / "te"))
    env = _accelerate_env(te.path)
    keys = ("BACKEND", "AMAX_HISTORY_LEN", "AMAX_COMPUTE_ALGO", "FORMAT")
    assert [env[f"ACCELERATE_FP8_{k}"] for k in keys] == ["TE", "16", "max", "HYBRID"]
    assert env["ACCELERATE_DYNAMO_BACKEND"] == "NO"
    (cur,) = emit(_t(**{**FP8_TE, "fp8_scaling": "tensorwise"}), stacks=["accelerate"], out=str(tmp_path / "cur"))
    assert any("DelayedScaling (or MXFP8) only" in c for c in cur.cannot)


def test_training_args_load_as_written(tmp_path):
    pytest.importorskip("transformers", reason="the hf extra (transformers) is not installed")
    from transformers import HfArgumentParser, TrainingArguments

    (e,) = emit(_t(recipe="amp-bf16+compile+ckpt", activation_checkpointing="full", optimizer="foreach"),
                stacks=["trainer"], out=str(tmp_path))
    (args,) = HfArgumentParser(TrainingArguments).parse_json_file(e.path, allow_extra_keys=False)
    assert (args.bf16, args.fp16, args.torch_compile, args.torch_compile_mode, args.gradient_checkpointing,
            args.optim.value) == (True, False, True, "default", True, "adamw_torch")
    kw = json.load(open(e.path))
    assert TrainingArguments(output_dir=str(tmp_path / "o"), **kw).bf16
    (f8,) = emit(_t(**FP8_AO), stacks=["trainer"], out=str(tmp_path / "f8"))
    assert f8.config["bf16"] and any(c.startswith("FP8: TrainingArguments has no FP8 switch") for c in f8.cannot)
    (fl,) = emit(_t(recipe="fp32+for-loop", precision="fp32", optimizer="for-loop", compile="off"), stacks=["trainer"],
                 out=str(tmp_path / "fl"))
    assert fl.config["optim"] == "adamw_torch" and any("no for-loop AdamW" in c for c in fl.cannot)


def test_torchtitan_toml_loads_in_its_config_manager(tmp_path):
    cm = pytest.importorskip("torchtitan.config", reason="torchtitan (0.2.x, its TOML JobConfig) is not installed")
    (e,) = emit(_t(layers=LAYERS, activation_checkpointing="selective", **{**FP8_AO, "fp8_scaling": "rowwise"}),
                stacks=["torchtitan"], out=str(tmp_path))
    assert open(e.path).readline().startswith("# torchtitan 0.2.x (--job.config_file")
    job = cm.ConfigManager().parse_args(["--job.config_file", e.path])
    f8 = job.quantize.linear.float8
    assert job.model.converters == ["quantize.linear.float8"] and f8.recipe_name == "rowwise"
    assert f8.filter_fqns == ["blocks.0.proj", "head"] and not f8.emulate  # the measured filter, as FQNs to skip
    assert job.compile.enable and job.activation_checkpoint.mode == "selective"
    assert job.activation_checkpoint.selective_ac_option == "2" and job.optimizer.implementation == "fused"
    assert job.training.mixed_precision_param == "bfloat16"
    (te,) = emit(_t(**FP8_TE), stacks=["torchtitan"], out=str(tmp_path / "te"))
    assert "converters" not in open(te.path).read() and any("torchao only" in c for c in te.cannot)
    clash = [{"fqn": "blocks.0.fc", "convert": False}, {"fqn": "blocks.0.fc2", "convert": True}]
    (cl,) = emit(_t(layers=clash, **FP8_AO), stacks=["torchtitan"], out=str(tmp_path / "cl"))
    assert any("by substring: blocks.0.fc2 would be skipped too" in c for c in cl.cannot)


def test_lightning_trainer_takes_the_precision(tmp_path):
    pytest.importorskip("lightning", reason="the stacks extra (lightning) is not installed")
    import yaml
    from lightning.fabric.plugins.precision.precision import _PRECISION_INPUT_STR
    from lightning.pytorch import Trainer

    (e,) = emit(_t(), stacks=["lightning"], out=str(tmp_path))
    cfg = yaml.safe_load(open(e.path))
    tr = Trainer(**cfg["trainer"], accelerator="cpu", logger=False, enable_checkpointing=False,
                 enable_progress_bar=False)
    assert tr.precision == "bf16-mixed" and any("torch.compile(model" in c for c in e.cannot)
    (te,) = emit(_t(**FP8_TE), stacks=["lightning"], out=str(tmp_path / "te"))
    assert yaml.safe_load(open(te.path))["trainer"]["precision"] == "transformer-engine"
    assert "transformer-engine" in typing.get_args(_PRECISION_INPUT_STR)  # Lightning's own name for it
    (ao,) = emit(_t(**FP8_AO), stacks=["lightning"], out=str(tmp_path / "ao"))
    assert ao.config["trainer"]["precision"] == "bf16-mixed" and any("no precision plugin" in c for c in ao.cannot)


def test_every_line_is_in_the_file_header_and_emit_json(tmp_path):
    emitted = emit(_t(layers=LAYERS, norm="liger", loss="fused-linear-cross-entropy", **FP8_AO), stacks=list(STACKS),
                   out=str(tmp_path))
    index = json.load(open(tmp_path / "emit.json"))
    for e in emitted:
        assert index["files"][os.path.basename(e.path)]["cannot"] == e.cannot and e.cannot
        if not e.path.endswith(".json"):
            text = open(e.path).read()
            assert all(f"#   - {c}" in text for c in e.cannot)


def test_emit_never_replaces_a_file_it_did_not_write(tmp_path):
    (tmp_path / "training_args.json").write_text("{\"mine\": 1}")
    with pytest.raises(UserError, match="did not write it"):
        emit(_t(), stacks=["trainer"], out=str(tmp_path))
    assert json.load(open(tmp_path / "training_args.json")) == {"mine": 1}
    emit(_t(), stacks=["accelerate"], out=str(tmp_path))
    emit(_t(), stacks=["accelerate"], out=str(tmp_path))  # its own file: replaced
    with pytest.raises(UserError, match="stacks are accelerate, trainer, torchtitan, lightning"):
        emit(_t(), stacks=["deepspeed"], out=str(tmp_path))


def test_target_from_a_tune_folder_and_from_a_recipe_json(tmp_path):
    win = Recipe(name="fp8", precision="fp8", fp8_shapes="64x256")
    ran = {"precision": "fp8", "fp8_backend": "torchao", "fp8_scaling": "tensorwise", "compile": "off"}
    res = {"schema": "overdrive.tune/1", "best": "fp8", "gpu": "NVIDIA H100 80GB HBM3",
           "candidates": [{"name": "baseline", "recipe": {}, "resolved": {}},
                          {"name": "fp8", "recipe": win.to_dict(), "resolved": ran,
                           "fp8_filter": {"layers": LAYERS}}]}
    (tmp_path / "results.json").write_text(json.dumps(res))
    t = load_target(str(tmp_path))
    assert t.recipe == win and t.ran == ran and t.fp8_skip_fqns == ["blocks.0.proj", "head"]
    assert "H100" in t.where
    Recipe(name="amp-bf16", precision="bf16").save(str(tmp_path / "r.json"))
    t2 = load_target(str(tmp_path / "r.json"), env=CPU)
    assert t2.ran["precision"] == "bf16" and "this machine" in t2.where
    with pytest.raises(UserError, match="not found"):
        load_target(str(tmp_path / "nope.json"))


def test_cli_emit_for_prints_each_line(tmp_path, capsys):
    Recipe(name="amp-bf16", precision="bf16").save(str(tmp_path / "recipe.json"))
    assert main(["emit", str(tmp_path / "recipe.json"), "--for", "trainer", "--for", "lightning",
                 "--out", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    assert "training_args.json" in out and "lightning_trainer.yaml" in out
    assert main(["emit", str(tmp_path / "recipe.json"), "--for", "nope", "--out", str(tmp_path / "o")]) == 2
    from overdrive.commands.emit import STACKS as NAMES

    assert NAMES == tuple(STACKS)  # the CLI's help lists the registry's stacks
