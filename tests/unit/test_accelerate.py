"""accelerate(): numerics against a float64 reference, training under every CPU recipe, state_dicts."""

import copy
import importlib.util
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import overdrive
from fakes import TORCHAO_EMU, machine
from overdrive.env import build_report
from overdrive.models import GPT, gpt_config

# Only the FP8 tests need torchao (its emulation); fp32/bf16/fp16 numerics run without it.
needs_torchao = pytest.mark.skipif(importlib.util.find_spec("torchao") is None, reason="torchao not installed")
CPU = build_report(machine(None, torchao=TORCHAO_EMU))  # this CPU, minus the probing time


def _ao(*names):
    """FP8 cases need torchao's emulation; the others run without it."""
    return [pytest.param(n, marks=needs_torchao) if "fp8" in n else n for n in names]


class OddNet(nn.Module):
    """Odd shapes everywhere except where FP8 needs multiples of 16."""

    def __init__(self, d_in=48, d_hid=80, d_out=32, fp8_friendly=True):
        super().__init__()
        if not fp8_friendly:
            d_in, d_hid, d_out = 37, 53, 29
        self.fc1 = nn.Linear(d_in, d_hid)
        self.norm = nn.LayerNorm(d_hid)
        self.fc2 = nn.Linear(d_hid, d_hid)
        self.rms = nn.RMSNorm(d_hid, eps=1e-6)
        self.out = nn.Linear(d_hid, d_out)

    def forward(self, x):
        x = F.gelu(self.fc1(x))
        x = x + self.fc2(self.norm(x))
        return self.out(self.rms(x))


def rel_err(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def sqnr_db(approx, ref):
    return 20 * math.log10(ref.double().norm().item() / (approx.double() - ref.double()).norm().item())


def _run(model, x, w, acc=None):
    ctx = acc.autocast() if acc else torch.autocast("cpu", enabled=False)
    with ctx:
        y = model(x)
    (y.double() * w).sum().backward()
    return y.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters()}


# (recipe, forward tolerance, gradient tolerance) as relative L2 error vs float64.
# bf16 keeps 8 mantissa bits (2^-8 = 0.4% per rounding), fp16 11 bits; errors accumulate over K.
TOLERANCES = [("fp32", 1e-5, 1e-5), ("amp-bf16", 3e-2, 5e-2), ("amp-fp16", 4e-3, 8e-3)]


@pytest.mark.parametrize("fp8_friendly", [True, False])
@pytest.mark.parametrize("recipe,tol_y,tol_g", TOLERANCES)
def test_precision_matches_float64_reference(recipe, tol_y, tol_g, fp8_friendly):
    torch.manual_seed(1234)
    base = OddNet(fp8_friendly=fp8_friendly)
    x = torch.randn(3, 7, base.fc1.in_features)
    w = torch.randn(3, 7, base.out.out_features, dtype=torch.float64)
    y_ref, g_ref = _run(copy.deepcopy(base).double(), x.double(), w)
    acc = overdrive.accelerate(copy.deepcopy(base), recipe, env=CPU, build_optimizer=False)
    y, g = _run(acc.model, x, w, acc)
    assert rel_err(y, y_ref) < tol_y
    for n in g_ref:
        assert rel_err(g[n], g_ref[n]) < tol_g, n


@needs_torchao
@pytest.mark.parametrize("recipe", ["fp8", "fp8-rowwise"])
def test_fp8_emulated_sqnr(recipe):
    torch.manual_seed(7)
    base = OddNet()
    x = torch.randn(4, 16, 48) * 3.0  # activations of realistic scale, not unit-norm toys
    w = torch.randn(4, 16, 32, dtype=torch.float64)
    ref = copy.deepcopy(base).double()
    y_ref, g_ref = _run(ref, x.double(), w)
    acc = overdrive.accelerate(copy.deepcopy(base), recipe, env=CPU, build_optimizer=False,
                               module_filter_fn=lambda m, fqn: True)  # head included: all three linears
    assert acc.resolved.emulated
    assert sum(d.converted for d in acc.conversions["fp8"]) == 3
    y, g = _run(acc.model, x, w, acc)
    assert sqnr_db(y, y_ref) >= 20
    for n in ("fc1.weight", "fc2.weight", "out.weight"):
        assert sqnr_db(g[n], g_ref[n]) >= 20, n


@needs_torchao
def test_fp8_layer_filter_reports_each_skip():
    acc = overdrive.accelerate(OddNet(fp8_friendly=False), "fp8", env=CPU, build_optimizer=False)
    decs = {d.fqn: d for d in acc.conversions["fp8"]}
    assert not any(d.converted for d in decs.values())
    assert "not divisible by 16" in decs["fc1"].reason
    gpt = GPT(gpt_config("tiny"))
    acc = overdrive.accelerate(gpt, "fp8", env=CPU, build_optimizer=False)
    decs = {d.fqn: d for d in acc.conversions["fp8"]}
    assert not decs["lm_head"].converted and "output head" in decs["lm_head"].reason
    assert decs["blocks.0.mlp.fc"].converted
    rep = acc.report()
    assert "skipped lm_head: output head stays in high precision" in rep
    assert "emulated" in rep and "not faster" in rep


