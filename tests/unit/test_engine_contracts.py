"""The fake engines hold the real ones' contracts, and the GPU paths they guard hold them too.

Signatures: the fakes against the installed torchao 0.18 / liger-kernel 0.8.5, and against tests/te_api.py
(Transformer Engine's API per release, parsed from its source). Each GPU-path fix is tested through a fake
that asserts what the real kernel asserts, so the test fails where the GPU would have crashed."""

import dataclasses
import inspect
import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fakes import (TE_FAKE_VERSIONS, TE_OK, TORCHAO_EMU, fake_liger_norms, fake_mxfp8_mm, fake_nvfp4_linear, fake_te,
                   machine)
from groups import one_rank_group
from te_api import TE_API
from overdrive.env import build_report
from overdrive.recipes import resolve

torchao = pytest.importorskip("torchao")
AO_GPU = dict(TORCHAO_EMU, fp8_ok=True)


def _names(fn) -> tuple[str, ...]:
    out = []
    for p in inspect.signature(fn).parameters.values():
        out.append({p.VAR_POSITIONAL: "*", p.VAR_KEYWORD: "**"}.get(p.kind, "") + p.name)
    return tuple(out)


def _kinds(fn) -> list[tuple[str, object, object]]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


def _install(monkeypatch, mods: dict) -> None:
    for name, mod in mods.items():
        monkeypatch.setitem(sys.modules, name, mod)


# -- signatures ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("version", TE_FAKE_VERSIONS)
def test_te_fakes_have_the_signatures_of_their_release(version):
    mods, _ = fake_te(version)
    te, rec = mods["transformer_engine.pytorch"], mods["transformer_engine.common.recipe"]
    api = TE_API[version.rsplit(".", 1)[0]]
    assert _names(te.Linear.__init__) == api["linear_init"]
    assert _names(te.Linear.forward) == api["linear_forward"]
    assert _names(te.fp8_autocast) == api["fp8_autocast"]
    assert (_names(te.autocast) if hasattr(te, "autocast") else None) == api["autocast"]
    for norm in (te.LayerNorm, te.RMSNorm):
        assert _names(norm.__init__) == api["norm_init"]
    for cls in ("DelayedScaling", "Float8CurrentScaling", "MXFP8BlockScaling", "NVFP4BlockScaling", "Format"):
        assert cls in api["recipes"] and hasattr(rec, cls)
    # TE's @no_torch_dynamo(): torch._dynamo.disable on forward in every 2.x release.
    assert te.Linear.forward._torchdynamo_disable
    assert all(v["lines"]["linear.py"][1] + 1 == v["lines"]["linear.py"][2] for v in TE_API.values())


def test_te_api_table_records_when_autocast_and_recipes_arrived():
    assert [v for v, a in TE_API.items() if a["autocast"] is not None][0] == "2.9"  # te.autocast: 2.9 on
    assert [v for v, a in TE_API.items() if "Float8CurrentScaling" in a["recipes"]][0] == "2.2"
    assert [v for v, a in TE_API.items() if "NVFP4BlockScaling" in a["recipes"]][0] == "2.8"
    from overdrive.convert.fp8 import TE_RECIPE_SINCE

    assert TE_RECIPE_SINCE["tensorwise"] == (2, 2) and TE_RECIPE_SINCE["nvfp4"] == (2, 8)


def test_torchao_fakes_have_the_installed_signatures():
    from torchao.prototype.moe_training import mxfp8_linear
    from torchao.prototype.moe_training.nvfp4_training import nvfp4_training

    assert _kinds(fake_mxfp8_mm()) == _kinds(mxfp8_linear._to_mxfp8_then_scaled_mm)
    assert _kinds(fake_nvfp4_linear()) == _kinds(nvfp4_training.nvfp4_linear)


