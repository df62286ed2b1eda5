"""overdrive.checkpoint is the one place that reads or writes a checkpoint, and every path through it
is safe: acc.save/acc.load refuse a crafted .metadata and bit flips, never replace what they did not
write, resume exactly; a full disk, a stale .tmp and entries of the wrong type are one line."""

import ast
import errno
import os
import pickle

import pytest
import torch

import overdrive
from overdrive.checkpoint import (CheckpointError, check_checkpoint_root, clean_partial_saves, hash_files,
                                  latest_checkpoint, read_manifest, save_checkpoint, write_manifest)
from overdrive.errors import UserError
from scan import scan

# pickle.dumps only checks that a function can be sent to a worker process; nothing is loaded from a file.
_PICKLE_OK = {"dumps", "PicklingError", "HIGHEST_PROTOCOL"}


def _forbidden_calls(tree: ast.AST) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            mod, attr = node.value.id, node.attr
            if (mod == "torch" and attr == "load") or (mod == "dcp" and attr in ("load", "save")) or \
                    (mod == "pickle" and attr not in _PICKLE_OK):
                found.append(f"{mod}.{attr}")
        elif isinstance(node, ast.Name) and node.id in ("FileSystemReader", "Unpickler"):
            found.append(node.id)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = {a.name for a in node.names}
            if (node.module.startswith("torch.distributed.checkpoint") and names & {"load", "save", "FileSystemReader",
                                                                                  "state_dict_loader"}) or \
                    (node.module == "pickle" and names - _PICKLE_OK) or (node.module == "torch" and "load" in names):
                found.append(f"from {node.module} import {', '.join(sorted(names))}")
    return found


def test_no_module_outside_checkpoint_reads_or_writes_a_checkpoint():
    bad, inside = scan(_forbidden_calls, inside="checkpoint")
    assert not bad, f"checkpoint IO outside overdrive.checkpoint (route it through there): {bad}"
    # the scan can fail: it sees the calls the checkpoint package itself makes
    assert {"torch.load", "dcp.save", "dcp.load", "FileSystemReader"} <= inside


# -- acc.save / acc.load -------------------------------------------------------------------

class _Net(torch.nn.Module):
    """Tiny, with dropout: a resume that loses the RNG draws other masks and diverges."""

    def __init__(self):
        super().__init__()
        self.fc1, self.drop, self.fc2 = torch.nn.Linear(8, 16), torch.nn.Dropout(0.3), torch.nn.Linear(16, 1)

    def forward(self, x):
        return self.fc2(self.drop(torch.relu(self.fc1(x))))


def _acc(recipe="fp32", seed=0):
    torch.manual_seed(seed)
    model = _Net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    return overdrive.accelerate(model, recipe, optimizer=opt, grad_accum_steps=2,
                                scheduler=torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5))


def _batches(n):
    g = torch.Generator().manual_seed(123)
    return [(torch.randn(4, 8, generator=g), torch.randn(4, 1, generator=g)) for _ in range(n)]


def _train(acc, batches):
    losses = []
    for x, y in batches:
        loss = torch.nn.functional.mse_loss(acc.model(x).float(), y)
        acc.backward(loss)
        acc.step()
        losses.append(loss.detach().clone())
    return losses


@pytest.mark.parametrize("recipe", ["fp32", "amp-bf16", "amp-fp16"])
def test_acc_save_load_continues_bit_exactly(tmp_path, recipe):
    data = _batches(8)
    ref = _acc(recipe)
    want = _train(ref, data)
    a = _acc(recipe)
    _train(a, data[:4])
    a.save(str(tmp_path / "ck"))
    torch.manual_seed(999)  # whatever the RNG does in between is undone by the load
    torch.rand(100)
    b = _acc(recipe, seed=7)  # other initial weights: the load must replace them all
    b.load(str(tmp_path / "ck"))
    got = _train(b, data[4:])
    assert all(torch.equal(x, y) for x, y in zip(want[4:], got)), [(float(x), float(y)) for x, y in zip(want[4:], got)]
    for p, q in zip(ref.model.parameters(), b.model.parameters()):
        assert torch.equal(p, q)
    assert b.steps == ref.steps and b.scheduler.get_last_lr() == ref.scheduler.get_last_lr()
    if recipe == "amp-fp16":
        assert b.scaler.state_dict() == ref.scaler.state_dict()


