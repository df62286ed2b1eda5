"""`overdrive train` end to end: learning, distillation, FSDP2 on 2 gloo ranks, crash-safe resume."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch

from overdrive.train import TrainHooks, TrainingDiverged, latest_checkpoint, load_config, load_exported, train

pytestmark = pytest.mark.slow

# A small, fast run: 1-layer d=32 student on the built-in stream.
BASE = ["data.builtin_tokens=200000", "train.seq_len=64", "train.global_batch=16", "train.micro_batch=8",
        "train.recipe=\"fp32\"", "train.log_every=1", "train.eval_every=0", "model.n_embd=32", "model.n_head=2",
        "model.n_layer=1", "optimizer.lr=3e-3", "optimizer.warmup_steps=5"]


def _cfg(out, *extra):
    return load_config(None, BASE + [f"train.out_dir=\"{out}\"", *extra])


def _cli(*args, env=None, timeout=300):
    return subprocess.run([sys.executable, "-m", "overdrive", "train", *args], capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ, **(env or {})))


def _torchrun(n, *args, timeout=300):
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={n}",
                           "--master_port", str(29500 + os.getpid() % 1000 + n), "-m", "overdrive", "train", *args],
                          capture_output=True, text=True, timeout=timeout, env=dict(os.environ, OMP_NUM_THREADS="1"))


def _losses(run_dir):
    """step -> loss from metrics.jsonl (the last record wins: a resumed run re-logs its steps)."""
    out = {}
    for line in open(os.path.join(run_dir, "metrics.jsonl")):
        r = json.loads(line)
        if "loss" in r:
            out[r["step"]] = r["loss"]
    return out


def _sets(out, *extra):
    return [a for kv in BASE + [f"train.out_dir=\"{out}\"", *extra] for a in ("--set", kv)]


def test_loss_falls_on_builtin_task(tmp_path):
    res = train(_cfg(tmp_path / "r", "train.steps=60", "train.eval_every=60"), quiet=True)
    assert res.losses[-1] < res.losses[0] - 1.5  # from ~5.5 (uniform over 256) to below ln(48) = 3.87
    assert res.final_val_loss < 3.8


def test_distilled_student_beats_plain_student(tmp_path):
    common = ["train.steps=120", "train.micro_batch=16", "train.eval_every=120", "train.eval_batches=8"]
    plain = train(_cfg(tmp_path / "plain", *common), quiet=True)
    kd = train(_cfg(tmp_path / "kd", *common, "teacher.size=\"cpu-student\"", "teacher.train_steps=300",
                    "teacher.alpha=0.5", "teacher.temperature=1.0"), quiet=True)
    assert kd.final_val_loss < plain.final_val_loss - 0.03, (kd.final_val_loss, plain.final_val_loss)


def test_fsdp2_two_ranks_match_one_and_resume_across_world_sizes(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    args = ["--set", "train.steps=40", "--set", "train.checkpoint_every=20", "--set", "train.keep_last=2"]
    cp = _cli("examples/tiny.toml", *_sets(one), *args)
    assert cp.returncode == 0, cp.stderr[-2000:]
    cp = _torchrun(2, "examples/tiny.toml", *_sets(two), *args)
    assert cp.returncode == 0, cp.stderr[-3000:]
    l1, l2 = _losses(one), _losses(two)
    assert sorted(l1) == sorted(l2) == list(range(1, 41))
    # FSDP2 over gloo reduces gradients in another order: equal to float32 rounding.
    assert max(abs(l1[s] - l2[s]) for s in l1) < 1e-4
    # The 2-rank checkpoint at step 20 resumes on 2 ranks and on 1, landing where the full run did.
    for n, name in ((2, "again2"), (1, "again1")):
        d = tmp_path / name
        shutil.copytree(two, d)
        shutil.rmtree(d / "checkpoints" / "step_0000040")
        (d / "checkpoints" / "latest").write_text("step_0000020\n")
        os.remove(d / "metrics.jsonl")
        cp = (_torchrun(2, "examples/tiny.toml", *_sets(d), *args, "--resume") if n == 2 else
              _cli("examples/tiny.toml", *_sets(d), *args, "--resume"))
        assert cp.returncode == 0, cp.stderr[-3000:]
        lr = _losses(d)
        assert min(lr) == 21 and max(abs(lr[s] - l2[s]) for s in lr) < 1e-4, (n, lr)


def _wait_for(pred, proc, timeout=120):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if pred():
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.05)
    return False


def test_sigkill_during_training_then_resume_matches(tmp_path):
    ref, crash = tmp_path / "ref", tmp_path / "crash"
    args = ["--set", "train.steps=50", "--set", "train.checkpoint_every=10"]
    assert _cli("examples/tiny.toml", *_sets(ref), *args).returncode == 0
    p = subprocess.Popen([sys.executable, "-m", "overdrive", "train", "examples/tiny.toml", *_sets(crash), *args],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    metrics = crash / "metrics.jsonl"
    ok = _wait_for(lambda: metrics.exists() and len(metrics.read_text().splitlines()) >= 25, p)
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert ok, "training did not reach step 25"
    assert latest_checkpoint(str(crash)) is not None
    cp = _cli("examples/tiny.toml", *_sets(crash), *args, "--resume")
    assert cp.returncode == 0, cp.stderr[-2000:]
    a, b = _losses(ref), _losses(crash)
    assert sorted(b) == list(range(1, 51))
    assert max(abs(a[s] - b[s]) for s in a) < 1e-6


# The test passes its fault in: a save that sleeps once its shards are written, before the rename.
_SLOW_SAVE = ("import sys, time; from overdrive.train import TrainHooks, load_config, train; "
              "cfg = load_config(sys.argv[1], sys.argv[2:]); "
              "train(cfg, resume=True, hooks=TrainHooks(on_checkpoint_written=lambda tmp: time.sleep(3)))")


def test_sigkill_during_save_leaves_a_loadable_checkpoint(tmp_path):
    run = tmp_path / "r"
    sets = BASE + [f"train.out_dir=\"{run}\"", "train.steps=30", "train.checkpoint_every=10", "train.keep_last=3"]
    p = subprocess.Popen([sys.executable, "-c", _SLOW_SAVE, "examples/tiny.toml", *sets],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ok = _wait_for(lambda: (run / "checkpoints" / "step_0000020.tmp" / "extra_rank0.pt").exists(), p)
    time.sleep(0.5)  # inside the save: shards written, not yet renamed into place
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert ok
    assert latest_checkpoint(str(run)).endswith("step_0000010")
    args = ["--set", "train.steps=30", "--set", "train.checkpoint_every=10", "--set", "train.keep_last=3"]
    cp = _cli("examples/tiny.toml", *_sets(run), *args, "--resume")
    assert cp.returncode == 0 and latest_checkpoint(str(run)).endswith("step_0000030")
    assert "took over the lock" in cp.stderr  # the killed trainer's lock, said once
    # the stale .tmp of the killed save was replaced by a complete step 20
    assert not (run / "checkpoints" / "step_0000020.tmp").exists()
    assert (run / "checkpoints" / "step_0000020" / ".metadata").exists()


def test_export_and_weights_only_load(tmp_path):
    run = tmp_path / "r"
    assert _cli("examples/tiny.toml", *_sets(run), "--set", "train.steps=10").returncode == 0
    out = tmp_path / "model.pt"
    cp = _cli("examples/tiny.toml", *_sets(run), "--export", str(out))
    assert cp.returncode == 0 and out.exists()
    from overdrive.models import GPT, gpt_config

    m = load_exported(str(out), GPT(gpt_config("tiny", n_embd=32, n_head=2, n_layer=1, block_size=64)))
    assert torch.isfinite(m(torch.randint(0, 256, (1, 8)))[0]).all()
    (tmp_path / "bad.pt").write_bytes(b"not a checkpoint")
    from overdrive.train import CheckpointError

    with pytest.raises(CheckpointError, match="cannot load"):
        load_exported(str(tmp_path / "bad.pt"), m)


def test_bad_input_messages_and_exit_codes(tmp_path):
    cp = _cli("examples/tiny.toml", "--set", "model.n_layers=3")
    assert cp.returncode == 2 and "unknown key 'model.n_layers'" in cp.stderr and "Traceback" not in cp.stderr
    cp = _cli("examples/tiny.toml", "--set", "data.train=\"/nonexistent.txt\"")
    assert cp.returncode == 2 and "does not exist" in cp.stderr
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    cp = _cli("examples/tiny.toml", "--set", f"data.train=\"{empty}\"")
    assert cp.returncode == 2 and "is empty" in cp.stderr
    cp = _cli("examples/tiny.toml", "--set", "train.global_batch=12", "--set", "train.micro_batch=8")
    assert cp.returncode == 2 and "not a multiple of train.micro_batch" in cp.stderr


def test_world_size_must_divide_the_batch(monkeypatch, tmp_path):
    from overdrive.train import trainer

    monkeypatch.setattr(trainer, "dist_setup", lambda force=False, timeout_s=0: (0, 2, "cpu"))
    with pytest.raises(ValueError, match="does not divide by the world size 2"):
        train(_cfg(tmp_path, "train.global_batch=15", "train.micro_batch=5"), quiet=True)


def test_nan_loss_stops_and_names_the_last_good_checkpoint(tmp_path, monkeypatch, capsys):
    run = tmp_path / "r"
    real = train
    # The CLI path (exit code 3, one line), with the fault passed in by the test.
    monkeypatch.setattr("overdrive.train.train",
                        lambda cfg, **kw: real(cfg, **kw, hooks=TrainHooks(nan_loss_at=16)))
    from overdrive.cli import main

    code = main(["train", "examples/tiny.toml", *_sets(run), "--set", "train.steps=30", "--set",
                 "train.checkpoint_every=10"])
    err = capsys.readouterr().err
    assert code == 3 and "loss became nan at step 16" in err and "step_0000010" in err, err
    assert latest_checkpoint(str(run)).endswith("step_0000010")


def test_nan_gradient_with_finite_loss_never_reaches_the_optimizer_or_a_checkpoint(tmp_path):
    run = tmp_path / "r"
    cfg = _cfg(run, "train.steps=12", "train.checkpoint_every=4", "train.log_every=1")
    with pytest.raises(TrainingDiverged) as e:
        train(cfg, quiet=True, hooks=TrainHooks(nan_grad_at=6))
    msg = str(e.value)
    assert "gradient norm became nan" in msg and "at step 6" in msg and "step_0000004" in msg, msg
    # the log counts the same way: step 5 is the last logged step
    assert max(_losses(run)) == 5
    ck = latest_checkpoint(str(run), verify=True)
    assert ck.endswith("step_0000004")
    from overdrive.checkpoint import load_model_weights
    from overdrive.train.weights import build_model

    m = build_model(cfg, 256)
    load_model_weights(ck, m)
    assert all(torch.isfinite(p).all() for p in m.parameters())


def test_grad_clip_zero_still_catches_a_nan_gradient(tmp_path):
    cfg = _cfg(tmp_path / "r", "train.steps=4", "train.checkpoint_every=0", "optimizer.grad_clip=0")
    with pytest.raises(TrainingDiverged, match="gradient norm became nan at step 2"):
        train(cfg, quiet=True, hooks=TrainHooks(nan_grad_at=2))


def test_fp16_scaler_skips_a_nan_step(tmp_path):
    res = train(_cfg(tmp_path / "r", "train.steps=8", "train.recipe=\"amp-fp16\"", "train.checkpoint_every=0"),
                quiet=True, hooks=TrainHooks(nan_loss_at=4))
    assert len(res.losses) == 8 and res.losses[-1] < res.losses[0]


def test_readme_sequence_keeps_runs_apart(tmp_path):
    """fp32, then another recipe, in the same out_dir: the second run goes to a fresh folder, says so, and
    resume/export/keep_last/metrics each see one run."""
    run = tmp_path / "tiny"
    a = train(_cfg(run, "train.steps=6", "train.checkpoint_every=2", "train.keep_last=2"), quiet=True)
    b = train(_cfg(run, "train.steps=4", "train.checkpoint_every=2", "train.keep_last=2", "optimizer.lr=1e-3"),
              quiet=True)
    assert a.run_dir == str(run) and b.run_dir == str(run) + "-2"
    assert any("this run writes to" in n for n in b.notes)
    assert sorted(os.listdir(run / "checkpoints")) == ["latest", "step_0000004", "step_0000006"]
    assert max(_losses(run)) == 6 and max(_losses(b.run_dir)) == 4
    again = train(_cfg(run, "train.steps=6"), resume=True, quiet=True)
    assert again.losses == [] and again.run_dir == str(run)  # "already finished" is true of this run
    c = train(_cfg(run, "train.steps=3", "train.checkpoint_every=0"), overwrite=True, quiet=True)
    assert c.run_dir == str(run) and sorted(os.listdir(run / "checkpoints")) == ["latest", "step_0000003"]
    assert max(_losses(run)) == 3 and any("--overwrite" in n for n in c.notes)


def test_outputs_are_checked_before_the_work(tmp_path, capsys):
    from overdrive.cli import main

    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert main(["train", "examples/tiny.toml", *_sets(blocker / "run"), "--set", "train.steps=5"]) == 2
    assert "train.out_dir" in capsys.readouterr().err
    run = tmp_path / "r"
    run.mkdir()
    (run / "checkpoints").write_text("not a folder")  # checkpoints/ cannot be written: refused at once
    assert main(["train", "examples/tiny.toml", *_sets(run), "--set", "train.steps=5", "--resume"]) == 2
    assert "checkpoints" in capsys.readouterr().err and not (run / "metrics.jsonl").exists()
    assert main(["train", "examples/tiny.toml", *_sets(run), "--export", str(blocker / "model.pt")]) == 2
    assert "--export" in capsys.readouterr().err


def test_a_batch_beyond_memory_is_refused_with_the_estimate(tmp_path):
    with pytest.raises(ValueError, match=r"needs at least [\d.]+ GiB .* lower train.micro_batch"):
        train(_cfg(tmp_path / "r", "train.global_batch=1000000", "train.micro_batch=1000000"), quiet=True)
    assert not (tmp_path / "r").exists()
