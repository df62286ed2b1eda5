"""The distillation loss against a float64 reference written from its definition."""

import math

import torch

from overdrive.losses import distill_loss


def _reference(s, t, y, alpha, T):
    """alpha·CE + (1−alpha)·T²·KL(p_t ‖ p_s) on temperature-softened distributions, in float64, by hand."""
    s, t = s.double().reshape(-1, s.size(-1)), t.double().reshape(-1, t.size(-1))
    logp = s - s.logsumexp(-1, keepdim=True)
    ce = -logp.gather(1, y.reshape(-1, 1)).mean()
    ls, lt = (s / T).log_softmax(-1), (t / T).log_softmax(-1)
    kl = (lt.exp() * (lt - ls)).sum(-1).mean()
    return alpha * ce + (1 - alpha) * T * T * kl


def test_distill_loss_matches_its_definition_on_odd_shapes():
    g = torch.Generator().manual_seed(0)
    for (B, L, V), alpha, T in (((3, 7, 41), 0.5, 2.0), ((1, 5, 123), 0.2, 4.0), ((2, 1, 6), 1.0, 1.0)):
        s = torch.randn(B, L, V, generator=g, requires_grad=True)
        t = torch.randn(B, L, V, generator=g)
        y = torch.randint(0, V, (B, L), generator=g)
        got = distill_loss(s, t, y, alpha=alpha, temperature=T)
        want = _reference(s, t, y, alpha, T)
        assert math.isclose(got.item(), want.item(), rel_tol=1e-5, abs_tol=1e-6)
        (gs,) = torch.autograd.grad(got, s)
        (ws,) = torch.autograd.grad(want, s)
        torch.testing.assert_close(gs, ws, rtol=1e-4, atol=1e-7)  # both float32: grads of the float32 leaf


def test_identical_teacher_leaves_only_the_hard_loss():
    g = torch.Generator().manual_seed(1)
    s = torch.randn(2, 3, 17, generator=g)
    y = torch.randint(0, 17, (2, 3), generator=g)
    ce = torch.nn.functional.cross_entropy(s.reshape(-1, 17), y.reshape(-1))
    assert math.isclose(distill_loss(s, s.clone(), y, alpha=0.3).item(), 0.3 * ce.item(), rel_tol=1e-5)
