"""Module swaps into engines this machine cannot run (TE, Apex, Liger), through faked modules.

The fakes implement the engines' constructor signatures with plain torch math, so the swap,
weight sharing, state_dict interchange and reporting are checked without a GPU; the real
modules are exercised by tests/gpu.
"""

import sys
import types

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fakes import fake_liger_norms, fake_te_linear
from overdrive.convert.apply import _keep_state_dict_plain
from overdrive.convert import convert_fp8, convert_norms
from overdrive.models import GPT, gpt_config


class _FakeTELinear(fake_te_linear()):
    def get_extra_state(self):
        return torch.tensor([1.0])  # TE keeps FP8 scaling metadata here

    def set_extra_state(self, state):
        self.loaded_extra = state


class _FakeNorm(nn.Module):
    def __init__(self, hidden_size, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps


class _FakeLN(_FakeNorm):
    def __init__(self, hidden_size, eps=1e-5):
        super().__init__(hidden_size, eps)
        self.bias = nn.Parameter(torch.zeros(hidden_size))

    def forward(self, x):
        return F.layer_norm(x, (x.shape[-1],), self.weight, self.bias, self.eps)


class _FakeRMS(_FakeNorm):
    def forward(self, x):
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


@pytest.fixture
def fake_engines(monkeypatch):
    te = types.ModuleType("transformer_engine.pytorch")
    te.Linear, te.LayerNorm, te.RMSNorm = _FakeTELinear, _FakeLN, _FakeRMS
    apex_norm = types.ModuleType("apex.normalization")
    apex_norm.FusedLayerNorm, apex_norm.FusedRMSNorm = _FakeLN, _FakeRMS
    liger = types.ModuleType("liger_kernel.transformers")
    liger.LigerRMSNorm, liger.LigerLayerNorm = fake_liger_norms()  # Liger's signatures, in_place included
    for name, mod in {"transformer_engine": types.ModuleType("transformer_engine"),
                      "transformer_engine.pytorch": te, "apex": types.ModuleType("apex"),
                      "apex.normalization": apex_norm, "liger_kernel": types.ModuleType("liger_kernel"),
                      "liger_kernel.transformers": liger}.items():
        monkeypatch.setitem(sys.modules, name, mod)
    # The classes report their module as the engine's, as the real ones do.
    for cls, mod in ((_FakeTELinear, "transformer_engine.pytorch"), (_FakeLN, "x"), (_FakeRMS, "x")):
        monkeypatch.setattr(cls, "__module__", mod)
    return te


def _big_gpt(n_embd=256):
    return GPT(gpt_config("tiny", n_embd=n_embd, n_head=4, n_layer=2))


def test_te_linear_swap_shares_weights_and_reports(fake_engines):
    torch.manual_seed(0)
    m = _big_gpt()
    x = torch.randint(0, 256, (2, 16))
    ref, _ = m(x)
    w = m.blocks[0].mlp.fc.weight
    decs = {d.fqn: d for d in convert_fp8(m, backend="transformer_engine", scaling="tensorwise", min_dim=256)}
    assert isinstance(m.blocks[0].mlp.fc, _FakeTELinear) and m.blocks[0].mlp.fc.weight is w
    assert decs["blocks.0.mlp.fc"].converted and decs["blocks.0.attn.qkv"].converted
    assert not decs["lm_head"].converted and "output head" in decs["lm_head"].reason
    small = _big_gpt(n_embd=128)
    decs = {d.fqn: d for d in convert_fp8(small, backend="transformer_engine", scaling="tensorwise", min_dim=256)}
    assert not decs["blocks.0.mlp.fc"].converted and "too small to gain" in decs["blocks.0.mlp.fc"].reason
    out, _ = m(x)
    assert torch.allclose(out, ref, atol=1e-6)


def test_te_state_dict_stays_plain(fake_engines):
    torch.manual_seed(0)
    original = _big_gpt()
    m = _big_gpt()
    m.load_state_dict(original.state_dict())
    convert_fp8(m, backend="transformer_engine", scaling="tensorwise", min_dim=256)
    assert any(k.endswith("_extra_state") for k in m.state_dict())  # what TE adds
    _keep_state_dict_plain(m)
    assert m.state_dict().keys() == original.state_dict().keys()
    m.load_state_dict(original.state_dict(), strict=True)  # no _extra_state in a plain checkpoint: fine
    original.load_state_dict(m.state_dict(), strict=True)


@pytest.mark.parametrize("backend", ["transformer_engine", "apex", "liger"])
def test_norm_swaps(fake_engines, backend):
    torch.manual_seed(0)
    for norm in ("layernorm", "rmsnorm"):
        m = GPT(gpt_config("tiny", norm=norm))
        x = torch.randint(0, 256, (2, 16))
        ref, _ = m(x)
        keys = m.state_dict().keys()
        decs = convert_norms(m, backend)
        assert len(decs) == 5 and all(d.converted for d in decs)  # 2 per block + final
        lib = sys.modules["liger_kernel.transformers"]
        ln, rms = (lib.LigerLayerNorm, lib.LigerRMSNorm) if backend == "liger" else (_FakeLN, _FakeRMS)
        assert isinstance(m.norm_f, ln if norm == "layernorm" else rms)
        assert m.state_dict().keys() == keys
        out, _ = m(x)
        assert torch.allclose(out, ref, atol=1e-5)


class _PostNorm(nn.Module):
    """h + norm(h): the norm's output gradient is the residual's too (OLMo2's post-norm, Gemma's sandwich)."""

    def __init__(self, d=32):
        super().__init__()
        self.lin, self.norm, self.out = nn.Linear(d, d), nn.RMSNorm(d, eps=1e-6), nn.Linear(d, 1)

    def forward(self, x):
        h = self.lin(x)
        return self.out(h + self.norm(h))


def test_liger_rmsnorm_swap_keeps_the_residuals_gradient(fake_engines):
    """LigerRMSNorm's default in_place=True writes dX over dY (liger_kernel ops/rms_norm.py:555-556), and Liger
    warns it is wrong when dY is still needed (:646-648): here the residual add hands the norm and the residual
    the same gradient tensor, so the residual's share was overwritten and lin's gradients came out wrong."""
    torch.manual_seed(0)
    m = _PostNorm()
    with torch.no_grad():
        m.norm.weight.normal_(1, 0.2)
    x = torch.randn(8, 32)
    m(x).sum().backward()
    want = {n: p.grad.clone() for n, p in m.named_parameters()}
    m.zero_grad(set_to_none=True)
    assert [d.converted for d in convert_norms(m, "liger")] == [True]
    assert type(m.norm).__name__ == "LigerRMSNorm" and m.norm.in_place is False
    m(x).sum().backward()
    for n, p in m.named_parameters():
        assert torch.allclose(p.grad, want[n], atol=1e-5, rtol=1e-4), n


def test_norm_without_bias_is_skipped_with_reason(fake_engines):
    m = GPT(gpt_config("tiny", bias=False))
    decs = convert_norms(m, "apex")
    assert not any(d.converted for d in decs)
    assert "without bias" in decs[0].reason


class _FakeOffsetRMS(nn.Module):
    """LigerRMSNorm's and te.RMSNorm's real constructor defaults: offset=0.0 / zero_centered_gamma=False
    compute x/rms(x)*w; offset=1.0 / zero_centered_gamma=True compute x/rms(x)*(1+w)."""

    def __init__(self, hidden_size, eps=1e-6, offset=0.0, casting_mode="llama", init_fn="ones", in_place=True,
                 zero_centered_gamma=False):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps, self.offset = eps, 1.0 if zero_centered_gamma else offset

    def forward(self, x):
        return F.rms_norm(x, (x.shape[-1],), eps=self.eps) * (self.offset + self.weight)


class Qwen3NextRMSNorm(nn.Module):
    """Gemma/Qwen3-Next style: weight initialised to zero, output x/rms(x)*(1+w). The class name says
    nothing about the offset: only its behaviour does."""

    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.zeros(d)), eps

    def forward(self, x):
        return F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps) * (1.0 + self.weight.float())