def test_acc_save_without_the_rng_would_diverge(tmp_path):
    """The exactness test above can fail: without restoring the RNG the dropout masks differ."""
    data = _batches(6)
    want = _train(_acc(), data)
    a = _acc()
    _train(a, data[:2])
    a.save(str(tmp_path / "ck"))
    b = _acc()
    b.load(str(tmp_path / "ck"))
    torch.manual_seed(5)  # as if the RNG had not been restored
    got = _train(b, data[2:])
    assert not all(torch.equal(x, y) for x, y in zip(want[2:], got))


class _Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_acc_load_refuses_crafted_metadata_in_one_line(tmp_path):
    acc = _acc()
    ck = tmp_path / "ck"
    acc.save(str(ck))
    marker = tmp_path / "pwned"
    (ck / ".metadata").write_bytes(pickle.dumps(_Payload(marker)))
    info = read_manifest(str(ck))
    write_manifest(str(ck), hash_files(str(ck)), **{k: v for k, v in info.items() if k not in ("format", "files")})
    with pytest.raises(UserError, match="refused") as e:  # the manifest matches: the unpickler must hold
        _acc().load(str(ck))
    assert "\n" not in str(e.value) and not marker.exists()


def test_acc_load_refuses_a_bit_flip(tmp_path):
    acc = _acc()
    _train(acc, _batches(2))
    ck = tmp_path / "ck"
    acc.save(str(ck))
    shard = next(ck.glob("*.distcp"))
    raw = bytearray(shard.read_bytes())
    raw[len(raw) // 2] ^= 0x40
    shard.write_bytes(bytes(raw))
    with pytest.raises(UserError, match="SHA-256") as e:
        _acc().load(str(ck))
    assert "\n" not in str(e.value)


def test_acc_save_never_replaces_a_folder_it_did_not_write(tmp_path, monkeypatch):
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes.txt").write_text("mine")
    monkeypatch.chdir(work)
    acc = _acc()
    for target in (".", str(work), "notes.txt"):
        with pytest.raises(UserError, match="did not write") as e:
            acc.save(target)
        assert "\n" not in str(e.value)
    assert (work / "notes.txt").read_text() == "mine" and sorted(os.listdir(work)) == ["notes.txt"]
    with pytest.raises(UserError, match="not a checkpoint folder"):
        acc.save("/")
    (work / "empty").mkdir()  # an empty folder holds nothing to lose
    first = acc.save("empty")
    second = acc.save("empty")  # its own folder: replaced
    assert first == second and read_manifest(first)["kind"] == "accelerate"
    assert sorted(os.listdir(work)) == ["empty", "notes.txt"]  # no .tmp or .old left
    old = work / "older"  # what acc.save wrote before manifests: replaced too
    old.mkdir()
    for n in (".metadata", "__0_0.distcp", "accelerate.pt"):
        (old / n).write_bytes(b"x")
    assert read_manifest(acc.save("older"))["kind"] == "accelerate"
    (old / "notes.txt").write_text("mine")  # ...but not once it holds anything else
    os.remove(old / "manifest.json")
    with pytest.raises(UserError, match="did not write"):
        acc.save("older")


def test_acc_load_of_a_missing_or_foreign_folder_is_one_line(tmp_path):
    with pytest.raises(UserError, match="not an acc.save"):
        _acc().load(str(tmp_path / "nothing"))
    (tmp_path / "foreign").mkdir()
    with pytest.raises(UserError, match="incomplete|not an acc.save"):
        _acc().load(str(tmp_path / "foreign"))


# -- a run's checkpoints: full disk, stale .tmp, entries of the wrong type ---------------------

def _model():
    torch.manual_seed(0)
    m = torch.nn.Linear(4, 4)
    return m, torch.optim.AdamW(m.parameters())


def _save(run, step, m, opt):
    return save_checkpoint(str(run), step, m, opt, {"step": step}, rank=0, world=1, keep_last=3, run_id="r")


def test_a_full_disk_is_one_line_leaves_no_tmp_and_keeps_the_previous(tmp_path, monkeypatch):
    m, opt = _model()
    good = _save(tmp_path, 1, m, opt)
    real = torch.save

    def full(obj, f, *a, **k):
        raise OSError(errno.ENOSPC, "No space left on device", str(f))

    monkeypatch.setattr(torch, "save", full)
    with pytest.raises(CheckpointError, match="No space left on device") as e:
        _save(tmp_path, 2, m, opt)
    monkeypatch.setattr(torch, "save", real)
    assert "\n" not in str(e.value) and "intact" in str(e.value)
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["latest", "step_0000001"]
    assert latest_checkpoint(str(tmp_path), verify=True) == good


def test_stale_partial_saves_are_cleaned_and_foreign_ones_kept(tmp_path):
    m, opt = _model()

    def die(tmp):
        raise KeyboardInterrupt  # a kill between the shards and the rename

    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(str(tmp_path), 5, m, opt, {"step": 5}, rank=0, world=1, keep_last=2, run_id="r",
                        on_written=die)
    foreign = tmp_path / "checkpoints" / "step_9.tmp"
    foreign.mkdir()
    (foreign / "model.safetensors").write_text("not ours")
    gone = clean_partial_saves(str(tmp_path))
    assert gone == [str(tmp_path / "checkpoints" / "step_0000005.tmp")]
    assert (foreign / "model.safetensors").exists()


def test_latest_and_step_entries_of_the_wrong_type_are_one_line(tmp_path):
    m, opt = _model()
    root = tmp_path / "checkpoints"
    root.mkdir()
    (root / "step_0000002").write_text("a file where a checkpoint folder goes")
    with pytest.raises(CheckpointError, match="did not write") as e:
        _save(tmp_path, 2, m, opt)
    assert "\n" not in str(e.value) and (root / "step_0000002").read_text().startswith("a file")
    assert latest_checkpoint(str(tmp_path)) is None  # ignored, not a crash
    (root / "latest").mkdir()
    with pytest.raises(CheckpointError, match="latest is not the small text file"):
        check_checkpoint_root(str(tmp_path))
    assert latest_checkpoint(str(tmp_path)) is None


class _Killed(BaseException):
    """A SIGKILL stand-in: nothing in the save may catch it."""


def _kill_at_second_rename(monkeypatch):
    import overdrive.checkpoint.folder as folder
    real = os.rename

    def rename(src, dst):
        if str(src) == str(dst) + ".tmp" and os.path.isdir(str(dst) + ".old"):  # final -> .old done, not .tmp -> final
            raise _Killed
        return real(src, dst)

    monkeypatch.setattr(folder.os, "rename", rename)
    return lambda: monkeypatch.setattr(folder.os, "rename", real)


def test_a_save_killed_between_its_two_renames_loses_nothing(tmp_path, monkeypatch):
    """The old save sits in .old and the new, complete one in .tmp: load puts the newer back, and a later
    save (which clears .tmp/.old first) never deletes the only whole copy."""
    data = _batches(6)
    a = _acc()
    _train(a, data[:2])
    ck = str(tmp_path / "ck")
    a.save(ck)
    _train(a, data[2:4])
    undo = _kill_at_second_rename(monkeypatch)
    with pytest.raises(_Killed):
        a.save(ck)
    undo()
    assert not os.path.exists(ck) and os.path.isdir(ck + ".old") and os.path.isdir(ck + ".tmp")
    b = _acc(seed=7)
    b.load(ck)  # the newer save (after 4 batches) is back at ck
    assert b.steps == a.steps and all(torch.equal(p, q) for p, q in zip(a.model.parameters(), b.model.parameters()))
    assert sorted(os.listdir(tmp_path)) == ["ck", "ck.old"]
    b.save(ck)  # replaces ck and clears the stale .old
    assert sorted(os.listdir(tmp_path)) == ["ck"]


def test_a_kill_between_renames_then_another_save_keeps_a_whole_copy(tmp_path, monkeypatch):
    a = _acc()
    _train(a, _batches(2))
    ck = str(tmp_path / "ck")
    a.save(ck)
    undo = _kill_at_second_rename(monkeypatch)
    with pytest.raises(_Killed):
        a.save(ck)
    undo()
    import overdrive.checkpoint.folder as folder

    def die(tmp):
        raise _Killed  # the next save dies too, after its shards

    with pytest.raises(_Killed):
        folder.save_folder(ck, {"model": a.model.state_dict()}, {}, rank=0, world=1, info={"kind": "accelerate"},
                           on_written=die)
    assert folder.verify_folder(ck) is None  # the whole copy was put back before the .tmp/.old clean-up


def test_a_training_run_killed_between_renames_gets_its_step_back(tmp_path, monkeypatch):
    m, opt = _model()
    _save(tmp_path, 3, m, opt)
    undo = _kill_at_second_rename(monkeypatch)
    with pytest.raises(_Killed):
        _save(tmp_path, 3, m, opt)  # the same step saved again (a resumed run)
    undo()
    root = tmp_path / "checkpoints"
    assert not (root / "step_0000003").exists()
    clean_partial_saves(str(tmp_path))
    assert sorted(os.listdir(root)) == ["latest", "step_0000003"]
    assert latest_checkpoint(str(tmp_path), verify=True) == str(root / "step_0000003")
