"""`train --resume` continues bit-exactly (dropout on, fp32 / bf16 / fp16, the scaler by its state_dict,
every RNG, the data position), SIGTERM saves at the step boundary and stops, a resume with other
settings is refused unless allowed, and --overwrite deletes only what the run wrote."""

import os
import signal
import subprocess
import sys

import pytest
import torch

from overdrive.models import GPT, gpt_config
from overdrive.train import (RunDirError, RunMismatch, TrainHooks, TrainingInterrupted, latest_checkpoint, load_config,
                             train)
from overdrive.checkpoint import load_model_weights

# Tiny (bf16/fp16 matmuls are ~70x slower than fp32 on AVX2-only CPUs): 1 layer, d=16, 2 micro-batches.
TINY = ["data.builtin_tokens=20000", "train.seq_len=16", "train.global_batch=4", "train.micro_batch=2",
        "train.log_every=1", "train.eval_every=0", "model.n_embd=16", "model.n_head=2", "model.n_layer=1",
        "model.dropout=0.2", "optimizer.lr=3e-3", "optimizer.warmup_steps=2", "train.steps=6",
        "train.checkpoint_every=0"]


def _cfg(out, *extra):
    return load_config(None, TINY + [f"train.out_dir=\"{out}\"", *extra])


def _sigterm_at(step):
    return TrainHooks(on_step=lambda done: os.kill(os.getpid(), signal.SIGTERM) if done == step else None)


def _weights(run_dir):
    m = GPT(gpt_config("tiny", n_embd=16, n_head=2, n_layer=1, block_size=16, dropout=0.2))
    load_model_weights(latest_checkpoint(str(run_dir), verify=True), m)
    return m.state_dict()


@pytest.mark.parametrize("recipe", ["fp32", "amp-bf16", "amp-fp16"])
def test_sigterm_then_resume_continues_bit_exactly(tmp_path, recipe):
    sets = [f"train.recipe=\"{recipe}\""]
    ref = train(_cfg(tmp_path / "ref", *sets), quiet=True)
    with pytest.raises(TrainingInterrupted, match="stopped by SIGTERM after step 3: saved .*step_0000003") as e:
        train(_cfg(tmp_path / "cut", *sets), quiet=True, hooks=_sigterm_at(3))
    assert e.value.signum == signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handler is gone with the run
    res = train(_cfg(tmp_path / "cut", *sets), resume=True, quiet=True)
    assert res.resumed_from == 3
    assert res.losses == ref.losses[3:]  # floats, compared exactly
    a, b = _weights(tmp_path / "ref"), _weights(tmp_path / "cut")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_resume_without_the_saved_rng_would_differ(tmp_path, monkeypatch):
    """The exactness test can fail: with dropout, a resume that keeps the current RNG draws other masks."""
    ref = train(_cfg(tmp_path / "ref"), quiet=True)
    with pytest.raises(TrainingInterrupted):
        train(_cfg(tmp_path / "cut"), quiet=True, hooks=_sigterm_at(3))
    import overdrive.train.trainer as trainer

    monkeypatch.setattr(trainer, "set_rng_state", lambda state: [])
    res = train(_cfg(tmp_path / "cut"), resume=True, quiet=True)
    assert res.losses != ref.losses[3:]


def test_resume_with_other_settings_is_refused_naming_them(tmp_path):
    train(_cfg(tmp_path / "r", "train.steps=2"), quiet=True)
    for change, named in (("train.seed=1", "seed: 0 -> 1"), ("train.global_batch=8", "global_batch: 4 -> 8"),
                          ("optimizer.lr=1e-2", "optimizer.lr: 0.003 -> 0.01"),
                          ("model.norm=\"rmsnorm\"", "model.norm: 'layernorm' -> 'rmsnorm'")):
        with pytest.raises(RunMismatch, match="--allow-changes") as e:
            train(_cfg(tmp_path / "r", "train.steps=3", change), resume=True, quiet=True)
        assert named in str(e.value) and "\n" not in str(e.value)
    from overdrive.cli import main

    args = [a for kv in TINY + [f"train.out_dir=\"{tmp_path / 'r'}\"", "train.steps=3", "train.seed=1"]
            for a in ("--set", kv)]
    assert main(["train", "examples/tiny.toml", *args, "--resume"]) == 2  # one line, exit 2
    # more steps is not another run; an allowed change is said
    res = train(_cfg(tmp_path / "r", "train.steps=3", "optimizer.lr=1e-2"), resume=True, quiet=True,
                allow_changes=True)
    assert res.resumed_from == 2 and any("optimizer.lr: 0.003 -> 0.01" in n for n in res.notes)


