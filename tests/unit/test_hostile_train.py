"""Hostile pass on train and acc.save/acc.load (issue 41): `--resume` in a folder with no run touches
nothing, two processes saving to one folder never mix, a kill while a save cleans up never blocks the
next save, and every field read back from a resealed extra file is checked."""

from __future__ import annotations

import json
import os
import re

import pytest
import torch

import overdrive
from overdrive.checkpoint import hash_files, read_manifest, write_manifest
from overdrive.checkpoint.safe import load_tensors, save_tensors
from overdrive.cli import main
from overdrive.errors import UserError

TINY = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "tiny.toml")


def _one_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("overdrive: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


# --- Critical 4: --resume where there is no run -----------------------------------------------------

def test_resume_in_a_folder_of_the_users_files_is_refused_and_touches_nothing(tmp_path, capsys):
    d = tmp_path / "mine"
    d.mkdir()
    (d / "config.json").write_text('{"my": "settings"}')
    (d / "metrics.jsonl").write_text('{"mine": 1}\n')
    before = {n: (d / n).read_bytes() for n in os.listdir(d)}
    argv = ["train", TINY, "--set", f'train.out_dir="{d}"', "--set", "train.steps=2", "--resume"]
    assert main(argv) == 2
    assert "holds no overdrive run to continue" in _one_line(capsys)
    assert {n: (d / n).read_bytes() for n in os.listdir(d)} == before  # no run.lock either


def test_a_folder_of_the_users_files_without_resume_gets_a_sibling_and_no_lock_file(tmp_path):
    from overdrive.train.rundir import claim_run_dir

    d = tmp_path / "mine"
    d.mkdir()
    (d / "notes.txt").write_text("mine")
    said = []
    got = claim_run_dir(str(d), resume=False, overwrite=False, say=said.append)
    got.lock.release()
    assert got.path == f"{d}-2" and os.listdir(d) == ["notes.txt"] and "no overdrive run" in said[0]


# --- Critical 5: two processes acc.save to one folder -------------------------------------------------

class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.fc(x)


def _acc(seed=0, recipe="fp32"):
    torch.manual_seed(seed)
    m = _Net()
    return overdrive.accelerate(m, recipe, optimizer=torch.optim.SGD(m.parameters(), lr=0.1))


def test_a_second_save_to_a_folder_being_saved_is_refused_and_the_first_is_whole(tmp_path, monkeypatch):
    from overdrive.checkpoint import accel

    a, b = _acc(0), _acc(1)
    a.steps, b.steps = 7, 99
    target = str(tmp_path / "ck")
    real, seen = accel.save_folder, []

    def racing(path, *args, **kw):  # another process saves to the same folder while this one writes
        if not seen:
            seen.append(1)
            with pytest.raises(UserError, match=r"in use by another process saving there \(pid") as e:
                b.save(target)
            assert "\n" not in str(e.value)
        return real(path, *args, **kw)

    monkeypatch.setattr(accel, "save_folder", racing)
    a.save(target)
    assert seen and sorted(os.listdir(tmp_path)) == ["ck"]  # no lock file, .tmp or .old left
    c = _acc(2)
    c.load(target)
    assert c.steps == 7 and torch.equal(c.model.fc.weight, a.model.fc.weight)  # one process's save, whole


def test_a_kill_while_a_save_removes_the_previous_copy_never_blocks_later_saves(tmp_path, monkeypatch):
    acc = _acc()
    target = str(tmp_path / "ck")
    acc.save(target)
    real_unlink, real_rmdir, armed = os.unlink, os.rmdir, []

    def unlink(p, *a, **kw):
        if armed == [True]:
            armed.append("killed")
            raise KeyboardInterrupt  # the kill lands on the first removal after the manifest's
        real_unlink(p, *a, **kw)
        if os.path.basename(os.fspath(p)) == "manifest.json" and not armed:
            armed.append(True)

    def rmdir(p, *a, **kw):
        if armed == [True]:
            armed.append("killed")
            raise KeyboardInterrupt
        real_rmdir(p, *a, **kw)

    monkeypatch.setattr(os, "unlink", unlink)
    monkeypatch.setattr(os, "remove", unlink)
    monkeypatch.setattr(os, "rmdir", rmdir)
    acc.steps = 3
    with pytest.raises(KeyboardInterrupt):
        acc.save(target)
    monkeypatch.undo()
    assert armed == [True, "killed"]
    acc.steps = 5
    acc.save(target)  # the next save cleans what the kill left
    again = _acc(3)
    again.load(target)
    assert again.steps == 5 and not os.path.exists(target + ".old")


# --- Major: every field of a resealed extra file is checked --------------------------------------------

@pytest.mark.parametrize("field,value", [("steps", -100), ("steps", "7"), ("steps", 10 ** 30), ("micro", None),
                                         ("skipped", -1), ("world", 0), ("scaler", [1]), (None, None)])
def test_a_resealed_extra_file_with_a_wrong_field_is_one_line_and_changes_nothing(tmp_path, field, value):
    acc = _acc()
    acc.steps = 4
    ck = acc.save(str(tmp_path / "ck"))
    p = os.path.join(ck, "extra_rank0.pt")
    extra = load_tensors(p)
    if field is None:
        del extra["steps"]
    else:
        extra[field] = value
    save_tensors(p, extra)
    info = read_manifest(ck)
    write_manifest(ck, hash_files(ck), **{k: v for k, v in info.items() if k not in ("files", "format")})
    other = _acc(1)
    before = other.model.fc.weight.detach().clone()
    with pytest.raises(UserError, match="extra_rank0.pt holds .*the file was edited") as e:
        other.load(ck)
    assert "\n" not in str(e.value) and other.steps == 0 and torch.equal(other.model.fc.weight, before)


# --- Minor: paths that are not checkpoint folders -------------------------------------------------------

def test_acc_load_of_nothing_or_the_root_and_acc_save_of_home_are_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    acc = _acc()
    acc.save("ck")
    monkeypatch.chdir(os.path.join(tmp_path, "ck"))  # the working folder is a checkpoint: never loaded by ""
    for p in ("", "/"):
        with pytest.raises(UserError):
            acc.load(p)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    with pytest.raises(UserError, match="home folder"):
        acc.save("~")
    assert not os.path.exists(os.path.join(tmp_path, "ck", "~"))


# --- Major: train --resume reads back only a step count it can trust ----------------------------------------

@pytest.mark.parametrize("step", [-100, "2", None, 2.5])
def test_a_resealed_train_checkpoint_with_a_bad_step_is_damaged_and_the_previous_one_resumes(tmp_path, step):
    from overdrive.checkpoint import resume_checkpoint, save_checkpoint
    from overdrive.checkpoint.rng import rng_state

    def model(seed):
        torch.manual_seed(seed)
        m = torch.nn.Linear(4, 2)
        return m, torch.optim.SGD(m.parameters(), lr=0.1)

    m, opt = model(0)
    for n in (1, 2):
        bad = save_checkpoint(str(tmp_path), n, m, opt, {"step": n, "rng": rng_state()}, rank=0, world=1, keep_last=3,
                              run_id="run-a")
    p = os.path.join(bad, "extra_rank0.pt")
    extra = load_tensors(p)
    if step is None:
        del extra["step"]
    else:
        extra["step"] = step
    save_tensors(p, extra)
    info = read_manifest(bad)
    write_manifest(bad, hash_files(bad), **{k: v for k, v in info.items() if k not in ("files", "format")})
    said = []
    path, got = resume_checkpoint(str(tmp_path), *model(1), run_id="run-a", rank=0, world=1, say=said.append)
    assert got["step"] == 1 and path != bad
    assert len(said) == 1 and "extra_rank0.pt holds step" in said[0] and "\n" not in said[0]


def test_grad_accum_steps_must_be_a_whole_number():
    for bad in (2.5, 0, True, "2"):
        with pytest.raises(UserError, match="grad_accum_steps"):
            overdrive.accelerate(_Net(), "fp32", optimizer=torch.optim.SGD(_Net().parameters(), lr=0.1),
                                 grad_accum_steps=bad)


def test_a_nan_loss_in_fp32_skips_the_step_instead_of_poisoning_every_parameter():
    acc = _acc()
    before = [p.detach().clone() for p in acc.model.parameters()]
    loss = acc.model(torch.randn(3, 4)).sum() * float("nan")
    acc.backward(loss)
    out = acc.step()
    assert out["skipped"] is True and not out["stepped"] and acc.skipped_steps == 1
    assert all(torch.equal(a, b) for a, b in zip(before, acc.model.parameters()))
    acc.backward(acc.model(torch.randn(3, 4)).square().mean())  # the next finite step steps
    assert acc.step()["stepped"] and not all(torch.equal(a, b) for a, b in zip(before, acc.model.parameters()))


def test_fp32_and_amp_fp16_loads_say_what_happened_to_the_loss_scale(tmp_path):
    import logging

    a = _acc(recipe="fp32")
    ck = a.save(str(tmp_path / "ck"))
    b = _acc(recipe="amp-fp16")
    if b.scaler is None:
        pytest.skip("amp-fp16 resolves to no GradScaler on this machine")
    said = []
    h = logging.Handler()
    h.emit = lambda r: said.append(r.getMessage())
    logging.getLogger("overdrive").addHandler(h)
    try:
        b.load(ck)
    finally:
        logging.getLogger("overdrive").removeHandler(h)
    assert any("saved without a GradScaler" in m for m in said), said


def test_acc_load_into_a_smaller_model_is_refused_not_a_silent_prefix_load(tmp_path):
    big = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    acc = overdrive.accelerate(big, "fp32", optimizer=torch.optim.SGD(big.parameters(), lr=0.1))
    ck = acc.save(str(tmp_path / "ck"))
    small = torch.nn.Sequential(torch.nn.Linear(4, 4))
    before = small[0].weight.detach().clone()
    other = overdrive.accelerate(small, "fp32", optimizer=torch.optim.SGD(small.parameters(), lr=0.1))
    with pytest.raises(UserError, match=r"holds 2 model tensor\(s\) this one lacks \(1.bias, 1.weight\)"):
        other.load(ck)
    assert torch.equal(small[0].weight, before)
    same = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    overdrive.accelerate(same, "fp32", optimizer=torch.optim.SGD(same.parameters(), lr=0.1)).load(ck)
    assert torch.equal(same[1].weight, big[1].weight)


# --- Major: SIGTERM during first-run probing leaves no probe running ------------------------------------

def _children(pid: int) -> list[int]:
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                stat = open(f"/proc/{d}/stat").read()
                cmd = open(f"/proc/{d}/cmdline").read()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid and "overdrive.env._probes" in cmd:
                out.append(int(d))
    return out


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc")
def test_sigterm_while_probing_ends_the_probe_processes_too(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    # The compile probe runs torch.compile: seconds on a CPU, long enough to be caught mid-way.
    parent = subprocess.Popen([sys.executable, "-c", "from overdrive.env.probing import run_probe\n"
                               "run_probe('compile', timeout=120)"])
    kids: list[int] = []
    try:
        t0 = time.time()
        while not kids and time.time() - t0 < 60:
            kids[:] = _children(parent.pid)
            time.sleep(0.05)
        assert kids, "the probe never started"
        time.sleep(0.5)  # past the probe's start-up, inside its work
        parent.send_signal(signal.SIGTERM)
        parent.wait(timeout=30)
        t0 = time.time()
        while any(os.path.exists(f"/proc/{k}") and "Z" not in open(f"/proc/{k}/stat").read().rsplit(")", 1)[1][:3]
                  for k in kids) and time.time() - t0 < 5:
            time.sleep(0.05)
        alive = [k for k in kids if os.path.exists(f"/proc/{k}")
                 and "Z" not in open(f"/proc/{k}/stat").read().rsplit(")", 1)[1][:3]]
        assert not alive, f"probe processes {alive} outlived their parent"
    finally:
        for k in kids:
            try:
                os.kill(k, signal.SIGKILL)  # a probe this test started (the old code left it running)
            except ProcessLookupError:
                pass
        parent.kill()


# --- Minor: absurd or empty train settings, a manifest field of the wrong type ------------------------------

@pytest.mark.parametrize("kv,says", [("train.eval_batches=100000000", "at most 4,096"),
                                     ('train.out_dir=""', "'train.out_dir' is empty")])
def test_unbounded_eval_batches_and_an_empty_out_dir_are_one_line(tmp_path, capsys, kv, says):
    assert main(["train", TINY, "--set", kv, "--set", f'train.out_dir="{tmp_path / "r"}"' if "out_dir" not in kv
                 else "train.steps=2"]) == 2
    assert says in _one_line(capsys)


def test_a_manifest_size_given_as_a_string_is_malformed_not_a_size_mismatch(tmp_path):
    acc = _acc()
    ck = acc.save(str(tmp_path / "ck"))
    m = json.load(open(os.path.join(ck, "manifest.json")))
    n = next(iter(m["files"]))
    m["files"][n]["bytes"] = str(m["files"][n]["bytes"])
    with open(os.path.join(ck, "manifest.json"), "w") as f:
        json.dump(m, f)
    with pytest.raises(UserError, match=f"manifest entry '{re.escape(n)}' is malformed") as e:
        _acc(1).load(ck)
    assert "the manifest says" not in str(e.value)


def test_a_really_full_disk_during_acc_save_is_a_sentence_not_a_tuple_repr(tmp_path):
    import subprocess
    import sys

    code = ("import resource, signal, sys, torch, overdrive\nsignal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
            "m = torch.nn.Linear(200, 200)\n"
            "acc = overdrive.accelerate(m, 'fp32', optimizer=torch.optim.SGD(m.parameters(), lr=0.1))\n"
            f"acc.save({str(tmp_path / 'ck')!r})\n"
            "resource.setrlimit(resource.RLIMIT_FSIZE, (50_000, 50_000))  # the weights need 160 kB\n"
            f"try:\n    acc.save({str(tmp_path / 'ck')!r})\nexcept Exception as e:\n    print(str(e))\n")
    cp = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    msg = cp.stdout.strip().splitlines()[-1]
    assert "cannot write checkpoint" in msg and "(RuntimeError(" not in msg and "FrameSummary" not in msg, msg
    assert "disk full" in msg or "File too large" in msg, msg
    assert os.listdir(tmp_path) == ["ck"]  # the previous save kept, no .tmp left


# --- Hostile pass 2: the RNG state and the loader count of a resealed extra file, checked before loading ---

@pytest.mark.parametrize("tamper", ["rng_empty", "rng_python", "rng_numpy", "loaders"])
def test_a_resealed_rng_state_or_loader_count_is_one_line_and_leaves_the_model_alone(tmp_path, tamper):
    acc = _acc()
    acc.steps = 4
    ck = acc.save(str(tmp_path / "ck"))
    p = os.path.join(ck, "extra_rank0.pt")
    extra = load_tensors(p)
    if tamper == "rng_empty":
        extra["rng"] = {}
    elif tamper == "rng_python":
        extra["rng"]["python"] = [1, 2]
    elif tamper == "rng_numpy":
        extra["rng"]["numpy"] = {"a": 1}
    else:
        extra["dataloaders"] = [{"epoch": 0}]
    save_tensors(p, extra)
    info = read_manifest(ck)
    write_manifest(ck, hash_files(ck), **{k: v for k, v in info.items() if k not in ("files", "format")})
    other = _acc(1)
    before = other.model.fc.weight.detach().clone()
    rng = torch.get_rng_state()
    with pytest.raises(UserError, match="RNG state that does not restore|positions of 1 prepared") as e:
        other.load(ck)
    assert "\n" not in str(e.value) and "UserError" not in str(e.value)
    assert torch.equal(other.model.fc.weight, before) and other.steps == 0  # nothing changed
    assert torch.equal(torch.get_rng_state(), rng)


@pytest.mark.parametrize("flag", ["--resume", "--overwrite"])
def test_another_tools_config_json_with_a_run_id_is_not_a_run_to_resume_or_delete(tmp_path, capsys, flag):
    """A folder of the user's whose config.json (W&B, MLflow, their own) carries a "run_id" of its own:
    --resume must not overwrite it and append to their metrics.jsonl, --overwrite must not delete them."""
    d = tmp_path / "mine"
    d.mkdir()
    (d / "config.json").write_text('{"run_id": "wandb-7f3a", "model": "theirs", "lr": 0.1}')
    (d / "metrics.jsonl").write_text('{"mine": 1}\n')
    before = {n: (d / n).read_bytes() for n in os.listdir(d)}
    argv = ["train", TINY, "--set", f'train.out_dir="{d}"', "--set", "train.steps=1", flag]
    assert main(argv) == 2
    assert "holds no overdrive run" in _one_line(capsys)
    assert {n: (d / n).read_bytes() for n in os.listdir(d)} == before


def test_a_file_of_the_users_where_acc_save_puts_its_lock_is_refused_not_truncated_and_deleted(tmp_path):
    mine = tmp_path / ".ck.lock"
    mine.write_text("my lock notes\n")
    acc = _acc()
    with pytest.raises(UserError, match="overdrive did not write"):
        acc.save(str(tmp_path / "ck"))
    assert mine.read_text() == "my lock notes\n" and sorted(os.listdir(tmp_path)) == [".ck.lock"]
    mine.write_text(json.dumps({"pid": 999999, "host": "h", "started": "t"}))  # ours, left by a killed save
    acc.save(str(tmp_path / "ck"))
    assert sorted(os.listdir(tmp_path)) == ["ck"]


def test_resume_never_appends_through_a_metrics_jsonl_link_outside_the_run(tmp_path, capsys):
    run, victim = tmp_path / "run", tmp_path / "victim.txt"
    argv = ["train", TINY, "--set", f'train.out_dir="{run}"', "--set", "train.steps=1"]
    assert main(argv) == 0
    victim.write_text("victim\n")
    (run / "metrics.jsonl").unlink()
    (run / "metrics.jsonl").symlink_to(victim)
    capsys.readouterr()
    assert main(argv[:-1] + ["train.steps=2", "--resume"]) == 2
    assert "metrics.jsonl is a symbolic link" in _one_line(capsys)
    assert victim.read_text() == "victim\n"
