"""Prepared DataLoaders in one process: ranks emulated by (rank, world) without a process group, the data
position through state_dict and through acc.save/acc.load, and the refusals."""

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, RandomSampler, TensorDataset

import overdrive
from overdrive.dataloader import prepare_dataloader, to_device
from overdrive.errors import UserError

DS = TensorDataset(torch.arange(48), torch.arange(48) * 10)


def _ids(loader) -> list[list[int]]:
    return [x.tolist() for x, _ in loader]


def test_two_ranks_together_see_the_one_process_global_batches_and_epochs_reshuffle():
    one = prepare_dataloader(DataLoader(DS, batch_size=8, shuffle=True))
    ranks = [prepare_dataloader(DataLoader(DS, batch_size=4, shuffle=True), rank=r, world=2) for r in (0, 1)]
    for epoch in range(2):
        g = _ids(one)
        r0, r1 = _ids(ranks[0]), _ids(ranks[1])
        assert len(g) == len(r0) == len(r1) == 6
        assert not set(sum(r0, [])) & set(sum(r1, []))  # disjoint shares
        assert [sorted(a + b) for a, b in zip(r0, r1)] == [sorted(b) for b in g]
        assert sorted(sum(g, [])) == list(range(48))
        if epoch == 0:
            first = g
    assert g != first and one.epoch == 2  # epoch 1 drew another permutation


def test_sequential_loader_keeps_its_order_and_the_shuffle_seed_comes_from_the_users_generator():
    assert _ids(prepare_dataloader(DataLoader(DS, batch_size=16))) == [list(range(i, i + 16)) for i in (0, 16, 32)]
    a = prepare_dataloader(DataLoader(DS, batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(7)))
    b = prepare_dataloader(DataLoader(DS, batch_size=8, shuffle=True))
    assert a.seed == 7 and b.seed == 0 and _ids(a) != _ids(b)
    assert _ids(prepare_dataloader(DataLoader(DS, batch_size=8, shuffle=True), seed=7)) == \
        _ids(prepare_dataloader(DataLoader(DS, batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(7))))


def test_resume_mid_epoch_starts_on_the_next_batch_even_on_another_rank_count():
    full = prepare_dataloader(DataLoader(DS, batch_size=8, shuffle=True))
    want = _ids(full) + _ids(full)  # epochs 0 and 1
    # two emulated ranks stop after 2 batches each (2 x 4 x 2 = 16 samples of epoch 0) ...
    r = [prepare_dataloader(DataLoader(DS, batch_size=4, shuffle=True), rank=i, world=2) for i in (0, 1)]
    its = [iter(x) for x in r]
    for _ in range(2):
        for it in its:
            next(it)
    state = r[0].state_dict()
    assert state == r[1].state_dict() == {"epoch": 0, "samples": 16, "seed": 0, "batch_size": 4, "world": 2}
    # ... and one process with batch 8 resumes on global batch 2, then runs epoch 1 in full
    one = prepare_dataloader(DataLoader(DS, batch_size=8, shuffle=True))
    one.load_state_dict(state)
    assert _ids(one) + _ids(one) == want[2:]
    # and 2 ranks resume a 2-rank position on their own shares
    r0 = prepare_dataloader(DataLoader(DS, batch_size=4, shuffle=True), rank=0, world=2)
    r1 = prepare_dataloader(DataLoader(DS, batch_size=4, shuffle=True), rank=1, world=2)
    r0.load_state_dict(state), r1.load_state_dict(state)
    assert [sorted(a + b) for a, b in zip(_ids(r0), _ids(r1))] == [sorted(b) for b in want[2:6]]


def test_a_position_that_does_not_divide_or_another_seed_is_refused():
    one = prepare_dataloader(DataLoader(DS, batch_size=8, shuffle=True))
    with pytest.raises(UserError, match="not a whole number of this run's batches"):
        one.load_state_dict({"epoch": 0, "samples": 12, "seed": 0, "batch_size": 4, "world": 3})
    with pytest.raises(UserError, match="seed=3"):
        one.load_state_dict({"epoch": 0, "samples": 8, "seed": 3, "batch_size": 8, "world": 1})
    assert one.epoch == 0 and one.batch == 0  # nothing changed


class _Stream(IterableDataset):
    def __iter__(self):
        return iter(range(4))


@pytest.mark.parametrize("loader, match", [
    (DataLoader(_Stream(), batch_size=2), "IterableDataset"),
    (DataLoader(DS, batch_size=2, sampler=RandomSampler(DS, replacement=True)), "replacement"),
    (DataLoader(DS, batch_sampler=[[0, 1], [2, 3]]), "batch_sampler"),
    (DataLoader(DS, batch_size=2, sampler=[3, 2, 1, 0]), "cannot be sharded"),
])
def test_loaders_that_cannot_be_sharded_are_refused_with_the_fix(loader, match):
    with pytest.raises(UserError, match=match):
        prepare_dataloader(loader)


def test_batches_land_on_the_device_nested_structures_kept():
    b = to_device({"x": torch.ones(2), "pair": (torch.zeros(1), "label"), "n": 3}, torch.device("meta"))
    assert b["x"].device.type == "meta" and b["pair"][0].device.type == "meta"
    assert b["pair"][1] == "label" and b["n"] == 3 and isinstance(b["pair"], tuple)


def test_acc_save_records_the_data_position_and_acc_load_resumes_on_the_next_batch(tmp_path):
    def run():
        torch.manual_seed(0)
        model = torch.nn.Linear(1, 1)
        acc = overdrive.accelerate(model, "fp32", optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                                   dataloader=DataLoader(DS, batch_size=8, shuffle=True))
        return acc

    acc = run()
    seen = []
    for x, y in acc.dataloader:
        seen.append(x.tolist())
        acc.backward(acc.model(x[:, None].float() / 48).square().mean())
        acc.step()
        if len(seen) == 3:
            acc.save(str(tmp_path / "ck"))
    rest = [x.tolist() for x, _ in acc.dataloader]  # epoch 1
    again = run()
    again.load(str(tmp_path / "ck"))
    assert (again.dataloader.epoch, again.dataloader.batch, again.steps) == (0, 3, 3)
    assert [x.tolist() for x, _ in again.dataloader] == seen[3:]
    assert [x.tolist() for x, _ in again.dataloader] == rest


def test_load_refuses_a_checkpoint_with_another_number_of_loaders(tmp_path):
    model = torch.nn.Linear(1, 1)
    acc = overdrive.accelerate(model, "fp32", dataloader=DataLoader(DS, batch_size=8))
    acc.save(str(tmp_path / "ck"))
    other = overdrive.accelerate(torch.nn.Linear(1, 1), "fp32")
    with pytest.raises(UserError, match="1 prepared DataLoader"):
        other.load(str(tmp_path / "ck"))
