"""`overdrive plan` refuses bad input in one line with exit code 2, before any work."""

import json
import os

import pytest

from plan_cli import invoke


@pytest.fixture
def run(capsys):
    return lambda *a: invoke(capsys, *a)


@pytest.mark.parametrize("args, needle", [
    (["--precision", "fp4"], "--precision 'fp4' is not one of"),
    (["--efficiency", "-1"], "--efficiency is a fraction of peak"),
    (["--efficiency", "1.5"], "--efficiency is a fraction of peak"),
    (["--layers", "-3", "--hidden", "64", "--heads", "4"], "--layers must be a positive integer"),
    (["--global-batch", "-2"], "--global-batch must be a positive"),
    (["--seq", "-1"], "--seq must be a positive integer"),
    (["--checkpointing", "x"], "--checkpointing 'x' is not one of"),
    (["--sharding", "zero9"], "--sharding 'zero9' is not one of"),
    (["--tp", "3"], "does not divide the 8 GPUs"),
    (["--recompute-modules", "moe_act"], "--recompute-modules 'moe_act' is not one of"),
    (["--offload-activations", "2", "--pp", "2"], "needs --pp 1"),
    (["--recompute-layers", "-1"], "--recompute-layers must be a number of blocks"),
    (["--model", "llama3-1b", "--offload-activations", "16", "--checkpointing", "none,selective"],
     "fewer (15) without it"),
    (["--model", "llama3-1b", "--offload-activations", "17", "--checkpointing", "full"], "at most the model's 16"),
    (["--sharding", "zero3", "--pp", "2"], "does not run with --pp > 1"),
    (["--sharding", "fsdp", "--no-zero-init"], "--no-zero-init plans DeepSpeed ZeRO-3"),
])
def test_refusals_are_one_line(run, args, needle):
    cp = run(*args)
    assert cp.returncode == 2, cp.stderr
    assert needle in cp.stderr and len(cp.stderr.strip().splitlines()) == 1, cp.stderr


def test_offloading_every_block_searches_only_full_checkpointing(run):
    cp = run("--model", "llama3-1b", "--offload-activations", "16", "--json")
    assert cp.returncode == 0, cp.stderr
    assert {c["checkpointing"] for c in json.loads(cp.stdout)["candidates"]} == {"full"}


def test_zero3_is_deepspeeds_and_new_flags_plan(run):
    for flags in (("--sharding", "zero3"), ("--zero", "3"), ("--sharding", "zero-3")):
        cp = run(*flags, "--seq", "2048", "--json")
        assert cp.returncode == 0, cp.stderr
        d = json.loads(cp.stdout)
        assert {c["sharding"] for c in d["candidates"]} == {"zero3"}
        assert any("DeepSpeed's ZeRO stage 3" in n for n in d["how_to_run"]["not_in_overdrive"]), d["how_to_run"]
    cp = run("--model", "llama3-70b", "--gpus", "8", "--nodes", "8", "--tp", "8", "--pp", "2", "--vpp", "2",
              "--global-batch", "64", "--micro-batch", "1", "--precision", "fp8", "--zero", "1", "--json")
    assert cp.returncode == 0, cp.stderr
    top = json.loads(cp.stdout)["candidates"][0]
    assert (top["tp"], top["pp"], top["sharding"]) == (8, 2, "zero1")


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write anywhere")
def test_png_on_read_only_path_refused_before_work(run, tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    cp = run("--png", str(ro / "m.png"))
    assert cp.returncode == 2 and "not writable" in cp.stderr and "overdrive plan" not in cp.stdout


def test_png_in_missing_folder_refused(run, tmp_path):
    cp = run("--png", str(tmp_path / "nope" / "m.png"))
    assert cp.returncode == 2 and "does not exist" in cp.stderr and cp.stdout == ""


def test_hf_config_named_after_the_model_not_the_folder(run, tmp_path):
    d = tmp_path / "path" / "to"
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 16, "hidden_size": 2048,
                                               "num_attention_heads": 32, "num_key_value_heads": 8,
                                               "intermediate_size": 8192, "vocab_size": 128256}))
    cp = run("--model", str(d / "config.json"), "--json", "--seq", "2048")
    assert cp.returncode == 0, cp.stderr
    assert json.loads(cp.stdout)["model"]["name"] == "llama-16L-2048d"
    cp = run("--model", str(d), "--json", "--seq", "2048")   # the folder, as tune --hf takes it
    assert cp.returncode == 0, cp.stderr
    assert json.loads(cp.stdout)["model"]["name"] == "llama-16L-2048d"


