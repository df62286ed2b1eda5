"""Hostile pass 2 on `overdrive emit`: a tampered tune folder or recipe.json never adds a line of its own to
the YAML/TOML written for another stack (a newline in a comment, a quote in a key), and is refused on read."""

import json
import tomllib

import pytest
import yaml

from overdrive.emit import Target, emit, load_target
from overdrive.errors import UserError
from overdrive.recipes import Recipe

BASE = {"compute_environment", "distributed_type", "num_machines", "num_processes", "machine_rank", "downcast_bf16",
        "mixed_precision", "use_cpu", "dynamo_config", "fp8_config", "trainer"}
EVIL = "x)\nmain_process_ip: evil.example\nnum_machines: 8\n[evil]\nx = 1\n#"


def _files(out):
    acc = yaml.safe_load(open(out / "accelerate_config.yaml"))
    light = yaml.safe_load(open(out / "lightning_trainer.yaml"))
    toml = tomllib.load(open(out / "torchtitan.toml", "rb"))
    return acc, light, toml


@pytest.mark.parametrize("where", ["name", "where", "fqn", "key"])
def test_text_from_a_target_never_becomes_a_config_line(tmp_path, where):
    ran = {"device": "cpu", "precision": "fp8", "fp8_backend": "torchao", "fp8_scaling": "tensorwise",
           "optimizer": "torch-fused", "norm": "torch", "loss": "cross-entropy", "compile": "off",
           "activation_checkpointing": "none"}
    layers = [{"fqn": "blocks.0.fc", "convert": True}, {"fqn": "head", "convert": False}]
    recipe = Recipe(precision="fp8", fp8_scaling="tensorwise", fp8_backend="torchao", fp8_shapes="64x256",
                    name=EVIL if where == "name" else "custom")
    if where == "fqn":
        layers += [{"fqn": EVIL, "convert": True}, {"fqn": EVIL + "2", "convert": False}]
    if where == "key":
        ran["activation_checkpointing"] = {EVIL: 1}  # a dict where a mode belongs: its key is quoted, never raw
    t = Target(recipe=recipe, ran=ran, where=EVIL if where == "where" else "test", fp8_layers=layers)
    emit(t, stacks=["accelerate", "lightning", "torchtitan", "trainer"], out=str(tmp_path))
    acc, light, toml = _files(tmp_path)
    assert set(acc) <= BASE and set(light) <= BASE and acc["num_machines"] == 1
    assert set(toml) <= {"training", "compile", "activation_checkpoint", "model", "quantize", "optimizer"}
    assert "evil" not in toml and "main_process_ip" not in json.dumps(toml).split('"')[0]


@pytest.mark.parametrize("field,value", [("gpu", EVIL), ("compile", "fast\ninjected: yes"),
                                         ("activation_checkpointing", {"a": 1}), ("optimizer", "x\x1b[2J"),
                                         ("fqn", "a\nb")])
def test_a_tampered_tune_folder_is_one_line_and_writes_nothing(tmp_path, field, value):
    ran = {"precision": "fp8", "fp8_backend": "torchao", "fp8_scaling": "tensorwise", "compile": "off"}
    layers = [{"fqn": "head", "convert": False}]
    top = {"gpu": "H100"}
    if field == "gpu":
        top["gpu"] = value
    elif field == "fqn":
        layers[0]["fqn"] = value
    else:
        ran[field] = value
    win = Recipe(name="fp8", precision="fp8", fp8_shapes="64x256")
    res = {"schema": "overdrive.tune/1", "best": "fp8", **top,
           "candidates": [{"name": "fp8", "recipe": win.to_dict(), "resolved": ran, "fp8_filter": {"layers": layers}}]}
    (tmp_path / "results.json").write_text(json.dumps(res))
    with pytest.raises(UserError, match="not one printable value"):
        load_target(str(tmp_path))
    with pytest.raises(UserError):
        emit(str(tmp_path), stacks=["accelerate"], out=str(tmp_path))
    assert not (tmp_path / "accelerate_config.yaml").exists()


def test_a_users_own_emit_json_is_never_replaced_and_a_refusal_writes_nothing(tmp_path):
    t = Target(recipe=Recipe(name="amp-bf16", precision="bf16"), ran={"precision": "bf16", "compile": "off"},
               where="test")
    (tmp_path / "emit.json").write_text('{"my": "emitter settings"}')
    with pytest.raises(UserError, match="emit.json exists and overdrive emit did not write it"):
        emit(t, stacks=["trainer"], out=str(tmp_path))
    assert (tmp_path / "emit.json").read_text() == '{"my": "emitter settings"}'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["emit.json"]
    # one of several files is the user's: none is written, so the others never become files no emit.json lists
    other = tmp_path / "o"
    other.mkdir()
    (other / "training_args.json").write_text("{}")
    with pytest.raises(UserError, match="training_args.json exists"):
        emit(t, stacks=["accelerate", "trainer"], out=str(other))
    assert sorted(p.name for p in other.iterdir()) == ["training_args.json"]
    emit(t, stacks=["accelerate"], out=str(other))
    emit(t, stacks=["accelerate"], out=str(other))  # its own file, listed: replaced


def test_an_out_that_is_a_file_is_one_line(tmp_path):
    t = Target(recipe=Recipe(name="amp-bf16", precision="bf16"), ran={"precision": "bf16"}, where="test")
    (tmp_path / "f").write_text("mine")
    with pytest.raises(UserError, match="is a file"):
        emit(t, stacks=["trainer"], out=str(tmp_path / "f"))
    assert (tmp_path / "f").read_text() == "mine"


def test_a_real_resolved_record_with_its_decisions_is_read(tmp_path):
    """tune writes `resolved` as ResolvedRecipe.to_dict(): its nested recipe and decisions are not config text."""
    from overdrive.env import build_report
    from overdrive.recipes import resolve

    cpu = build_report({"device": "cpu", "gpus": [], "cpu_bf16": True, "checks": {}, "packages": {}})
    win = Recipe(name="amp-bf16", precision="bf16")
    ran = resolve(win, cpu).to_dict()
    assert isinstance(ran["decisions"], list) and isinstance(ran["recipe"], dict)
    res = {"schema": "overdrive.tune/1", "best": "amp-bf16", "cpu": "x86",
           "candidates": [{"name": "amp-bf16", "recipe": win.to_dict(), "resolved": ran}]}
    (tmp_path / "results.json").write_text(json.dumps(res))
    assert load_target(str(tmp_path)).ran["precision"] == "bf16"
    emit(str(tmp_path), stacks=["accelerate", "trainer"], out=str(tmp_path))
