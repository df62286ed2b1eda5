"""Every low-precision path Overdrive drives, at token counts that are not a multiple of anything, forward and
backward, through fakes that enforce the engines' own shape rules (overdrive.convert.shape_rules, each rule
beside its engine source line): a CPU test fails where the GPU would crash.

Before these rules were enforced in backward, Transformer Engine's per-tensor FP8 padded tokens to 8 (its wgrad
GEMM needs 16) and torchao's Float8Linear padded nothing (its wgrad `_scaled_mm` needs 16): 24, 40, 100 and
6 x 42 tokens crashed in loss.backward() on the GPU and passed here."""

import math
import re
import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fakes import enforce, fake_mxfp8_mm, fake_nvfp4_linear, fake_scaled_mm, fake_te
from overdrive.convert import convert_fp8
from overdrive.convert.shape_rules import SHAPE_RULES, dims_multiple, tokens_multiple

pytest.importorskip("torchao")

TOKENS = [(8, 3), (24,), (40,), (100,), (6, 42)]
PATHS = [("transformer_engine", "delayed"), ("transformer_engine", "tensorwise"), ("transformer_engine", "mxfp8"),
         ("transformer_engine", "nvfp4"), ("torchao", "tensorwise"), ("torchao", "rowwise"), ("torchao", "mxfp8"),
         ("torchao", "nvfp4"), ("emulated", "tensorwise"), ("emulated", "mxfp8"), ("emulated", "nvfp4")]
# Per-format accuracy of y and dx against fp32 (SQNR, dB; torchao's float8 tests use SQNR). The TE fake
# computes in fp32, so there padding must change nothing at all.
MIN_SQNR = {"tensorwise": 20, "rowwise": 20, "mxfp8": 18, "nvfp4": 8}


def _sqnr(ref, y) -> float:
    ref, y = ref.detach().float(), y.detach().float()
    return float(20 * torch.log10(ref.norm() / (ref - y).norm()))


def _install(monkeypatch, backend: str, scaling: str) -> dict:
    """The fake engine for (backend, scaling) in place; returns what it records."""
    seen: dict = {"calls": []}
    if backend == "emulated":
        return seen  # numerics only: no engine, no GEMM rule on the tokens
    if backend == "transformer_engine":
        mods, state = fake_te("2.18.0")
        for name, mod in mods.items():
            monkeypatch.setitem(sys.modules, name, mod)
        seen["te"] = state
    elif scaling in ("tensorwise", "rowwise"):
        monkeypatch.setattr(torch, "_scaled_mm", fake_scaled_mm(seen["calls"]))
    elif scaling == "mxfp8":
        from torchao.prototype.moe_training import mxfp8_linear

        monkeypatch.setattr(mxfp8_linear, "_to_mxfp8_then_scaled_mm", fake_mxfp8_mm(seen["calls"]))
    else:
        from torchao.prototype.moe_training.nvfp4_training import nvfp4_training

        monkeypatch.setattr(nvfp4_training, "nvfp4_linear", fake_nvfp4_linear(seen["calls"]))
    return seen


@pytest.mark.parametrize("tokens", TOKENS, ids=lambda t: "x".join(map(str, t)))
@pytest.mark.parametrize("backend,scaling", PATHS, ids=lambda v: v)
def test_odd_token_counts_run_forward_and_backward_on_every_path(monkeypatch, backend, scaling, tokens):
    import contextlib

    from overdrive.convert.fp8 import te_autocast, te_fp8_recipe

    seen = _install(monkeypatch, backend, scaling)
    torch.manual_seed(0)
    d = 128  # every engine's K/N rule (torchao NVFP4: 128)
    model = nn.Sequential(nn.Linear(d, d), nn.GELU(), nn.Linear(d, d))
    x = torch.randn(*tokens, d, requires_grad=True)
    gy = torch.randn(*tokens, d)
    ref = model(x)
    (ref_dx,) = torch.autograd.grad(ref, x, gy)
    decs = convert_fp8(model, backend=backend, scaling=scaling, min_dim=16)
    assert sum(d.converted for d in decs) == 2, [d.reason for d in decs]
    ctx = te_autocast(te_fp8_recipe(scaling)) if backend == "transformer_engine" else contextlib.nullcontext()
    with ctx:
        y = model(x)
    y.backward(gy)  # dgrad and wgrad: where the tokens are the GEMM's reduction dim
    assert y.shape == ref.shape and x.grad.shape == x.shape
    assert all(p.grad is not None for p in model.parameters())
    if backend == "transformer_engine":
        assert [c["fp8"] for c in seen["te"]["calls"]] == [True, True]
        padded = {c["tokens"] for c in seen["te"]["calls"]}
        assert padded == {math.ceil(math.prod(tokens) / 16) * 16 if scaling in ("delayed", "tensorwise")
                          else math.ceil(math.prod(tokens) / 32) * 32}
        assert torch.allclose(y, ref, atol=1e-5) and torch.allclose(x.grad, ref_dx, atol=1e-5)
    else:
        assert seen["calls"] or backend == "emulated", "the engine's low-precision GEMM never ran"
        assert _sqnr(ref, y) >= MIN_SQNR[scaling] and _sqnr(ref_dx, x.grad) >= MIN_SQNR[scaling] - 3


