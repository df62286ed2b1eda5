"""train/step.py: the one training step shared by Accelerated, the trainer and the click model."""

import pytest
import torch

from overdrive.train.step import TrainStep


def _setup(n_opts=1):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Linear(5, 1))
    opts = [torch.optim.AdamW(m[i].parameters(), lr=1e-2) for i in range(2)] if n_opts == 2 else \
        torch.optim.AdamW(m.parameters(), lr=1e-2)
    return m, opts


def test_a_guard_that_raises_stops_before_anything_changes():
    m, opt = _setup()
    before = [p.detach().clone() for p in m.parameters()]
    s = TrainStep(m, opt, grad_clip=None, measure_norm=True)
    s.backward(m(torch.randn(3, 6)).sum())
    seen = []

    def guard(gn):
        seen.append(gn)
        raise RuntimeError("stop")

    with pytest.raises(RuntimeError, match="stop"):
        s.step(guard=guard)
    assert seen[0] is not None and torch.isfinite(seen[0])  # the norm was measured without clipping
    assert all(torch.equal(a, b) for a, b in zip(before, m.parameters()))
    assert not opt.state  # the optimizer never stepped


def test_accumulation_matches_the_whole_batch_and_every_optimizer_steps():
    x, y = torch.randn(8, 6), torch.randn(8, 1)
    m1, o1 = _setup(2)
    s1 = TrainStep(m1, o1, grad_clip=1.0)
    s1.backward(torch.nn.functional.mse_loss(m1(x), y))
    i1 = s1.step()
    m2, o2 = _setup(2)
    s2 = TrainStep(m2, o2, grad_clip=1.0, accum=2)
    for i, part in enumerate((slice(0, 4), slice(4, 8))):
        s2.backward(torch.nn.functional.mse_loss(m2(x[part]), y[part]), last=i == 1)
    i2 = s2.step()
    assert torch.allclose(i1.grad_norm, i2.grad_norm, rtol=1e-5)
    for a, b in zip(m1.parameters(), m2.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert all(len(o.state) > 0 for o in o2)  # both optimizers stepped
    assert all(p.grad is None for p in m2.parameters())  # and zeroed


def test_fp16_scaler_skips_a_non_finite_step_and_says_so():
    m, opt = _setup()
    scaler = torch.amp.GradScaler("cpu")
    s = TrainStep(m, opt, scaler=scaler, grad_clip=1.0)
    before = [p.detach().clone() for p in m.parameters()]
    s.backward(m(torch.randn(3, 6)).sum() * float("inf"))
    info = s.step()
    assert bool(info.skipped) and float(info.scale) < 65536.0
    assert all(torch.equal(a, b) for a, b in zip(before, m.parameters()))