def _train(recipe, steps=8, env=CPU, **kw):
    torch.manual_seed(0)
    model = GPT(gpt_config("tiny", n_embd=32, n_head=2, block_size=32))
    acc = overdrive.accelerate(model, recipe, env=env, lr=3e-3, **kw)
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (4, 32), generator=gen)
    losses = []
    for _ in range(steps):
        with acc.autocast():
            _, loss = acc.model(x[:, :-1], x[:, 1:])
        acc.backward(loss)
        acc.step()
        losses.append(loss.item())
    return acc, losses


@pytest.mark.parametrize("recipe", _ao("auto", "fp32", "amp-bf16", "amp-fp16", "fp8", "fp8-rowwise", "mxfp8"))
def test_every_cpu_recipe_lowers_the_loss(recipe):
    acc, losses = _train(recipe)
    assert losses[-1] < losses[0] - 0.3, losses
    assert all(math.isfinite(v) for v in losses)


@pytest.mark.parametrize("ac", ["selective", "full"])
def test_activation_checkpointing_same_gradients(ac):
    _, plain = _train("fp32", steps=3)
    acc, ckpt = _train(overdrive.Recipe(precision="fp32", activation_checkpointing=ac), steps=3)
    assert acc.checkpointed == (["blocks.0"] if ac == "selective" else ["blocks.0", "blocks.1"])
    assert ckpt == pytest.approx(plain, rel=1e-5)


def test_fp16_scaler_skips_injected_inf_and_recovers():
    torch.manual_seed(0)
    model = GPT(gpt_config("tiny", n_embd=32, n_head=2, block_size=32))
    acc = overdrive.accelerate(model, "amp-fp16", env=CPU, lr=3e-3)
    assert acc.scaler is not None
    x = torch.randint(0, 256, (4, 32))
    infos, losses = [], []
    for step in range(6):
        with acc.autocast():
            _, loss = acc.model(x[:, :-1], x[:, 1:])
        acc.backward(loss)
        if step == 2:
            model.blocks[0].mlp.fc.weight.grad[0, 0] = float("inf")  # an overflow in the backward pass
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        info = acc.step()
        infos.append(info)
        losses.append(loss.item())
        if step == 2:
            assert info["skipped"]
            assert all(torch.equal(before[n], p) for n, p in model.named_parameters())
    assert [i["skipped"] for i in infos] == [False, False, True, False, False, False]
    assert infos[2]["scale"] < infos[1]["scale"]
    assert losses[-1] < losses[0] and acc.skipped_steps == 1


@pytest.mark.parametrize("recipe", _ao("fp32", "fp8", "amp-fp16"))
def test_state_dict_interchangeable_both_ways(recipe):
    torch.manual_seed(0)
    original = GPT(gpt_config("tiny"))
    sd0 = {k: v.clone() for k, v in original.state_dict().items()}
    recipe_ac = overdrive.Recipe(precision=overdrive.PRESETS[recipe].precision, activation_checkpointing="full")
    acc = overdrive.accelerate(copy.deepcopy(original), recipe_ac, env=CPU)
    sd1 = acc.model.state_dict()
    assert sd1.keys() == sd0.keys()
    assert all(torch.equal(sd0[k], sd1[k]) for k in sd0)
    # train a step, then load the accelerated weights into a plain model and back
    x = torch.randint(0, 256, (2, 16))
    with acc.autocast():
        _, loss = acc.model(x[:, :-1], x[:, 1:])
    acc.backward(loss)
    acc.step()
    plain = GPT(gpt_config("tiny"))
    plain.load_state_dict(acc.model.state_dict(), strict=True)
    fresh = overdrive.accelerate(GPT(gpt_config("tiny")), recipe, env=CPU)
    fresh.model.load_state_dict(plain.state_dict(), strict=True)
    assert all(torch.equal(v, fresh.model.state_dict()[k]) for k, v in plain.state_dict().items())
    with torch.no_grad():
        a, _ = plain(x)
        b, _ = fresh.model(x)  # under the recipe's autocast: fp32, fp16, or emulated-FP8 linears
    tol = {"fp8": 5e-2, "amp-fp16": 4e-3}.get(recipe, 1e-5)
    assert rel_err(b, a) < tol


def test_user_model_without_blocks_rejects_checkpointing():
    with pytest.raises(ValueError, match="no repeated blocks"):
        overdrive.accelerate(OddNet(), overdrive.Recipe(activation_checkpointing="full"), env=CPU)
