"""On a CUDA GPU: acc.step() never waits for the GPU, Liger's model patches train, the trainer's FSDP2 keeps
fused AdamW. Run by scripts/gpu_check.sh."""

import pytest
import torch
import torch.nn.functional as F

import overdrive

pytestmark = pytest.mark.gpu


def test_step_has_no_host_sync():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256))
    acc = overdrive.accelerate(model, "amp-bf16", optimizer=lambda ps: torch.optim.AdamW(ps, lr=1e-3, fused=True))
    x = torch.randn(64, 256, device="cuda")
    for i in range(3):
        loss = F.mse_loss(acc.model(x).float(), x)
        acc.backward(loss)
        if i == 0:
            acc.step()  # the first step allocates the optimizer state
            continue
        torch.cuda.set_sync_debug_mode("error")  # any .item()/float() on a CUDA tensor raises
        try:
            info = acc.step()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    assert info["grad_norm"].is_cuda and torch.isfinite(info["grad_norm"])


def test_liger_patched_llama_trains_like_plain():
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("liger_kernel.transformers")
    from overdrive.env import get_env
    from overdrive.models.hf import build_hf_model

    if not get_env().engine("liger_kernel").ok:
        pytest.skip("Liger does not run here")
    losses = {}
    for norm in ("torch", "liger"):
        torch.manual_seed(0)
        model = build_hf_model("llama", n_layer=2, d_model=256, n_head=4, vocab_size=1024, max_positions=256)
        acc = overdrive.accelerate(model, overdrive.Recipe(precision="bf16", norm=norm), lr=1e-3)
        if norm == "liger":
            assert "apply_liger_kernel_to_llama" in acc.report()
        x = torch.randint(0, 1024, (4, 128), device="cuda", generator=torch.Generator("cuda").manual_seed(0))
        out = []
        for _ in range(5):
            loss = acc.model(input_ids=x, labels=x).loss
            acc.backward(loss)
            acc.step()
            out.append(float(loss))
        losses[norm] = out
    assert losses["liger"][-1] < losses["liger"][0]
    for a, b in zip(losses["liger"], losses["torch"]):
        assert abs(a - b) / b < 0.03, losses  # bf16: RoPE/SwiGLU/RMSNorm kernels round differently
    del transformers
