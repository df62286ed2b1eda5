"""distributed="ddp" and the process helpers in one process (the 2-rank checks are in
tests/integration/test_ddp_accelerate.py), and report() with the user's optimizer."""


import pytest
import torch
import torch.nn.functional as F

import overdrive
from overdrive.errors import UserError
from groups import one_rank_group


def _net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


def _train(acc, n=6):
    g = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(n):
        x, y = torch.randn(5, 6, generator=g), torch.randint(0, 3, (5,), generator=g)
        loss = F.cross_entropy(acc.model(x), y)
        acc.backward(loss)
        acc.step()
        losses.append(float(loss.detach()))
    return losses


def test_ddp_accumulation_all_reduces_on_the_last_micro_step_only_and_matches_no_ddp(tmp_path):
    plain = overdrive.accelerate(_net(), "fp32", grad_accum_steps=3, lr=1e-2)
    want = _train(plain)
    with one_rank_group(tmp_path):
        acc = overdrive.accelerate(_net(), "fp32", grad_accum_steps=3, lr=1e-2, distributed="ddp")
        calls = []

        def hook(state, bucket):
            calls.append(acc._micro)
            fut = torch.futures.Future()
            fut.set_result(bucket.buffer())
            return fut

        acc.model.register_comm_hook(None, hook)
        got = _train(acc)
        assert type(acc.model).__name__ == "DistributedDataParallel" and acc.unwrap() is acc.unwrap_model()
        assert isinstance(acc.unwrap(), torch.nn.Sequential)
        assert "ddp: DistributedDataParallel x1" in acc.report() and "no all-reduce on the first 2 of every 3" \
            in acc.report()
    assert calls == [2, 5], "one all-reduce per optimizer step, during the 3rd micro-step's backward"
    assert acc.steps == plain.steps == 2
    assert max(abs(a - b) for a, b in zip(got, want)) < 1e-6


def test_helpers_in_one_process_are_the_identity():
    acc = overdrive.accelerate(_net(), "fp32")
    t = torch.arange(3.0)
    assert acc.gather(t) is t and acc.num_processes == 1 and acc.process_index == 0 and acc.is_main_process
    r = acc.reduce({"a": t, "b": [t]}, "sum")
    assert torch.equal(r["a"], t) and r["a"] is not t and torch.equal(r["b"][0], t)
    acc.wait(), acc.wait_for_everyone()
    assert acc.unwrap() is acc.model
    with pytest.raises(UserError, match="reduce\\(op='avg'\\): use one of"):
        acc.reduce(t, "avg")


def test_main_print_prints_on_the_main_process(capsys, monkeypatch):
    acc = overdrive.accelerate(_net(), "fp32")
    acc.main_print("hello", 1)
    monkeypatch.setattr(type(acc), "is_main_process", property(lambda self: False))
    acc.main_print("not me")
    assert capsys.readouterr().out == "hello 1\n"


def test_ddp_and_unknown_modes_refused_with_the_fix(monkeypatch):
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    with pytest.raises(UserError, match="distributed='ddp' needs torchrun"):
        overdrive.accelerate(_net(), "fp32", distributed="ddp")
    with pytest.raises(UserError, match="'ddp' \\(a replica per rank\\)"):
        overdrive.accelerate(_net(), "fp32", distributed="dp")


def test_report_describes_the_users_optimizer_and_lists_no_adamw_decision():
    model = _net()
    acc = overdrive.accelerate(model, "fp32", optimizer=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))
    rep = acc.report()
    assert "your optimizer: SGD, lr 0.05, momentum 0.9, 1 param group over 163 parameters" in rep
    assert "AdamW" not in rep.replace("the recipe's AdamW choice does not apply", "")
    ours = overdrive.accelerate(_net(), "fp32").report()
    assert "optimizer: AdamW" in ours and "  optimizer: torch" in ours  # our own AdamW: its decision is listed


def test_trainer_kwargs_refused_under_ddp(tmp_path):
    with one_rank_group(tmp_path):
        acc = overdrive.accelerate(_net(), "fp32", distributed="ddp")
        with pytest.raises(UserError, match="wraps the model in DDP itself"):
            acc.trainer_kwargs()