def test_liger_fakes_have_the_installed_signatures():
    liger = pytest.importorskip("liger_kernel.transformers")
    rms, ln = fake_liger_norms()
    assert _kinds(rms.__init__) == _kinds(liger.LigerRMSNorm.__init__)
    assert _kinds(ln.__init__) == _kinds(liger.LigerLayerNorm.__init__)
    assert _names(rms.forward) == _names(liger.LigerRMSNorm.forward)


def test_no_fake_takes_keywords_its_engine_does_not():
    mods, _ = fake_te()
    te = mods["transformer_engine.pytorch"]
    rms, ln = fake_liger_norms()
    for fn in (te.Linear.__init__, te.Linear.forward, te.autocast, te.fp8_autocast, rms.__init__, ln.__init__,
               fake_mxfp8_mm(), fake_nvfp4_linear()):
        assert not any(n.startswith("**") for n in _names(fn)), fn
    # te.LayerNorm/RMSNorm take **kwargs as TE's do (passed to its ops: device, dtype) and nothing else.
    with pytest.raises(TypeError, match="unexpected keyword"):
        te.LayerNorm(8, devices="cpu")
    with pytest.raises(TypeError):
        te.Linear(8, 8, device="cpu", activation_dtype=torch.bfloat16)


def test_fake_te_linear_asserts_what_te_asserts():
    mods, state = fake_te()
    te, rec = mods["transformer_engine.pytorch"], mods["transformer_engine.common.recipe"]
    lin = te.Linear(32, 32, device="cpu")
    nn.init.normal_(lin.weight)
    lin(torch.randn(3, 5, 32))  # outside the autocast: high precision, any token count
    with te.autocast(recipe=rec.Float8CurrentScaling()):
        lin(torch.randn(2, 4, 32))
        with pytest.raises(AssertionError, match="divisible by 8"):
            lin(torch.randn(3, 5, 32))
    with te.autocast(recipe=rec.MXFP8BlockScaling()), pytest.raises(RuntimeError, match="divisible by 32"):
        lin(torch.randn(2, 8, 32))
    assert [c["fp8"] for c in state["calls"]] == [False, True]


# -- the fixes, each through the fake that would have caught it -------------------------------------
def test_torchao_mxfp8_runs_fp32_weights_in_bf16(monkeypatch):
    """Item 1: MXFP8Linear.forward hands triton_to_mxfp8_dim0 its fp32 weight (asserts bf16)."""
    from torchao.prototype.moe_training import mxfp8_linear

    from overdrive.convert.mx import mx_factory

    calls = []
    monkeypatch.setattr(mxfp8_linear, "_to_mxfp8_then_scaled_mm", fake_mxfp8_mm(calls))
    torch.manual_seed(0)
    lin = nn.Linear(64, 96)
    x = torch.randn(2, 31, 64, requires_grad=True)  # 62 tokens: padded to 64
    ref = F.linear(x, lin.weight, lin.bias)
    with pytest.raises(AssertionError, match="only bfloat16"):  # what torchao's own module does with fp32
        mxfp8_linear.MXFP8Linear(64, 96)(x.detach()[:, :32].contiguous().reshape(-1, 64))
    new = mx_factory("mxfp8", "torchao")(lin, "fc")
    assert new.weight is lin.weight and new.weight.dtype == torch.float32
    y = new(x)
    assert calls[-1] == ((64, 64), torch.bfloat16, torch.bfloat16) and y.shape == ref.shape
    sqnr = 20 * torch.log10(ref.norm() / (ref - y.float()).norm())
    assert sqnr > 18, sqnr  # MXFP8 (E4M3, 32-blocks) accuracy: torchao's own bar
    y.float().sum().backward()
    assert lin.weight.grad is not None and lin.weight.grad.dtype == torch.float32 and x.grad.shape == x.shape