def test_help_documents_every_flag_with_defaults(run):
    out = run("--help").stdout
    assert "number of nodes" in out and "dtype of the optimizer's states" in out and "(default: 4096)" in out


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux /proc")
def test_png_on_unwritable_path_refused_even_for_root(run):
    cp = run("--png", "/proc/overdrive_plan.png")
    assert cp.returncode == 2 and "not writable" in cp.stderr and cp.stdout == ""


def test_megatron_memory_flags_plan(run):
    cp = run("--model", "llama3-70b", "--gpu", "gb200", "--gpus", "64", "--seq", "8192", "--precision", "fp8",
             "--sharding", "fsdp", "--micro-batch", "2", "--global-batch", "256", "--checkpointing", "none",
             "--offload-activations", "40", "--grad-dtype", "bf16", "--loss", "inplace", "--fp8-activations", "--json")
    assert cp.returncode == 0, cp.stderr
    top = json.loads(cp.stdout)["candidates"][0]
    cp = run("--model", "llama3-70b", "--gpu", "gb200", "--gpus", "64", "--seq", "8192", "--precision", "fp8",
             "--sharding", "fsdp", "--micro-batch", "2", "--global-batch", "256", "--checkpointing", "none",
             "--grad-dtype", "bf16", "--loss", "inplace", "--fp8-activations", "--json")
    kept = json.loads(cp.stdout)["candidates"][0]
    assert top["memory_gib"] < kept["memory_gib"] - 100  # 40 of 80 blocks' activations on the host
    cp = run("--model", "llama3-70b", "--gpus", "8", "--nodes", "8", "--pp", "8", "--global-batch", "64",
             "--recompute-layers", "1", "--recompute-modules", "mlp", "--json")
    assert cp.returncode == 0, cp.stderr
    assert {c["checkpointing"] for c in json.loads(cp.stdout)["candidates"]} == {"none"}


def test_what_would_fit_keeps_the_users_micro_batch_and_names_only_changes(run):
    """Nothing fits at a given --micro-batch: the suggestions are planned at that micro-batch (not at 1 behind the
    user's back), micro-batch 1 is its own suggestion, and full checkpointing already asked is not offered again."""
    out = " ".join(run("--model", "llama3-8b", "--gpu", "h200", "--gpus", "8", "--seq", "4096", "--micro-batch", "20",
                       "--sharding", "zero2", "--checkpointing", "full", "--precision", "bf16", "--no-compile").stdout.split())
    assert "Nothing fits" in out
    assert "- micro-batch 1: " in out and "(bf16 · zero2 · AC full · mb 1)" in out
    assert "- fused cross-entropy: " in out and "mb 20 · fused loss" in out
    assert "full checkpointing + fused" not in out
    out = " ".join(run("--model", "llama3-8b", "--gpu", "h200", "--gpus", "8", "--seq", "4096", "--micro-batch", "16",
                       "--sharding", "zero2", "--checkpointing", "none", "--precision", "bf16", "--no-compile").stdout.split())
    assert "- full checkpointing + micro-batch 1: " in out and "- full checkpointing + fused cross-entropy: " in out
    assert "- full checkpointing + 8-bit AdamW states" in out     # every suggestion is planned at full checkpointing
    # a suggestion that is the leanest setup itself is not offered (fused cross-entropy already asked)
    out = " ".join(run("--model", "llama3-70b", "--gpu", "h100-sxm", "--gpus", "8", "--seq", "8192", "--precision", "bf16",
                       "--loss", "fused", "--checkpointing", "full", "--micro-batch", "1", "--sharding", "zero1").stdout.split())
    assert "Nothing fits" in out and "- fused cross-entropy:" not in out
