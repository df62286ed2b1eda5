"""The user's own loop: their optimizer and scheduler, gradient accumulation, autocast that cannot be forgotten."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import overdrive
from fakes import TORCHAO_EMU, machine
from overdrive.env import build_report
from overdrive.errors import UserError
from overdrive.models import GPT, gpt_config

CPU = build_report(machine(None, torchao=TORCHAO_EMU))


class UserNet(nn.Module):
    """A model a user writes: no reference-GPT structure, a loss outside the model."""

    def __init__(self, d=32, classes=5):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, d), nn.GELU(), nn.LayerNorm(d), nn.Linear(d, d), nn.GELU())
        self.head = nn.Linear(d, classes)

    def forward(self, x):
        return self.head(self.body(x))


def _data(n=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 16, generator=g)
    return x, (x[:, :5].argmax(-1))


def test_user_optimizer_and_scheduler_under_amp_fp16():
    torch.manual_seed(0)
    model = UserNet()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)  # built before accelerate(): the usual habit
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    acc = overdrive.accelerate(model, "amp-fp16", env=CPU, optimizer=opt, scheduler=sched)
    assert acc.optimizer is opt and acc.scaler is not None
    x, y = _data()
    losses = []
    for _ in range(8):
        loss = F.cross_entropy(acc.model(x).float(), y)
        acc.backward(loss)  # scaled by 65536 under fp16 ...
        info = acc.step()   # ... and unscaled before the user's optimizer steps
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < losses[0] * 0.7, losses
    assert opt.param_groups[0]["lr"] == pytest.approx(1e-2 * 0.5 ** 4)  # the scheduler stepped 8 times
    assert info["stepped"] and acc.steps == 8
    rep = acc.report()
    assert "your optimizer: AdamW" in rep and "scheduler StepLR" in rep


def test_hand_stepped_optimizer_under_fp16_is_refused():
    acc = overdrive.accelerate(UserNet(), "amp-fp16", env=CPU, build_optimizer=False)
    x, y = _data()
    loss = F.cross_entropy(acc.model(x).float(), y)
    with pytest.raises(UserError, match="optimizer=opt"):
        acc.backward(loss)  # would have scaled the loss by 65536 with no one to unscale it
    with pytest.raises(UserError, match="optimizer=opt"):
        acc.step()


def test_optimizer_factory_and_stated_defaults():
    acc = overdrive.accelerate(UserNet(), "fp32", env=CPU, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1))
    assert isinstance(acc.optimizer, torch.optim.SGD)
    rep = overdrive.accelerate(UserNet(), "fp32", env=CPU).report()
    assert "weight decay 0.1, betas (0.9, 0.95)" in rep and "clipping at 1" in rep
    rep = overdrive.accelerate(UserNet(), "fp32", env=CPU, weight_decay=0.01, grad_clip=None).report()
    assert "weight decay 0.01" in rep and "clipping off" in rep


@pytest.mark.parametrize("n", [2, 4])
def test_grad_accumulation_equals_the_full_batch(n):
    torch.manual_seed(0)
    base = UserNet()
    x, y = _data(32)
    full = overdrive.accelerate(copy.deepcopy(base), "fp32", env=CPU, lr=1e-2)
    accum = overdrive.accelerate(copy.deepcopy(base), "fp32", env=CPU, lr=1e-2, grad_accum_steps=n)
    for _ in range(3):
        full.backward(F.cross_entropy(full.model(x), y))
        assert full.step()["stepped"]
        stepped = []
        for xs, ys in zip(x.chunk(n), y.chunk(n)):
            accum.backward(F.cross_entropy(accum.model(xs), ys))
            stepped.append(accum.step()["stepped"])
        assert stepped == [False] * (n - 1) + [True]
    for (k, a), b in zip(full.model.state_dict().items(), accum.model.state_dict().values()):
        assert torch.allclose(a, b, atol=1e-6, rtol=1e-6), k
    assert accum.steps == full.steps == 3


def test_forward_runs_under_the_recipe_autocast_by_default():
    seen = {}
    for flag in (True, False):
        acc = overdrive.accelerate(UserNet(), "amp-bf16", env=CPU, autocast_forward=flag)
        out = acc.model(torch.randn(2, 16))
        seen[flag] = out.dtype
        with acc.autocast():  # the explicit context still works, and nests
            assert acc.model(torch.randn(2, 16)).dtype == torch.bfloat16
    assert seen == {True: torch.bfloat16, False: torch.float32}
    gpt = overdrive.accelerate(GPT(gpt_config("tiny", n_embd=32, n_head=2)), "amp-bf16", env=CPU)
    assert set(gpt.model.state_dict()) == set(GPT(gpt_config("tiny", n_embd=32, n_head=2)).state_dict())


def test_step_returns_tensors_not_host_syncs(monkeypatch):
    acc = overdrive.accelerate(UserNet(), "amp-fp16", env=CPU, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1))
    x, y = _data()
    acc.backward(F.cross_entropy(acc.model(x).float(), y))
    # get_scale() is GradScaler's .item(): on a GPU it waits for the step; step() must not call it
    monkeypatch.setattr(acc.scaler, "get_scale", lambda: pytest.fail("acc.step() synced on the scale"))
    info = acc.step()
    assert isinstance(info["grad_norm"], torch.Tensor) and isinstance(info["scale"], torch.Tensor)
    assert isinstance(info["skipped"], torch.Tensor) and not bool(info["skipped"])
    assert acc.skipped_steps == 0


def test_bad_options_are_one_line_errors():
    with pytest.raises(UserError, match="grad_accum_steps"):
        overdrive.accelerate(UserNet(), "fp32", env=CPU, grad_accum_steps=0)
    with pytest.raises(UserError, match="torchrun"):
        overdrive.accelerate(UserNet(), "fp32", env=CPU, distributed="fsdp")
    other = nn.Linear(3, 3)
    with pytest.raises(UserError, match="not the model's"):
        overdrive.accelerate(UserNet(), "fp32", env=CPU, optimizer=torch.optim.SGD(other.parameters(), lr=0.1))


def test_fsdp_accumulation_syncs_gradients_on_the_last_micro_step_only(tmp_path):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        base = GPT(gpt_config("tiny", n_embd=32, n_head=2, block_size=16))
        opt_first = torch.optim.SGD(base.parameters(), lr=0.1)  # built on the unsharded parameters
        acc = overdrive.accelerate(base, "fp32", env=CPU, distributed="fsdp", grad_accum_steps=3,
                                   optimizer=opt_first)
        assert acc.applied.sharded == ["blocks.0", "blocks.1", ""]
        live = {id(p) for p in acc.model.parameters()}
        assert all(id(p) in live for g in acc.optimizer.param_groups for p in g["params"])  # re-pointed
        calls = []
        real = acc.model.set_requires_gradient_sync
        acc.model.set_requires_gradient_sync = lambda flag, **kw: (calls.append(flag), real(flag, **kw))
        x = torch.randint(0, 256, (6, 17))
        stepped = []
        for xs in x.chunk(3):
            _, loss = acc.model(xs[:, :-1], xs[:, 1:])
            acc.backward(loss)
            stepped.append(acc.step()["stepped"])
        assert calls == [False, False, True] and stepped == [False, False, True]
    finally:
        dist.destroy_process_group()


def test_scheduler_factory_is_built_on_the_optimizer_and_report_names_the_set_lr():
    """scheduler= takes a factory as optimizer= does (it used to crash at the first step), and report() gives
    the lr the user set, not a warm-up's current 0."""
    warm = lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, s / 4))  # noqa: E731
    acc = overdrive.accelerate(UserNet(), "fp32", env=CPU, optimizer=lambda ps: torch.optim.AdamW(ps, lr=1e-3),
                               scheduler=warm)
    assert isinstance(acc.scheduler, torch.optim.lr_scheduler.LambdaLR)
    text = acc.report()
    assert "lr 0.001" in text and "scheduler LambdaLR (lr now 0)" in text
    x, y = _data()
    for _ in range(2):
        acc.backward(F.cross_entropy(acc.model(x), y))
        assert acc.step()["stepped"]
    assert acc.optimizer.param_groups[0]["lr"] == pytest.approx(1e-3 * 2 / 4)
    own = overdrive.accelerate(UserNet(), "fp32", env=CPU, lr=2e-3, scheduler=warm)  # on our AdamW too
    assert isinstance(own.scheduler, torch.optim.lr_scheduler.LambdaLR) and "lr 0.002" in own.report()
    with pytest.raises(UserError, match="scheduler=int"):
        overdrive.accelerate(UserNet(), "fp32", env=CPU, scheduler=3)