def test_te_fp8_fake_raises_in_backward_where_te_does():
    """Forward passes at 24 tokens (TE asserts M % 8 there); the wgrad GEMM needs M % 16 and raises in backward."""
    mods, _ = fake_te("2.18.0")
    te, rec = mods["transformer_engine.pytorch"], mods["transformer_engine.common.recipe"]
    lin = te.Linear(32, 32, device="cpu")
    nn.init.normal_(lin.weight)
    x = torch.randn(24, 32, requires_grad=True)
    with te.autocast(recipe=rec.Float8CurrentScaling()):
        y = lin(x)
    with pytest.raises(RuntimeError, match="Caller must pad.*wgrad needs M % 16.*cublaslt_gemm.cu:161"):
        y.sum().backward()
    with te.autocast(recipe=rec.DelayedScaling()), pytest.raises(ValueError, match="divisible by 8"):
        lin(torch.randn(3, 5, 32))  # v2.18 raises ValueError; the v2.9 fake an AssertionError (TE's change)


def test_torchao_float8_unpadded_raises_in_backward_where_scaled_mm_does(monkeypatch):
    """torchao's own Float8Linear at 24 tokens: forward runs, the wgrad `_scaled_mm` gets mat1 (N, 24)."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    monkeypatch.setattr(torch, "_scaled_mm", fake_scaled_mm())
    m = nn.Sequential(nn.Linear(32, 32))
    convert_to_float8_training(m, config=Float8LinearConfig.from_recipe_name("tensorwise"))
    y = m(torch.randn(24, 32, requires_grad=True))
    with pytest.raises(RuntimeError, match=r"trailing dimension of mat1 to be divisible by 16.*\(32x24\)"):
        y.sum().backward()


def test_every_rule_cites_its_engine_source_and_the_policy_reads_the_same_table():
    for key, eng in SHAPE_RULES.items():
        for r in eng.rules:
            assert key.startswith("emulated/") or re.search(r"\w+\.(py|cu|cuh|cpp):\d+|ScaledBlas\.cpp", r.source), r
            assert r.gemm in ("fprop", "dgrad", "wgrad") and r.dim in "MKN" and r.multiple & (r.multiple - 1) == 0
    from overdrive.convert import policy

    assert policy.dims_multiple is dims_multiple  # one home: the policy imports the table's reader
    assert tokens_multiple("fp8", "transformer_engine") == 16 and tokens_multiple("fp8", "torchao") == 16
    assert tokens_multiple("mxfp8", "torchao") == 32 and tokens_multiple("nvfp4", "torchao") == 128
    with pytest.raises(ValueError, match="add them to overdrive.convert.shape_rules"):
        tokens_multiple("fp8", "apex")
    with pytest.raises(AssertionError, match="rows must be a multiple of 32"):
        enforce("torchao/mxfp8", "wgrad", m=40, k=64, n=64)


@pytest.mark.parametrize("backend", ["torchao", "transformer_engine"])
def test_fp8_filter_times_the_padded_shapes_that_really_run(monkeypatch, backend):
    """tune's per-shape timing ran the FP8 Linear at the raw token count: on the GPU it crashed in backward
    (M=24); now it times the GEMMs that really run, at M padded to 32, against bf16 at M."""
    from overdrive.tuning.fp8_filter import bench_linear

    seen = _install(monkeypatch, backend, "tensorwise")
    ms = bench_linear(24, 32, 32, True, backend=backend, scaling="tensorwise", compile=False, device="cpu", reps=1)
    assert ms > 0
    if backend == "torchao":
        # fprop x (32, K), dgrad dy (32, N), wgrad dy.T (N, 32): every GEMM at the padded M
        assert {(32, 32)} == {c[0] for c in seen["calls"][:3]}
    else:
        assert {c["tokens"] for c in seen["te"]["calls"]} == {32}
    assert bench_linear(24, 32, 32, False, backend=backend, scaling="tensorwise", compile=False, device="cpu",
                        reps=1) > 0


def test_padding_changes_no_numbers():
    """Zero rows pad the tokens: the outputs and gradients of the real rows are unchanged (fp32, exact math)."""
    from overdrive.convert.mx import pad_tokens

    torch.manual_seed(0)
    x = torch.randn(6, 7, 16, requires_grad=True)
    w = torch.randn(8, 16, requires_grad=True)
    y = pad_tokens(x, 16, lambda x2: F.linear(x2, w))
    assert y.shape == (6, 7, 8)
    y.square().sum().backward()
    gx, gw = x.grad, w.grad
    x.grad = w.grad = None
    F.linear(x, w).square().sum().backward()
    assert torch.allclose(gx, x.grad) and torch.allclose(gw, w.grad, rtol=1e-5)


def test_fp8_filter_judges_shapes_by_the_engines_rules():
    """The filter hard-coded "% 16": an MXFP8 candidate would have timed a 48-wide layer its engine refuses,
    and the rows did not say at what token count the FP8 layer really ran."""
    from overdrive.tuning.fp8_filter import LinearSite, measure_filter

    sites = [LinearSite(fqn="a", in_features=48, out_features=64, tokens=40),
             LinearSite(fqn="b", in_features=64, out_features=64, tokens=40)]
    timed = []
    res = measure_filter(sites, bench=lambda m, k, n, fp8: timed.append((m, k, n, fp8)) or (1.0 if fp8 else 2.0),
                         fmt="mxfp8", backend="torchao")
    a, b = res.layers
    assert not a["convert"] and "not divisible by 32" in a["reason"] and b["convert"]
    assert {t[:3] for t in timed} == {(40, 64, 64)} and b["fp8_tokens"] == 64 and res.shapes == "64x64"
    fp8 = measure_filter(sites, bench=lambda m, k, n, fp8: 1.0, fmt="fp8", backend="transformer_engine").layers
    assert [r["fp8_tokens"] for r in fp8] == [48, 48] and "not divisible" not in fp8[0].get("reason", "")
