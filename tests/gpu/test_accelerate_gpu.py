"""The real engines on a real GPU: torchao float8, Liger, TE, Apex, fused AdamW."""

import copy
import importlib.util
import math

import pytest
import torch

import overdrive
from overdrive.models import GPT, gpt_config

pytestmark = pytest.mark.gpu


def _sqnr(a, b):
    err = (a.double() - b.double()).norm().item()
    return math.inf if err == 0 else 20 * math.log10(b.double().norm().item() / err)  # identical: no noise


def _gpt(n_embd=1024):
    torch.manual_seed(0)
    return GPT(gpt_config("tiny", n_embd=n_embd, n_head=8, n_layer=2, block_size=256, vocab_size=4096))


def _fwd_bwd(acc, x):
    with acc.autocast():
        logits, loss = acc.model(x[:, :-1], x[:, 1:])
    acc.backward(loss)
    return logits.detach().float(), {n: p.grad.float() for n, p in acc.model.named_parameters() if p.grad is not None}


def test_fused_adamw_matches_for_loop():
    a, b = _gpt(256).cuda(), None
    b = copy.deepcopy(a)
    acc_a = overdrive.accelerate(a, overdrive.Recipe(precision="fp32", optimizer="torch-fused"))
    acc_b = overdrive.accelerate(b, overdrive.Recipe(precision="fp32", optimizer="for-loop"))
    x = torch.randint(0, 4096, (4, 129), device="cuda")
    for acc in (acc_a, acc_b):
        for _ in range(3):
            _fwd_bwd(acc, x)
            acc.step()
    for (n, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.allclose(p, q, atol=1e-5, rtol=1e-4), n


def test_bf16_trains():
    acc = overdrive.accelerate(_gpt(256), "amp-bf16", lr=1e-3)
    assert acc.resolved.autocast_dtype == "bfloat16" and acc.device.type == "cuda"
    x = torch.randint(0, 4096, (8, 129), device="cuda")
    losses = []
    for _ in range(10):
        with acc.autocast():
            _, loss = acc.model(x[:, :-1], x[:, 1:])
        acc.backward(loss)
        acc.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.5


@pytest.mark.skipif(not importlib.util.find_spec("torchao"), reason="torchao not installed")
@pytest.mark.parametrize("recipe", ["fp8", "fp8-rowwise"])
def test_torchao_real_fp8(recipe):
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("FP8 needs SM >= 8.9")
    ref = overdrive.accelerate(_gpt(), "amp-bf16", build_optimizer=False)
    acc = overdrive.accelerate(_gpt(), overdrive.Recipe(precision="fp8", fp8_backend="torchao",
                                                        fp8_scaling=overdrive.PRESETS[recipe].fp8_scaling),
                               build_optimizer=False)
    assert acc.resolved.fp8_backend == "torchao" and not acc.resolved.emulated
    assert sum(d.converted for d in acc.conversions["fp8"]) == 8  # 4 linears x 2 blocks; head kept
    x = torch.randint(0, 4096, (4, 257), device="cuda")
    y_ref, g_ref = _fwd_bwd(ref, x)
    y, g = _fwd_bwd(acc, x)
    assert _sqnr(y, y_ref) >= 20
    assert _sqnr(g["blocks.0.mlp.fc.weight"], g_ref["blocks.0.mlp.fc.weight"]) >= 15


@pytest.mark.skipif(not importlib.util.find_spec("liger_kernel"), reason="liger-kernel not installed")
def test_liger_norms_and_fused_loss():
    for norm in ("layernorm", "rmsnorm"):
        torch.manual_seed(0)
        base = GPT(gpt_config("tiny", n_embd=256, n_head=4, norm=norm, vocab_size=4096, block_size=256))
        ref = overdrive.accelerate(copy.deepcopy(base), overdrive.Recipe(precision="fp32", norm="torch"),
                                   build_optimizer=False)
        acc = overdrive.accelerate(base, overdrive.Recipe(precision="fp32", norm="liger",
                                                          loss="fused-linear-cross-entropy"), strict=True,
                                   build_optimizer=False)
        assert all(d.converted for d in acc.conversions["norm"])
        x = torch.randint(0, 4096, (4, 129), device="cuda")
        y_ref, _ = _fwd_bwd(ref, x)
        y, _ = _fwd_bwd(acc, x)
        assert torch.allclose(y, y_ref, atol=2e-4, rtol=1e-4)
        h = acc.model.hidden(x[:, :-1])
        fused = acc.lm_loss(h, acc.model.lm_head.weight, x[:, 1:])
        plain = torch.nn.functional.cross_entropy(acc.model.lm_head(h).float().flatten(0, 1), x[:, 1:].flatten())
        assert torch.allclose(fused, plain, rtol=1e-4)


@pytest.mark.skipif(not importlib.util.find_spec("transformer_engine"), reason="Transformer Engine not installed")
def test_transformer_engine_fp8():
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("FP8 needs SM >= 8.9")
    ref = overdrive.accelerate(_gpt(), overdrive.Recipe(precision="fp32"), build_optimizer=False)
    acc = overdrive.accelerate(_gpt(), overdrive.Recipe(precision="fp8", fp8_backend="transformer_engine"),
                               strict=True)
    assert acc.resolved.fp8_backend == "transformer_engine" and not acc.resolved.emulated
    x = torch.randint(0, 4096, (4, 257), device="cuda")
    y_ref, g_ref = _fwd_bwd(ref, x)
    y, g = _fwd_bwd(acc, x)
    # FP8 (E4M3 forward, E5M2 gradients) against fp32 on the same weights: torchao's float8 tests
    # hold SQNR >= 25 dB on one layer; two blocks and a bf16 rest leave >= 20 forward, >= 15 gradients.
    assert _sqnr(y, y_ref) >= 20
    assert _sqnr(g["blocks.0.mlp.fc.weight"], g_ref["blocks.0.mlp.fc.weight"]) >= 15
    acc.step()
    assert set(acc.model.state_dict()) == set(_gpt().state_dict())


@pytest.mark.skipif(not importlib.util.find_spec("apex"), reason="Apex not installed")
def test_apex_fused_adam_and_norms():
    ref = overdrive.accelerate(_gpt(256), overdrive.Recipe(precision="fp32", optimizer="for-loop", norm="torch"),
                               lr=1e-3, grad_clip=0.0)
    acc = overdrive.accelerate(_gpt(256), overdrive.Recipe(precision="fp32", optimizer="apex", norm="apex"),
                               lr=1e-3, grad_clip=0.0, strict=True)
    assert acc.resolved.optimizer == "apex" and acc.resolved.norm == "apex"
    x = torch.randint(0, 4096, (4, 129), device="cuda")
    y_ref, g_ref = _fwd_bwd(ref, x)
    y, g = _fwd_bwd(acc, x)
    # Apex's fused norms and FusedAdam in fp32 are the same maths in another order: ~1e-6 relative.
    assert _sqnr(y, y_ref) >= 60
    assert _sqnr(g["blocks.0.norm1.weight"], g_ref["blocks.0.norm1.weight"]) >= 50
    ref.step()
    acc.step()
    w_ref, w = dict(ref.model.named_parameters()), dict(acc.model.named_parameters())
    assert _sqnr(w["blocks.0.mlp.fc.weight"].detach(), w_ref["blocks.0.mlp.fc.weight"].detach()) >= 60


# -- MXFP8 / NVFP4 ---------------------------------------------------------------------------------

def _cc():
    return torch.cuda.get_device_capability() if torch.cuda.is_available() else (0, 0)


blackwell = pytest.mark.skipif(_cc() < (10, 0), reason="MXFP8/NVFP4 kernels need SM 10.x (Blackwell)")


def test_block_scaled_on_pre_blackwell_fall_back_to_per_tensor_fp8():
    if _cc() >= (10, 0):
        pytest.skip("a Blackwell GPU runs the formats themselves")
    for name in ("mxfp8", "nvfp4"):
        res = overdrive.resolve(name, overdrive.get_env())
        assert res.fp8_scaling != name and any("SM 10" in d.reason for d in res.fallbacks), res.decisions


def test_emulated_quantisers_agree_on_cuda_and_cpu():
    from overdrive.convert.mx import nvfp4_fake_quantize

    torch.manual_seed(0)  # one input, every run: a failure is reproducible, never a 1-in-4 flake
    x = torch.randn(256, 512) * torch.exp(torch.randn(256, 1))
    assert torch.equal(nvfp4_fake_quantize(x.cuda()).cpu(), nvfp4_fake_quantize(x))


@blackwell
@pytest.mark.parametrize("name", ["mxfp8", "nvfp4"])
def test_block_scaled_real_kernels_train_close_to_bf16(name):
    """On SM 10.x the formats run in TE or torchao (not emulated) and stay near bf16 for a few steps."""
    ref = overdrive.accelerate(_gpt(1024).cuda(), "amp-bf16")
    low = overdrive.accelerate(_gpt(1024).cuda(), overdrive.get_recipe(name, fp8_min_dim=512))
    assert low.resolved.fp8_backend in ("transformer_engine", "torchao") and low.resolved.fp8_scaling == name
    assert sum(d.converted for d in low.conversions["fp8"]) >= 4
    x = torch.randint(0, 4096, (8, 257), device="cuda")  # 256 tokens per row: NVFP4's 128-multiple rule
    for acc in (ref, low):
        for _ in range(5):
            _fwd_bwd(acc, x)
            acc.step()
    lr, ll = (_fwd_bwd(a, x)[0] for a in (ref, low))
    assert torch.isfinite(ll).all() and _sqnr(ll, lr) > (15 if name == "mxfp8" else 8)
