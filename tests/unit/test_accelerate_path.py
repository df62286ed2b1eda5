"""One path from a recipe to a converted model: accelerate(), Accelerated, bench's and tune's workers all go
through AccelerateOptions and resolve_for_model, so none skips the tuned, shape or checkpointing checks."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from fakes import TE_OK, TORCHAO_B200, TORCHAO_EMU, machine
from overdrive.accelerated import AccelerateOptions, Accelerated, accelerate
from overdrive.env import build_report
from overdrive.errors import UserError
from overdrive.recipes import get_recipe, resolve

CPU = build_report(machine(None, torchao=TORCHAO_EMU))


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))


def test_the_bench_worker_gets_the_checkpointing_check(monkeypatch):
    """GPTTask builds its teacher and student through accelerate(): a recipe the parent resolved to Transformer
    Engine's FP8 is resolved again for a model whose own gradient checkpointing is on (TE's FP8 conflicts with
    recomputed blocks), as accelerate(model, "fp8") would have been."""
    import overdrive.convert.for_model as for_model
    from overdrive.bench.task import PROGRAM
    from overdrive.measure.worker import LocalConn

    asked = []
    monkeypatch.setattr(for_model, "hf_checkpointing_on", lambda m: asked.append(type(m).__name__) or True)
    parent = resolve(get_recipe("fp8"), build_report(machine("h100", te=TE_OK, torchao=TORCHAO_B200)))
    assert parent.fp8_backend == "transformer_engine"
    spec = dict(task="gpt", teacher="tiny", student="tiny", batch=2, seq=16, data_tokens=1 << 12, data=None, seed=0,
                lr=1e-3, threads=1, env_facts=CPU.facts, options={}, parity_steps=2,
                resolved=dataclasses.replace(parent, device="cpu").to_dict(), cand_options={}, inject={})
    conn = LocalConn(PROGRAM)
    conn.send(("setup", spec))
    reply = conn.recv()
    assert "error" not in reply, reply
    assert asked == ["GPT", "GPT"]
    assert all(a["fp8_backend"] != "transformer_engine" for a in reply["applied"].values()), reply["applied"]


def test_a_resolved_recipe_is_kept_when_nothing_conflicts(monkeypatch):
    """What a parent resolved (here as on an FP8 GPU) runs as resolved: the worker does not decide again."""
    import overdrive.convert.for_model as for_model

    monkeypatch.setattr(for_model, "resolve", lambda *a, **k: pytest.fail("resolved again"))
    res = dataclasses.replace(resolve(get_recipe("amp-bf16"), CPU), device="cpu")
    acc = accelerate(_net(), res, env=CPU, build_optimizer=False)
    assert acc.resolved.precision == res.precision and acc.optimizer is None


def test_a_tuned_recipe_s_shapes_filter_layers_whoever_calls(monkeypatch):
    """The measured FP8 shapes of a recipe become the layer filter for accelerate() and Accelerated alike."""
    import overdrive.convert.for_model as for_model

    seen = []
    real = for_model._shape_filter
    monkeypatch.setattr(for_model, "_shape_filter", lambda s, h: seen.append(s) or real(s, h))
    rec = get_recipe("fp8").replace(fp8_backend="emulated", fp8_shapes="16x32")
    accelerate(_net(), rec, env=CPU, build_optimizer=False)
    Accelerated(_net(), rec, AccelerateOptions(env=CPU, build_optimizer=False))
    assert seen == ["16x32", "16x32"]


def test_options_are_one_frozen_record_checked_once():
    with pytest.raises(TypeError, match="unexpected keyword argument 'lrr'.*grad_accum_steps"):
        accelerate(_net(), "fp32", lrr=1e-3)
    with pytest.raises(UserError, match="the same setting"):
        AccelerateOptions(grad_accum_steps=2, gradient_accumulation_steps=4)
    assert AccelerateOptions(gradient_accumulation_steps=4).grad_accum_steps == 4
    with pytest.raises(UserError, match="distributed='zero'"):
        AccelerateOptions(distributed="zero")
    with pytest.raises(dataclasses.FrozenInstanceError):
        AccelerateOptions().lr = 1.0  # type: ignore[misc]
    acc = accelerate(_net(), "fp32", env=CPU, lr=1e-2, grad_accum_steps=2)
    assert acc.options == AccelerateOptions(env=CPU, lr=1e-2, grad_accum_steps=2) and acc.grad_accum_steps == 2
