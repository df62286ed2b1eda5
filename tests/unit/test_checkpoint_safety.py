"""Checkpoint folders as untrusted input: no code runs from them, damage is caught and skipped,
runs do not mix, one trainer per folder. Single process, tiny model: fast."""

import json
import os
import pickle
import subprocess

import pytest
import torch

from overdrive.checkpoint import (CheckpointError, latest_checkpoint, load_checkpoint, load_model_weights,
                                  resume_checkpoint, save_checkpoint, verify_checkpoint)
from overdrive.checkpoint import hash_files, write_manifest
from overdrive.train.rundir import RunDirError, RunLock, claim_run_dir


def _model(seed=0):
    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8))
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    m(torch.randn(4, 8)).square().mean().backward()
    opt.step()
    opt.zero_grad()
    return m, opt


def _save(run, step, m, opt, run_id="run-a", keep_last=5):
    return save_checkpoint(str(run), step, m, opt, {"step": step, "rng_cpu": torch.get_rng_state()}, rank=0, world=1,
                           keep_last=keep_last, run_id=run_id)


def _reseal(ck):
    """Rewrite the manifest to match the files, as anyone handing a folder around could."""
    info = json.loads((ck / "manifest.json").read_text())
    write_manifest(str(ck), hash_files(str(ck)), run_id=info["run_id"], step=info["step"], world=1)


class _Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_malicious_metadata_never_runs(tmp_path):
    m, opt = _model()
    ck = tmp_path / "run" / "checkpoints" / "step_0000001"
    _save(tmp_path / "run", 1, m, opt)
    marker = tmp_path / "pwned"
    (ck / ".metadata").write_bytes(pickle.dumps(_Payload(marker)))
    _reseal(ck)  # the manifest matches: integrity is not trust, the unpickler must hold
    assert verify_checkpoint(str(ck)) is None
    with pytest.raises(CheckpointError, match="posix.system|os.system|refused") as e:
        load_checkpoint(str(ck), *_model(1), rank=0, world=1)
    assert "\n" not in str(e.value)
    with pytest.raises(CheckpointError, match="refused"):
        load_model_weights(str(ck), _model(1)[0])
    assert not marker.exists()
    # The same payload through plain pickle would have run: the test's payload is real.
    pickle.loads(pickle.dumps(_Payload(marker)))
    assert marker.exists()


def test_round_trip_restores_model_and_optimizer(tmp_path):
    m, opt = _model(0)
    ck = _save(tmp_path, 3, m, opt)
    m2, opt2 = _model(1)
    extra = load_checkpoint(ck, m2, opt2, rank=0, world=1)
    assert extra["step"] == 3
    for a, b in zip(m.parameters(), m2.parameters()):
        assert torch.equal(a, b)
    s1, s2 = opt.state_dict()["state"], opt2.state_dict()["state"]
    assert all(torch.equal(s1[k]["exp_avg"], s2[k]["exp_avg"]) for k in s1)


