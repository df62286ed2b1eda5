"""acc.report()'s achieved TFLOP/s: FLOPs counted by FlopCounterMode on the user's first micro-step
(the loss and the backward included), the optimizer steps timed on a fake clock, and the counter
never left on when another caller runs the backward (the HF Trainer)."""

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import _get_current_dispatch_mode

import overdrive
from overdrive.env import build_report

CPU = build_report({"device": "cpu", "gpus": [], "cpu_bf16": False, "checks": {}, "packages": {}})

# Linear(16,32) -> Linear(32,4) on a (8,16) batch that needs no grad: forward 2*8*16*32 + 2*8*32*4,
# backward both matmuls of the last layer and only the weight gradient of the first.
STEP_FLOPS = (2 * 8 * 16 * 32 + 2 * 8 * 32 * 4) + (2 * 2 * 8 * 32 * 4 + 2 * 8 * 16 * 32)


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))


@pytest.mark.parametrize("accum", [1, 3])
def test_report_counts_the_users_step_and_times_the_optimizer_steps(accum, monkeypatch):
    clock = iter(range(100, 10_000, 2))  # each optimizer step 2 s apart on a fake clock
    monkeypatch.setattr("overdrive.step_flops.time.perf_counter", lambda: float(next(clock)))
    acc = overdrive.accelerate(_net(), "fp32", env=CPU, grad_accum_steps=accum)
    for _ in range(4 * accum):
        loss = nn.functional.cross_entropy(acc.model(torch.randn(8, 16)), torch.randint(0, 4, (8,)))
        acc.backward(loss)
        assert _get_current_dispatch_mode() is None  # the counter is off once the first backward returned
        acc.step()
    f = acc.to_dict()["flops"]
    assert f["flops_per_step"] == STEP_FLOPS * accum
    assert f["steps_timed"] == 3 and f["step_ms"] == pytest.approx(2000.0)
    assert f["tflops"] == pytest.approx(STEP_FLOPS * accum / 2.0 / 1e12) and f["mfu"] is None  # CPU: no peak
    assert "FLOPs:" in acc.report() and "TFLOP/s over 3 steps" in acc.report()


def test_a_backward_by_another_caller_ends_the_count_at_the_next_forward():
    acc = overdrive.accelerate(_net(), "fp32", env=CPU)
    assert "not counted yet" in acc.report()
    out = acc.model(torch.randn(8, 16))
    assert _get_current_dispatch_mode() is not None  # counting the first micro-step
    out.sum().backward()  # as transformers.Trainer does: not through acc.backward
    acc.model(torch.randn(8, 16))
    assert _get_current_dispatch_mode() is None
    assert acc.to_dict()["flops"]["flops_per_step"] == STEP_FLOPS  # the first forward and its backward only
    assert "after two optimizer steps" in acc.report()
