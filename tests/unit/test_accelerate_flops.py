"""acc.report()'s achieved TFLOP/s: FLOPs counted by FlopCounterMode on the user's first micro-step
(its forward and acc.backward's backward), the optimizer steps timed on a fake clock, and the counter
never left on outside them (another caller's backward, a forward that raises, inference only)."""

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


FORWARD_FLOPS = 2 * 8 * 16 * 32 + 2 * 8 * 32 * 4


def test_a_backward_by_another_caller_is_taken_as_twice_the_forward():
    """The counter is on only inside the model's forward (and acc.backward): a dispatch mode left on after
    a forward would follow the user's every op (an inference loop, another model, torch.compile)."""
    acc = overdrive.accelerate(_net(), "fp32", env=CPU)
    assert "not counted yet" in acc.report()
    out = acc.model(torch.randn(8, 16))
    assert _get_current_dispatch_mode() is None  # off as soon as the forward returned
    out.sum().backward()  # as transformers.Trainer does: not through acc.backward
    acc.model(torch.randn(8, 16))
    assert _get_current_dispatch_mode() is None
    f = acc.to_dict()["flops"]
    assert f["flops_per_step"] == 3 * FORWARD_FLOPS and "twice the forward" in f["note"]
    assert "after two optimizer steps" in acc.report()


def test_a_forward_that_raises_or_a_forward_alone_leaves_no_counter_on():
    acc = overdrive.accelerate(_net(), "fp32", env=CPU)
    with pytest.raises(RuntimeError):
        acc.model(torch.randn(8, 5))  # wrong width: the forward raises inside the count
    assert _get_current_dispatch_mode() is None
    with torch.no_grad():
        acc.model(torch.randn(8, 16))  # an evaluation-only use: never a backward
    assert _get_current_dispatch_mode() is None