@pytest.mark.parametrize("backend", ["liger", "transformer_engine", "apex"])
def test_gemma_style_rmsnorm_keeps_its_offset(fake_engines, monkeypatch, backend):
    import sys

    for mod in ("liger_kernel.transformers", "transformer_engine.pytorch", "apex.normalization"):
        monkeypatch.setattr(sys.modules[mod], "LigerRMSNorm" if "liger" in mod else
                            ("RMSNorm" if "engine" in mod else "FusedRMSNorm"), _FakeOffsetRMS, raising=False)
    monkeypatch.setattr(_FakeOffsetRMS, "__module__", "x")
    torch.manual_seed(0)
    m = nn.Sequential(Qwen3NextRMSNorm(64), nn.RMSNorm(64, eps=1e-6))
    with torch.no_grad():
        m[0].weight.normal_(0, 0.1)
        m[1].weight.normal_(1, 0.1)
    x = torch.randn(3, 64)
    ref = m(x)
    decs = {d.fqn: d for d in convert_norms(m, backend)}
    if backend == "apex":
        assert not decs["0"].converted and "has no offset" in decs["0"].reason
    else:
        assert decs["0"].converted and "Gemma-style" in decs["0"].reason and isinstance(m[0], _FakeOffsetRMS)
        assert m[0].offset == 1.0
    assert decs["1"].converted and m[1].offset == 0.0
    assert torch.allclose(m(x), ref, atol=1e-5)


def test_rms_offset_is_read_from_behaviour():
    from overdrive.convert.norms import rms_offset

    class Odd(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(8))

        def forward(self, x):
            return x * self.weight  # not a norm at all

    assert rms_offset(nn.RMSNorm(8)) == 0.0 and rms_offset(Qwen3NextRMSNorm(8)) == 1.0 and rms_offset(Odd()) is None


def test_te_recipe_objects_per_scaling(monkeypatch):
    import sys

    from overdrive.convert.fp8 import te_fp8_recipe

    from fakes import fake_te

    rec = fake_te()[0]["transformer_engine.common.recipe"]  # TE's recipe classes, with their fields
    monkeypatch.setitem(sys.modules, "transformer_engine.common.recipe", rec)
    assert type(te_fp8_recipe("nvfp4")).__name__ == "NVFP4BlockScaling"
    assert type(te_fp8_recipe("mxfp8")).__name__ == "MXFP8BlockScaling"
    assert type(te_fp8_recipe("tensorwise")).__name__ == "Float8CurrentScaling"
    assert te_fp8_recipe("delayed").amax_history_len == 16