@pytest.mark.parametrize("damage", ["bitflip", "truncate", "extra", "metadata"])
def test_damaged_newest_falls_back_to_intact_one(tmp_path, damage):
    m, opt = _model(0)
    good = _save(tmp_path, 1, m, opt)
    bad = _save(tmp_path, 2, m, opt)
    shard = os.path.join(bad, "__0_0.distcp")
    if damage == "bitflip":  # one bit inside tensor data: DCP alone would load it silently
        raw = bytearray(open(shard, "rb").read())
        raw[len(raw) // 2] ^= 0x01
        open(shard, "wb").write(bytes(raw))
    elif damage == "truncate":
        os.truncate(shard, os.path.getsize(shard) // 2)
    elif damage == "extra":  # extra_rank0.pt garbage, manifest resealed: the load itself must fail cleanly
        open(os.path.join(bad, "extra_rank0.pt"), "wb").write(b"garbage")
        _reseal(tmp_path / "checkpoints" / "step_0000002")
    else:  # .metadata that is not a pickle at all, resealed: DCP's CheckpointException is a BaseException
        open(os.path.join(bad, ".metadata"), "wb").write(b"\x80\x05not a pickle")
        _reseal(tmp_path / "checkpoints" / "step_0000002")
    said = []
    path, extra = resume_checkpoint(str(tmp_path), *_model(1), run_id="run-a", rank=0, world=1, say=said.append)
    assert path == good and extra["step"] == 1
    assert len(said) == 1 and bad in said[0] and good in said[0] and "\n" not in said[0]
    with pytest.raises(CheckpointError):
        load_checkpoint(bad, *_model(1), rank=0, world=1)


def test_all_damaged_is_one_error_not_a_fresh_start(tmp_path):
    m, opt = _model(0)
    ck = _save(tmp_path, 1, m, opt)
    os.truncate(os.path.join(ck, "__0_0.distcp"), 10)
    with pytest.raises(CheckpointError, match="no checkpoint .* can be used"):
        resume_checkpoint(str(tmp_path), *_model(1), run_id="run-a", rank=0, world=1, say=print)
    assert resume_checkpoint(str(tmp_path / "empty"), *_model(1), run_id=None, rank=0, world=1,
                             say=print) == (None, None)


def test_keep_last_prunes_only_this_runs_checkpoints_and_latest_stays_valid(tmp_path):
    m, opt = _model(0)
    for s in (250, 300):  # an older run that got further
        _save(tmp_path, s, m, opt, run_id="old", keep_last=2)
    for s in (50, 100, 150):
        _save(tmp_path, s, m, opt, run_id="new", keep_last=2)
    left = sorted(os.listdir(tmp_path / "checkpoints"))
    assert left == ["latest", "step_0000100", "step_0000150", "step_0000250", "step_0000300"]
    assert (tmp_path / "checkpoints" / "latest").read_text().strip() == "step_0000150"
    assert latest_checkpoint(str(tmp_path)).endswith("step_0000150")
    assert latest_checkpoint(str(tmp_path), run_id="old").endswith("step_0000300")


def test_a_killed_save_leaves_the_previous_checkpoint(tmp_path):
    m, opt = _model(0)
    _save(tmp_path, 1, m, opt)

    def die(tmp):
        raise KeyboardInterrupt  # stands in for SIGKILL between the shards and the rename

    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(str(tmp_path), 2, m, opt, {"step": 2}, rank=0, world=1, keep_last=2, run_id="run-a",
                        on_written=die)
    assert latest_checkpoint(str(tmp_path), verify=True).endswith("step_0000001")


def test_second_trainer_on_a_folder_is_refused_with_the_holder(tmp_path):
    import socket

    lock = RunLock(str(tmp_path)).acquire(print)
    try:
        with pytest.raises(RunDirError, match=f"pid {os.getpid()} on {socket.gethostname()}"):
            claim_run_dir(str(tmp_path), resume=False, overwrite=False, say=print)
    finally:
        lock.release()
    # free again: it can be taken
    claim_run_dir(str(tmp_path), resume=True, overwrite=False, say=print).lock.release()


def test_stale_lock_of_a_dead_process_is_taken_over_and_said(tmp_path):
    # What a SIGKILLed trainer leaves: the lock file still names it, and the kernel dropped its flock.
    dead = subprocess.Popen(["true"])
    dead.wait()
    (tmp_path / "run.lock").write_text(json.dumps({"pid": dead.pid, "host": "h", "started": "t"}))
    said = []
    d = claim_run_dir(str(tmp_path), resume=True, overwrite=False, say=said.append)
    d.lock.release()
    assert len(said) == 1 and "took over" in said[0] and f"pid {dead.pid}" in said[0]


def test_a_used_folder_gets_a_fresh_sibling_unless_resume_or_overwrite(tmp_path):
    run = tmp_path / "tiny"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"run_id": "old-run", "model": {}, "data": {}, "train": {}}))
    (run / "metrics.jsonl").write_text("{}\n")
    said = []
    d = claim_run_dir(str(run), resume=False, overwrite=False, say=said.append)
    d.lock.release()
    assert d.path == str(run) + "-2" and "old-run" in said[0] and "--overwrite" in said[0]
    d = claim_run_dir(str(run), resume=True, overwrite=False, say=said.append)
    d.lock.release()
    assert d.path == str(run) and d.run_id == "old-run"
    (run / "notes.txt").write_text("mine")
    d = claim_run_dir(str(run), resume=False, overwrite=True, say=said.append)
    d.lock.release()
    assert d.path == str(run) and d.run_id != "old-run"
    assert sorted(os.listdir(run)) == ["notes.txt", "run.lock"]  # only the run's own files went
    with pytest.raises(RunDirError, match="contradict"):
        claim_run_dir(str(run), resume=True, overwrite=True, say=print)