def test_torchao_nvfp4_pads_the_sequence_to_128(monkeypatch):
    """Item 6: nvfp4_mm_triton takes M = input.shape[-2] (the sequence) and raises unless M % 128."""
    from torchao.prototype.moe_training.nvfp4_training import nvfp4_training

    from overdrive.convert.mx import mx_factory

    calls = []
    monkeypatch.setattr(nvfp4_training, "nvfp4_linear", fake_nvfp4_linear(calls))
    torch.manual_seed(0)
    lin = nn.Linear(128, 128, bias=False)
    x = torch.randn(2, 40, 128)
    with pytest.raises(ValueError, match="divisible by 128"):
        nvfp4_training.NVFP4Linear.from_linear(lin)(x)  # torchao's own module on a 40-token sequence
    y = mx_factory("nvfp4", "torchao")(lin, "fc")(x)
    assert calls[-1] == (128, 128) and y.shape == (2, 40, 128)  # 80 tokens flattened, padded to 128
    ref = F.linear(x, lin.weight)
    assert 20 * torch.log10(ref.norm() / (ref - y.float()).norm()) > 8  # NVFP4 (E2M1) accuracy


@pytest.mark.parametrize("scaling,recipe_cls,tokens", [("tensorwise", "Float8CurrentScaling", (3, 5)),
                                                       ("mxfp8", "MXFP8BlockScaling", (2, 31))])
def test_te_linears_pad_tokens_for_their_recipe(monkeypatch, scaling, recipe_cls, tokens):
    """Item 5: TE needs M % 16 (per-tensor FP8: its wgrad GEMM; the forward asserts only % 8) and M % 32 (MXFP8)."""
    from overdrive.convert import convert_fp8

    mods, state = fake_te()
    _install(monkeypatch, mods)
    te, rec = mods["transformer_engine.pytorch"], mods["transformer_engine.common.recipe"]
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 64))
    x = torch.randn(*tokens, 64)
    ref = m(x)
    decs = convert_fp8(m, backend="transformer_engine", scaling=scaling, min_dim=16)
    assert all(d.converted for d in decs) and isinstance(m[0], te.Linear)
    with te.autocast(recipe=getattr(rec, recipe_cls)()):
        y = m(x)
    assert [c["fp8"] for c in state["calls"]] == [True, True]
    assert torch.allclose(y, ref, atol=1e-5)  # the fake computes in fp32: padding changed nothing


def test_te_fp8_filter_times_inside_te_autocast(monkeypatch):
    """Item 2: bench_linear timed TE layers under torch.autocast only, so TE ran them in bf16."""
    from overdrive.tuning.fp8_filter import bench_linear

    mods, state = fake_te()
    _install(monkeypatch, mods)
    ms = bench_linear(32, 32, 32, True, backend="transformer_engine", scaling="tensorwise", compile=False,
                      device="cpu", reps=1)
    assert ms > 0 and state["calls"] and all(c["fp8"] for c in state["calls"])
    assert set(state["recipes"]) == {"Float8CurrentScaling"}


def test_te_is_not_chosen_when_the_model_checkpoints_itself(monkeypatch):
    """Item 7: HF gradient checkpointing recomputes outside TE's FP8 autocast, as the recipe's would."""
    from overdrive.convert import apply_recipe

    e = build_report(machine("h100", te=TE_OK, torchao=AO_GPU))
    assert resolve("fp8", e).fp8_backend == "transformer_engine"
    res = resolve("fp8", e, model_checkpointing=True)
    assert res.fp8_backend == "torchao"
    assert any("own gradient checkpointing" in d.reason for d in res.decisions if d.field == "fp8")

    class HFish(nn.Module):
        is_gradient_checkpointing = True  # what transformers' PreTrainedModel reports after enable()

        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(32, 32)

    model = HFish()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    te_res = dataclasses.replace(resolve("fp8", e), device="cpu")
    with pytest.raises(ValueError, match="gradient_checkpointing_disable"):
        apply_recipe(model, te_res)
    assert type(model.fc) is nn.Linear and all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_fp8_under_compile_prefers_torchao_over_te():
    """Suspected (confirmed): te.Linear.forward is torch._dynamo.disable'd in every TE 2.x."""
    e = build_report(machine("h100", te=TE_OK, torchao=AO_GPU))
    res = resolve("fp8+compile", e)
    assert res.fp8_backend == "torchao" and res.compile == "default"
    assert any("graph at every TE linear" in d.reason for d in res.decisions if d.field == "fp8")
    only_te = resolve("fp8+compile", build_report(machine("h100", te=TE_OK)))
    assert only_te.fp8_backend == "transformer_engine"
    assert any("graph at every TE linear" in d.reason for d in only_te.decisions if d.field == "fp8")


