"""Counted FLOPs on a real GPU: acc.report()'s MFU against the catalogued peak of the precision that
ran, the count equal to the reference GPT's formula, and tune's rows carrying MFU."""

import pytest
import torch

import overdrive
from overdrive.env.catalog import lookup_gpu
from overdrive.models import GPT, gpt_config

pytestmark = pytest.mark.gpu


def test_acc_report_gives_mfu_against_the_bf16_peak():
    spec = lookup_gpu(torch.cuda.get_device_name(0))
    if spec is None:
        pytest.skip(f"{torch.cuda.get_device_name(0)} is not in the catalog: no peak to measure MFU against")
    torch.manual_seed(0)
    cfg = gpt_config("tiny", n_embd=1024, n_head=8, n_layer=4, block_size=512, vocab_size=8192)
    acc = overdrive.accelerate(GPT(cfg), "amp-bf16")
    x = torch.randint(0, cfg.vocab_size, (8, cfg.block_size + 1), device="cuda")
    for _ in range(12):
        _, loss = acc.model(x[:, :-1], x[:, 1:])
        acc.backward(loss)
        acc.step()
    f = acc.to_dict()["flops"]
    n_matmul = sum(m.weight.numel() for m in acc.model.modules() if isinstance(m, torch.nn.Linear))
    T, B = cfg.block_size, 8
    assert f["flops_per_step"] == (6 * n_matmul + 12 * cfg.n_layer * cfg.n_embd * T) * B * T
    assert f["steps_timed"] == 11 and 0 < f["mfu"] < 1 and "BF16" in f["mfu_peak"]
    assert f["mfu"] == pytest.approx(f["tflops"] / spec.bf16_tflops)
    assert "MFU" in acc.report()
