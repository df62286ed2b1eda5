"""On the GPU: the real engines assert what tests/fakes.py's fakes assert, and the paths fixed through those
fakes run for real (FSDP2 with each block compiled, torchao float8 inside)."""

import importlib.util
import math

import pytest
import torch

pytestmark = pytest.mark.gpu
needs_torchao = pytest.mark.skipif(not importlib.util.find_spec("torchao"), reason="torchao not installed")


def _mxfp8_triton_kernels_here() -> bool:
    """torchao 0.18 defines its Triton MXFP8 casts only where `_triton_kernels_available` holds
    (prototype/mx_formats/kernels.py:458-463: Triton, SM >= 10.0 and CUDA >= 12.8, or ROCm MI350); elsewhere
    (H100/H200, SM 9.0) `triton_to_mxfp8_dim0` is a stub that raises AssertionError("needs triton")
    (kernels.py:995-1002) before looking at its input."""
    from torch.utils._triton import has_triton

    cuda = tuple(int(v) for v in (torch.version.cuda or "0.0").split(".")[:2])
    return has_triton() and torch.cuda.get_device_capability() >= (10, 0) and cuda >= (12, 8)


@needs_torchao
def test_torchao_mxfp8_cast_is_what_its_source_defines_on_this_gpu():
    """The contract fake_mxfp8_mm holds where the kernel exists (SM 10.x): the dim-0 cast takes bf16 only
    (kernels.py:860-862). Below SM 10 torchao defines a stub, and Overdrive never routes MXFP8 to it
    (resolve falls back to per-tensor FP8, tests/gpu/test_accelerate_gpu.py)."""
    from torchao.prototype.mx_formats import kernels
    from torchao.prototype.mx_formats.kernels import triton_to_mxfp8_dim0

    x = torch.randn(64, 64, device="cuda")
    here = _mxfp8_triton_kernels_here()
    assert kernels._triton_kernels_available == here  # our reading of kernels.py:458-463 is torchao's
    if not here:
        with pytest.raises(AssertionError, match="needs triton"):
            triton_to_mxfp8_dim0(x.bfloat16(), inner_block_size=32, scaling_mode="rceil")
        return
    with pytest.raises(AssertionError, match="only bfloat16"):
        triton_to_mxfp8_dim0(x, inner_block_size=32, scaling_mode="rceil")
    data, scale = triton_to_mxfp8_dim0(x.bfloat16(), inner_block_size=32, scaling_mode="rceil")
    assert data.dtype == torch.float8_e4m3fn and data.shape == (64, 64) and scale.numel() == 64 * 2


@pytest.mark.skipif(not importlib.util.find_spec("liger_kernel"), reason="liger-kernel not installed")
def test_liger_norms_compute_what_their_fakes_compute():
    from liger_kernel.transformers import LigerLayerNorm, LigerRMSNorm

    from fakes import fake_liger_norms

    fake_rms, fake_ln = fake_liger_norms()
    x = torch.randn(6, 42, 123, device="cuda")  # Liger's weird shape
    for real, fake in ((LigerRMSNorm(123), fake_rms(123)), (LigerLayerNorm(123), fake_ln(123))):
        real, fake = real.cuda(), fake.cuda()
        fake.load_state_dict(real.state_dict())
        assert torch.allclose(real(x), fake(x), atol=1e-5, rtol=1e-5), type(real).__name__


@needs_torchao
def test_fsdp2_compiles_each_block_and_trains_torchao_fp8(tmp_path):
    """apply_recipe under FSDP2 used to turn compile off, leaving torchao float8 eager (slow)."""
    import torch.distributed as dist

    import overdrive
    from overdrive.convert import apply_recipe
    from overdrive.models import GPT, gpt_config

    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("FP8 needs SM >= 8.9")
    res = overdrive.resolve(overdrive.get_recipe("fp8+compile", fp8_min_dim=256), overdrive.get_env())
    assert res.fp8_backend == "torchao" and res.compile != "off", res.decisions
    dist.init_process_group("nccl", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model = GPT(gpt_config("tiny", n_embd=512, n_head=8, n_layer=2, block_size=256, vocab_size=4096))
        applied = apply_recipe(model, res, fsdp=True, world=1)
        comp = [d for d in applied.resolved.decisions if d.field == "compile"][-1]
        assert comp.chosen.endswith("per block") and all(b._compiled_call_impl is not None for b in model.blocks)
        assert sum(d.converted for d in applied.conversions["fp8"]) == 8
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
        x = torch.randint(0, 4096, (8, 257), device="cuda")
        losses = []
        for _ in range(6):
            with applied.autocast():
                _, loss = model(x[:, :-1], x[:, 1:])
            loss.backward()
            opt.step()
            applied.after_optimizer_step()
            opt.zero_grad(set_to_none=True)
            losses.append(loss.item())
        assert all(math.isfinite(v) for v in losses) and losses[-1] < losses[0] - 0.3, losses
    finally:
        dist.destroy_process_group()


def _sqnr(ref, y) -> float:
    ref, y = ref.detach().float(), y.detach().float()
    return float(20 * torch.log10(ref.norm() / (ref - y).norm()))


@pytest.mark.parametrize("tokens", [24, 40, 100])
def test_fp8_wgrad_needs_tokens_16_and_overdrive_pads_them(tokens):
    """The rule the fakes enforce (overdrive.formats.shape_rules): the FP8 wgrad GEMM reduces over the tokens,
    torch._scaled_mm (torchao float8) and cuBLASLt FP8 on Hopper (Transformer Engine) need them % 16. The
    engines' own modules crash in backward at these counts; Overdrive's converted layers pad and train."""
    from torch import nn

    from overdrive.convert import convert_fp8
    from overdrive.convert.fp8 import te_autocast, te_fp8_recipe

    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("FP8 needs SM >= 8.9")
    backends = [b for b, mod in (("torchao", "torchao"), ("transformer_engine", "transformer_engine"))
                if importlib.util.find_spec(mod)]
    if not backends:
        pytest.skip("neither torchao nor Transformer Engine is installed")
    torch.manual_seed(0)
    x = torch.randn(tokens, 256, device="cuda", requires_grad=True)
    for backend in backends:
        for scaling in ("tensorwise", "rowwise") if backend == "torchao" else ("tensorwise", "delayed"):
            if backend == "torchao" and scaling == "tensorwise":
                from torchao.float8 import Float8LinearConfig, convert_to_float8_training

                raw = nn.Sequential(nn.Linear(256, 256)).cuda()
                convert_to_float8_training(raw, config=Float8LinearConfig.from_recipe_name(scaling))
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    y = raw(x)
                with pytest.raises(RuntimeError, match="divisible by 16"):
                    y.float().sum().backward()
            model = nn.Sequential(nn.Linear(256, 256), nn.GELU(), nn.Linear(256, 256)).cuda()
            ref = model(x)
            (ref_dx,) = torch.autograd.grad(ref.sum(), x)
            assert all(d.converted for d in convert_fp8(model, backend=backend, scaling=scaling, min_dim=16))
            ctx = te_autocast(te_fp8_recipe(scaling)) if backend == "transformer_engine" else torch.autocast(
                "cuda", dtype=torch.bfloat16)
            with ctx:
                y = model(x)
            (dx,) = torch.autograd.grad(y.float().sum(), x)
            assert _sqnr(ref, y) > 20 and _sqnr(ref_dx, dx) > 15, (backend, scaling)