def test_overwrite_deletes_only_what_the_run_wrote(tmp_path):
    foreign = tmp_path / "foreign"
    (foreign / "checkpoints" / "hf").mkdir(parents=True)
    (foreign / "checkpoints" / "hf" / "model.safetensors").write_text("another tool's")
    (foreign / "config.json").write_text('{"model_type": "gpt2"}')
    (foreign / "teacher").mkdir()
    with pytest.raises(RunDirError, match="holds no overdrive run") as e:
        train(_cfg(foreign, "train.steps=1"), overwrite=True, quiet=True)
    assert "\n" not in str(e.value)
    assert (foreign / "checkpoints" / "hf" / "model.safetensors").exists() and (foreign / "teacher").is_dir()
    assert (foreign / "config.json").read_text() == '{"model_type": "gpt2"}'
    ours = tmp_path / "ours"
    train(_cfg(ours, "train.steps=2"), quiet=True)
    (ours / "notes.txt").write_text("the user's")
    (ours / "checkpoints" / "model.safetensors").write_text("another tool's")
    res = train(_cfg(ours, "train.steps=1"), overwrite=True, quiet=True)
    assert (ours / "notes.txt").exists() and (ours / "checkpoints" / "model.safetensors").exists()
    assert sorted(os.listdir(ours / "checkpoints")) == ["latest", "model.safetensors", "step_0000001"]
    assert any("kept what it did not write" in n and "notes.txt" in n for n in res.notes)


def test_a_stale_tmp_is_cleaned_and_a_latest_folder_is_one_line(tmp_path):
    from overdrive.cli import main

    run = tmp_path / "r"
    train(_cfg(run, "train.steps=2"), quiet=True)
    stale = run / "checkpoints" / "step_0000004.tmp"
    stale.mkdir()
    (stale / ".overdrive-partial").write_text("")
    (stale / "__0_0.distcp").write_bytes(b"x" * 1000)
    res = train(_cfg(run, "train.steps=3"), resume=True, quiet=True)
    assert not stale.exists() and any("interrupted save" in n for n in res.notes)
    latest = run / "checkpoints" / "latest"
    latest.unlink()
    latest.mkdir()
    args = [a for kv in TINY + [f"train.out_dir=\"{run}\"", "train.steps=4"] for a in ("--set", kv)]
    assert main(["train", "examples/tiny.toml", *args, "--resume"]) == 2


@pytest.mark.slow
def test_sigterm_to_the_cli_saves_and_exits_143(tmp_path):
    run = tmp_path / "r"
    code = ("import os, signal, sys; from overdrive import cli; from overdrive.train import trainer, TrainHooks; "
            "orig = trainer.TrainHooks; "
            "trainer.TrainHooks = lambda **k: orig(on_step=lambda d: d == 2 and os.kill(os.getpid(), signal.SIGTERM)); "
            "sys.exit(cli.main(sys.argv[1:]))")
    args = [a for kv in TINY + [f"train.out_dir=\"{run}\""] for a in ("--set", kv)]
    cp = subprocess.run([sys.executable, "-c", code, "train", "examples/tiny.toml", *args], capture_output=True,
                        text=True, timeout=300)
    assert cp.returncode == 143, cp.stderr[-2000:]
    assert "stopped by SIGTERM after step 2" in cp.stderr and "Traceback" not in cp.stderr
    assert latest_checkpoint(str(run), verify=True).endswith("step_0000002")


def test_a_checkpoint_of_the_earlier_format_still_resumes_under_fp16(tmp_path):
    """Before this version extra_rank0.pt held `rng_cpu` and the bare `scale`, and no run identity."""
    from overdrive.checkpoint import hash_files, load_tensors, read_manifest, save_tensors, write_manifest

    run = tmp_path / "r"
    train(_cfg(run, "train.steps=2", "train.recipe=\"amp-fp16\""), quiet=True)
    ck = latest_checkpoint(str(run))
    extra = load_tensors(os.path.join(ck, "extra_rank0.pt"))
    save_tensors(os.path.join(ck, "extra_rank0.pt"), {"step": extra["step"], "rng_cpu": extra["rng"]["torch"],
                                                      "scale": 1024.0, "world": 1})
    info = {k: v for k, v in read_manifest(ck).items() if k not in ("format", "files", "identity")}
    write_manifest(ck, hash_files(ck), **info)
    res = train(_cfg(run, "train.steps=3", "train.recipe=\"amp-fp16\""), resume=True, quiet=True)
    assert res.resumed_from == 2 and len(res.losses) == 1
    assert any("records no run identity" in n for n in res.notes)