def test_fp16_under_fsdp_keeps_autocast_bf16_does_not():
    """Suspected (confirmed): fp16 under FSDP2 ran softmax, norms and the loss in fp16 itself."""
    from overdrive.convert import Applied

    cpu = build_report(machine(None, torchao=TORCHAO_EMU))
    fp16 = Applied(model=nn.Linear(2, 2), resolved=resolve("amp-fp16", cpu), fsdp=True, world=2)
    bf16 = Applied(model=nn.Linear(2, 2), resolved=resolve("amp-bf16", cpu), fsdp=True, world=2)
    assert fp16.autocast_dtype == torch.float16 and bf16.autocast_dtype is None


def test_a_model_with_no_fp8_layer_is_labelled_by_what_runs():
    """Suspected (confirmed): below fp8_min_dim nothing converts, yet the recipe said FP8 (and its peak)."""
    from overdrive.convert import apply_recipe
    from overdrive.models import GPT, gpt_config

    e = build_report(machine("h100", torchao=AO_GPU))
    res = dataclasses.replace(resolve("fp8", e), device="cpu")
    assert res.precision == "fp8" and res.fp8_min_dim > 768
    applied = apply_recipe(GPT(gpt_config("tiny", n_embd=64, n_head=2)), res)
    assert applied.resolved.precision == "bf16" and applied.resolved.fp8_backend is None
    assert not applied.fp8_all_gather and applied._te_recipe is None


def test_fp8_gemm_micro_benchmark_uses_fast_accumulation(monkeypatch):
    """Suspected (confirmed): torch._scaled_mm defaults to use_fast_accum=False; torchao's forward uses True."""
    from overdrive.bench import micro

    seen = {}
    monkeypatch.setattr(torch, "_scaled_mm", lambda *a, **kw: seen.update(kw))
    out = micro._gemm(build_report(machine("h100")), 32, 32, 32, "cpu")
    out["fp8"][0]()
    assert seen["use_fast_accum"] is True


@pytest.mark.slow  # ~5 s: a real FSDP2 training run on one gloo rank
def test_fsdp_gradient_accumulation_syncs_on_the_last_micro_batch(tmp_path, monkeypatch):
    """Suspected (confirmed): the trainer reduce-scattered after every micro-batch."""
    from torch.distributed.fsdp import FSDPModule

    from overdrive.train import load_config, trainer

    flags = []
    real = FSDPModule.set_requires_gradient_sync
    monkeypatch.setattr(FSDPModule, "set_requires_gradient_sync",
                        lambda self, flag, *, recurse=True: (flags.append(flag), real(self, flag, recurse=recurse)))
    monkeypatch.setenv("MASTER_ADDR", "localhost")
    monkeypatch.setattr(trainer, "get_env", lambda: build_report(machine(None, torchao=TORCHAO_EMU)))
    cfg = load_config(None, ["data.builtin_tokens=20000", "train.seq_len=16", "train.global_batch=4",
                             "train.micro_batch=2", "train.log_every=1", "train.eval_every=0", "train.steps=2",
                             "train.checkpoint_every=0", "model.n_embd=32", "model.n_head=2", "model.n_layer=2",
                             'train.fsdp="on"', f'train.out_dir="{tmp_path}/run"', 'train.recipe="fp32"'])
    with one_rank_group(tmp_path):
        trainer.train(cfg, quiet=True)
    assert flags == [False, True, False, True]


