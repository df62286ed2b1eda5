"""Other stacks' names accepted as aliases, reported back under Overdrive's: Lightning's precision
strings for recipe=, gradient_accumulation_steps beside grad_accum_steps (accelerate and [train])."""

import pytest
import torch
from torch import nn

import overdrive
from overdrive.env import build_report
from overdrive.errors import UserError
from overdrive.recipes import ECOSYSTEM, PRESETS, parse_recipe_name, resolve
from overdrive.train.config import ConfigError, load_config

CPU = build_report({"device": "cpu", "gpus": [], "cpu_bf16": False, "checks": {}, "packages": {}})


@pytest.mark.parametrize("lightning,ours", [("bf16-mixed", "amp-bf16"), ("16-mixed", "amp-fp16"), ("32-true", "fp32"),
                                            ("32", "fp32"), ("16", "amp-fp16"), ("BF16-Mixed", "amp-bf16")])
def test_lightning_precisions_are_overdrive_presets(lightning, ours):
    r = parse_recipe_name(lightning)
    assert r == PRESETS[ours] and r.name == ours


def test_transformer_engine_is_te_fp8_with_delayed_scaling_as_lightning_defaults_it():
    r = parse_recipe_name("transformer-engine")
    assert (r.precision, r.fp8_scaling, r.fp8_backend) == ("fp8", "delayed", "transformer_engine")
    assert r.name == "fp8-delayed+te"
    assert parse_recipe_name("bf16-mixed+compile").name == "amp-bf16+compile"  # knobs still apply


@pytest.mark.parametrize("name", ["bf16-true", "16-true", "64-true", "transformer-engine-float16"])
def test_lightning_precisions_with_no_overdrive_recipe_are_refused_with_the_alternative(name):
    with pytest.raises(ValueError, match="use ") as e:
        parse_recipe_name(name)
    assert "Lightning" in str(e.value) and "\n" not in str(e.value)


def test_resolve_and_report_say_the_overdrive_name_that_ran():
    res = resolve("bf16-mixed", CPU)
    d = next(d for d in res.decisions if d.field == "recipe")
    assert d.requested == "bf16-mixed" and d.chosen == "amp-bf16" and "Lightning" in d.reason and not d.fallback
    acc = overdrive.accelerate(nn.Linear(4, 4), "bf16-mixed", env=CPU)
    assert acc.resolved.recipe.name == "amp-bf16"
    assert "recipe 'amp-bf16'" in acc.report() and "Lightning's precision 'bf16-mixed' is Overdrive's amp-bf16" in \
        acc.report()
    assert not any(d.field == "recipe" for d in resolve("amp-bf16", CPU).decisions)  # our own name: no note
    assert set(ECOSYSTEM) >= {"bf16-mixed", "16-mixed", "32-true", "transformer-engine"}


def test_gradient_accumulation_steps_is_grad_accum_steps():
    acc = overdrive.accelerate(nn.Linear(4, 4), "fp32", env=CPU, gradient_accumulation_steps=3)
    assert acc.grad_accum_steps == 3 and acc.to_dict()["grad_accum_steps"] == 3
    x = torch.randn(2, 4)
    steps = []
    for _ in range(6):
        acc.backward(acc.model(x).sum())
        steps.append(acc.step()["stepped"])
    assert steps == [False, False, True] * 2
    with pytest.raises(UserError, match="same setting"):
        overdrive.accelerate(nn.Linear(4, 4), "fp32", env=CPU, grad_accum_steps=2, gradient_accumulation_steps=3)


def test_train_config_takes_gradient_accumulation_steps_under_overdrives_name(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text("[train]\nglobal_batch = 16\ngradient_accumulation_steps = 4\nrecipe = \"bf16-mixed\"\n")
    cfg = load_config(str(p))
    assert cfg.train.grad_accum_steps == 4 and "gradient_accumulation_steps" not in cfg.to_dict()["train"]
    assert load_config(None, ["train.grad_accum_steps=2"]).train.grad_accum_steps == 2
    with pytest.raises(ConfigError, match="same setting"):
        load_config(str(p), ["train.grad_accum_steps=2"])
    with pytest.raises(ConfigError, match="keep one"):
        load_config(None, ["train.gradient_accumulation_steps=2", "train.micro_batch=4"])
    with pytest.raises(ConfigError, match=">= 1"):
        load_config(None, ["train.gradient_accumulation_steps=0"])
    with pytest.raises(ConfigError, match="transformer-engine"):
        load_config(None, ["train.recipe=transformer-engine-float16"])
