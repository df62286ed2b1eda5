"""The format registry: one `Format` per low-precision format, and a new one known everywhere from one entry.

A made-up FP8 variant is registered by one `FORMATS` entry (the fixture below, nothing else), and then
resolve, the module swap (on the Transformer Engine fake, which enforces the rules the entry names), the
labels, the quality judge and the planner all know it. Every registered format has one SQNR row.
"""

import dataclasses
import math
import sys

import pytest
import torch
from torch import nn

from fakes import TE_OK, TORCHAO_EMU, fake_te, machine
from overdrive.env import build_report
from overdrive.formats import FORMATS, SHAPE_RULES, TE, Engine, Format, find_format, get_format, loss_tolerance

MADE_UP = Format(name="fp8-test", preset="fp8-test", aliases=("fp8t",), bits="fp8", scaling="test", kind="fp8",
                 label="FP8", engines=(Engine(backend=TE, converter="te", rules=SHAPE_RULES["transformer_engine/fp8"],
                                              api="Float8CurrentScaling", since=(2, 2)),),
                 loss_tolerance=0.07, plan_bytes=1.05, description="a made-up FP8 variant, for tests")


@pytest.fixture
def made_up(monkeypatch):
    """The one registry entry a new format needs."""
    monkeypatch.setitem(FORMATS, MADE_UP.name, MADE_UP)
    return MADE_UP


def test_every_name_and_spelling_finds_one_format():
    for f in FORMATS.values():
        for name in (f.name, f.preset, f.scaling, *f.aliases):
            assert find_format(name) is f and find_format(name.upper()) is f
    assert get_format("fp8-tensorwise").preset == "fp8" and get_format("rowwise").name == "fp8-rowwise"
    with pytest.raises(ValueError, match="formats are fp8-tensorwise, fp8-rowwise"):
        get_format("fp9")


def test_one_vocabulary_in_recipes_and_plan():
    from overdrive.plan import TrainSetup
    from overdrive.plan.runnable import how_to_run
    from overdrive.recipes import Recipe, get_recipe

    for f in FORMATS.values():
        r = get_recipe(f.name)
        assert (r.name, r.precision, r.fp8_scaling) == (f.preset, f.bits, f.scaling)
        assert Recipe(precision=f.name) == r.replace(name=r.name) and Recipe(precision=f.bits, fp8_scaling=f.name) == r
        if f.plan_bytes is not None:
            eager = {"compile": False, "fused_kernels": True} if f.te_eager_only else {}   # TE delayed scaling
            assert TrainSetup(gpu=_gpu(), precision=f.name, **eager).precision == f.preset
            assert how_to_run({"precision": f.name, "compile": False})["recipe"] == f.preset
    assert get_recipe("fp8-rowwise").fp8_scaling == "rowwise"  # the old spellings stay aliases
    with pytest.raises(ValueError, match="names the format"):
        Recipe(precision="mxfp8", fp8_scaling="nvfp4")


def test_loss_tolerance_has_no_silent_default():
    assert loss_tolerance("fp32") == 0.01 and loss_tolerance("mxfp8") == 0.05 and loss_tolerance("nvfp4") == 0.10
    assert loss_tolerance("fp8") == 0.05 and loss_tolerance("fp4") == 0.10
    with pytest.raises(ValueError, match="no loss tolerance for precision 'fp9'"):
        loss_tolerance("fp9")


def _gpu():
    from overdrive.env import gpu_by_key

    return gpu_by_key("h100-sxm")


def _h100():
    return build_report(machine("h100", te=TE_OK, torchao=TORCHAO_EMU))


def test_a_made_up_format_resolves_and_labels_from_its_one_entry(made_up):
    from overdrive.recipes import get_recipe, resolve
    from overdrive.recipes.labels import ran_label, what_runs

    res = resolve("fp8-test", _h100())
    assert (res.fp8_backend, res.fp8_scaling, res.precision) == ("transformer_engine", "test", "fp8")
    assert get_recipe("fp8t+compile").name == "fp8-test+compile"  # its alias, in the recipe grammar
    assert what_runs(res) == "fp8 (transformer_engine, test)" and ran_label("fp8-test", res, _h100()) == "fp8-test"
    # Its version gate is its own: a Transformer Engine older than `since` does not run it.
    old = resolve("fp8-test", build_report(machine("h100", te=dict(TE_OK, version="2.1.0"), torchao=TORCHAO_EMU)))
    assert old.fp8_backend is None and "Transformer Engine 2.1.0 predates FP8 (Float8CurrentScaling first in 2.2)" \
        in old.fallbacks[0].reason
    # Its engine list is all it has: without Transformer Engine it falls to the best precision, said so.
    cpu = resolve("fp8-test", build_report(machine(None, torchao=TORCHAO_EMU)))
    assert cpu.fp8_backend is None and cpu.fallbacks[0].chosen.startswith("none")
    assert "has no emulation" in cpu.fallbacks[0].reason