def test_bench_measures_each_model_against_the_peak_of_what_it_ran():
    """Suspected (confirmed): the gpt-125m student (d=768 < fp8_min_dim 1024) converts no layer, yet was
    measured against the FP8 peak; the worker now reports what the applier ran, per model."""
    from overdrive.bench.analysis import analyze
    from overdrive.bench.runner import ConfigRun
    from overdrive.bench.suites import SUITES, Candidate

    e = build_report(machine("h100", torchao=AO_GPU))
    suite = SUITES["gpu"]
    fp8 = resolve("fp8", e)
    runs = []
    for cand, res, applied in ((Candidate.preset("fp32-fused"), resolve("fp32-fused", e), None),
                               (Candidate.preset("fp8"), fp8, {"teacher": fp8.to_dict(),
                                                               "student": dict(fp8.to_dict(), precision="bf16")})):
        cand = dataclasses.replace(cand, baseline=applied is None)
        run = ConfigRun(cand=cand, resolved=res.to_dict(), applied=applied, status="ok")
        for r in run.roles:
            run.ms[r], run.loss[r], run.skipped[r] = [100.0] * 8, [5.0] * 8, [False] * 8
        run.rounds_ms = [[200.0] * 4, [200.0] * 4]
        runs.append(run)
    res = analyze(runs, suite, e)
    models = next(c for c in res["configs"] if c["name"] == "fp8")["models"]
    assert models["teacher"]["precision"] == "fp8" and models["teacher"]["mfu_fp8_peak"] is not None
    assert models["student"]["precision"] == "bf16" and models["student"]["mfu_fp8_peak"] is None
    assert models["student"]["mfu_bf16_peak"] is not None


def test_nvfp4_runs_report_mfu_against_the_fp4_peak():
    """NVFP4 ran on the FP4 tensor cores yet was measured against the bf16 peak only (the catalog's fp4_tflops
    was read by the planner, never by the bench); now it also reports MFU against the FP4 peak, in JSON and CSV."""
    from overdrive.bench.analysis import analyze
    from overdrive.bench.flops import mfu
    from overdrive.bench.results import csv_rows
    from overdrive.bench.runner import ConfigRun
    from overdrive.bench.suites import SUITES, Candidate

    from fakes import TE_B200, TORCHAO_B200

    e = build_report(machine("b200", te=TE_B200, torchao=TORCHAO_B200))
    suite = SUITES["gpu"]
    runs = []
    for name, res in (("fp32-fused", resolve("fp32-fused", e)), ("nvfp4", resolve("nvfp4", e))):
        run = ConfigRun(cand=dataclasses.replace(Candidate.preset(name), baseline=name == "fp32-fused"),
                        resolved=res.to_dict(), applied=None, status="ok")
        for r in run.roles:
            run.ms[r], run.loss[r], run.skipped[r] = [100.0] * 8, [5.0] * 8, [False] * 8
        run.rounds_ms = [[200.0] * 4, [200.0] * 4]
        runs.append(run)
    assert runs[1].resolved["precision"] == "fp4"
    out = analyze(runs, suite, e)
    cfg = next(c for c in out["configs"] if c["name"] == "nvfp4")
    peak = e.gpus[0].spec.fp4_tflops
    for m in cfg["models"].values():
        assert m["mfu_fp4_peak"] == pytest.approx(mfu(m["tokens_per_s"], m["flops_per_token"], peak))
        assert m["mfu_fp4_peak"] < m["mfu_bf16_peak"] and m["mfu_fp8_peak"] is None
    assert all(r["mfu_fp4_peak"] is not None for r in csv_rows(out) if r["config"] == "nvfp4")