def test_a_made_up_format_converts_on_the_te_fake_and_obeys_its_rules(made_up, monkeypatch):
    from overdrive.convert import apply_recipe
    from overdrive.recipes import resolve

    mods, state = fake_te()
    for name, mod in mods.items():
        monkeypatch.setitem(sys.modules, name, mod)
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 64))
    res = resolve("fp8-test+fp8_min_dim=16+fp8-head+norm=torch", _h100())
    res = dataclasses.replace(res, device="cpu", autocast_dtype=None)  # the fake computes on this CPU
    applied = apply_recipe(m, res)
    assert all(d.converted for d in applied.conversions["fp8"])
    x = torch.randn(3, 5, 64, requires_grad=True)  # 15 tokens: padded to the rules' M % 16
    with applied.autocast():
        y = applied.model(x)
    y.float().sum().backward()
    assert set(state["recipes"]) == {"Float8CurrentScaling"} and all(c["fp8"] for c in state["calls"])
    assert x.grad is not None and x.grad.shape == x.shape


def test_a_made_up_format_is_judged_by_its_own_tolerance(made_up):
    from overdrive.measure.quality import judge_curve, tolerance_key

    assert tolerance_key("fp8", "test") == "fp8-test" and tolerance_key("bf16", "tensorwise") == "bf16"
    base = [2.0] * 8
    assert judge_curve([2.12] * 8, base, precision="fp8-test").safe is True     # +6%: within its 7%
    assert judge_curve([2.12] * 8, base, precision="fp8-tensorwise").safe is False  # FP8's 5%
    assert judge_curve([2.16] * 8, base, precision="fp8-test").safe is False


def test_a_made_up_format_is_planned_with_its_bytes(made_up, monkeypatch):
    from overdrive.plan import TrainSetup, estimate, get_model
    from overdrive.plan.search import plan
    from overdrive.formats import planned_format

    m = get_model("llama3-8b")
    assert planned_format("fp8-test") is made_up
    assert sum(made_up.cast_bytes().input) == pytest.approx(6 * 1.05)   # plan_bytes alone: the first count
    one = dataclasses.replace(MADE_UP, name="fp8-test1", preset="fp8-test1", aliases=(), plan_bytes=1.0)
    monkeypatch.setitem(FORMATS, one.name, one)
    ours = estimate(m, TrainSetup(gpu=_gpu(), gpus_per_node=8, sharding="fsdp", seq=2048, precision="fp8-test"))
    ref = estimate(m, TrainSetup(gpu=_gpu(), gpus_per_node=8, sharding="fsdp", seq=2048, precision="fp8-test1"))
    assert ours.step_s > ref.step_s  # 1.05 quantised bytes per element against 1.0: a little slower
    out = plan(m, "h100-sxm", gpus_per_node=8, seq=2048, precisions=["bf16", "fp8-test"])
    assert any(c["precision"] == "fp8-test" for c in out["candidates"])


def test_doctor_and_capabilities_list_every_kind():
    from overdrive.env.machine import gpu_capabilities
    from overdrive.formats import kinds

    caps = gpu_capabilities((10, 0))
    assert all(caps[k] for k in kinds()) and not gpu_capabilities((9, 0))["mxfp8"]
    assert gpu_capabilities((12, 0))["nvfp4"] and not gpu_capabilities((12, 0))["mxfp8"]


# One SQNR row per registered format (dB floors of the emulated linear against fp64: output, dx, dW).
# A format without one fails here: add its row with the floor its numerics reach.
# Per-tensor FP8 sends its gradients in E5M2 (2 mantissa bits): dx reaches ~24.6 dB here.
SQNR_FLOOR = {"fp8-tensorwise": 22.0, "fp8-rowwise": 22.0, "fp8-delayed": 22.0, "mxfp8": 25.0, "nvfp4": 12.0}


@pytest.mark.parametrize("name", list(FORMATS))
def test_sqnr_row_per_format(name):
    pytest.importorskip("torchao")
    from overdrive.convert.fp8 import convert_fp8

    assert set(SQNR_FLOOR) == set(FORMATS), "every format needs one SQNR row"
    fmt = FORMATS[name]
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(0)
        lin = nn.Linear(96, 64)
        ref = nn.Linear(96, 64).double()
        ref.load_state_dict(lin.state_dict())
        m = nn.Sequential(lin)
        (dec,) = convert_fp8(m, backend="emulated", scaling=fmt.name)
        assert dec.converted
        x = torch.randn(4, 23, 96, requires_grad=True)
        x64 = x.detach().double().requires_grad_()
        y, y64 = m(x), ref(x64)
        g = torch.randn_like(y)
        y.backward(g)
        y64.backward(g.double())
        for what, a, r in (("out", y, y64), ("dx", x.grad, x64.grad), ("dw", lin.weight.grad, ref.weight.grad)):
            sqnr = 20 * math.log10(r.detach().norm() / (r.detach() - a.detach().double()).norm())
            assert sqnr >= SQNR_FLOOR[name], f"{name} {what}: {sqnr:.1f} dB"
    finally:
        torch.set_num_threads(n)
