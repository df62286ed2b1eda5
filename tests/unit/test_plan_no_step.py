"""`--optimizer none` (a forward-and-backward benchmark under no_sync), `sgd-nomomentum`, and the labels and
messages around the optimizer: what each counts, what it refuses, and that the labels say what is counted."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from plan_cli import refused as _refused, run  # noqa: F401 (run is a fixture)
from overdrive.env import gpu_by_key
from overdrive.plan import TrainSetup, estimate, get_model
from overdrive.plan.comm import comm_times
from overdrive.plan.memory import terms
from overdrive.plan.runnable import not_in_overdrive
from overdrive.plan.throughput import HOST_GBS, compute_times

A100 = gpu_by_key("a100-80")
M = get_model("llama3-8b")


def _setup(**kw) -> TrainSetup:
    base = dict(gpu=A100, seq=2048, micro_batch=2, global_batch=2 * 4 * kw.get("gpus_per_node", 4), sharding="fsdp",
                checkpointing="full", gpus_per_node=4, pure_bf16=True)
    return TrainSetup(**{**base, **kw})


@pytest.mark.parametrize("gpus", [1, 2, 4, 8])
@pytest.mark.parametrize("pure", [True, False])
def test_no_step_holds_no_states_and_each_rank_keeps_its_gradients_whole(gpus, pure):
    """no_sync never reduce-scatters: the gradients are the whole model's on every rank, whatever FSDP shards."""
    s = _setup(gpus_per_node=gpus, global_batch=2 * 4 * gpus, pure_bf16=pure)
    none, adamw = terms(M, dataclasses.replace(s, optimizer="none")), terms(M, s)
    grad_b = 2 if pure else 4
    assert none["optimizer"] == 0 < adamw["optimizer"]
    assert none["grads"] == pytest.approx(grad_b * M.n_params())
    assert none["params"] == pytest.approx(adamw["params"])   # the weights shard as before
    if gpus > 1:
        assert none["grads"] > adamw["grads"]


def test_no_step_drops_the_reduce_scatter_keeps_the_gathers_and_the_step():
    s = _setup(gpus_per_node=4)
    none = dataclasses.replace(s, optimizer="none")
    c, c0 = comm_times(M, s, 0.0), comm_times(M, none, 0.0)
    blocks = M.n_layer
    # per micro-batch: 2 gathers + 1 reduce-scatter a block and the root's gather + reduce-scatter, without: 2 + 1
    assert c["dp_calls"] == s.grad_accum * (3 * blocks + 2)
    assert c0["dp_calls"] == s.grad_accum * (2 * blocks + 1)
    assert 0 < c0["dp"] < c["dp"]
    t, t0 = compute_times(M, s), compute_times(M, none)
    assert t0["optimizer"] == 0 < t["optimizer"]
    assert estimate(M, none).step_s < estimate(M, s).step_s
    ddp = _setup(sharding="none", pure_bf16=False)
    assert comm_times(M, ddp, 0.0)["dp"] > 0 == comm_times(M, dataclasses.replace(ddp, optimizer="none"), 0.0)["dp"]


@pytest.mark.parametrize("kw, what, fix", [
    (dict(sharding="zero3"), "--sharding zero3", "use --sharding none, fsdp or hsdp"),
    (dict(sharding="zero1"), "--sharding zero1", "use --sharding none, fsdp or hsdp"),
    (dict(sharding="zero2"), "--sharding zero2", "use --sharding none, fsdp or hsdp"),
    (dict(stack="megatron", sharding="none"), "--stack megatron", "use --stack pytorch"),
    (dict(pp=2, gpus_per_node=8, global_batch=64), "--pp 2", "drop --pp"),
    (dict(offload="optimizer"), "--offload optimizer", "drop it"),
    (dict(optimizer_in_backward=True, global_batch=8), "--optimizer-in-backward", "drop it")])
def test_no_step_is_refused_where_no_sync_does_not_run_naming_the_flag_and_its_fix(kw, what, fix):
    with pytest.raises(ValueError, match=rf"^--optimizer none \(forward and backward under DDP's/FSDP's no_sync.*\) "
                                         rf"does not run with {what}: .*{fix}, or name the optimizer that steps$"):
        _setup(optimizer="none", **kw)


def test_no_step_gradients_stay_at_the_peak_and_no_adamw_is_suggested(run):
    """Nothing zeroes the gradients without a step: one micro-batch a step keeps them under the next forward."""
    s = _setup(gpus_per_node=1, global_batch=2, sharding="none", checkpointing="none", pure_bf16=False)
    assert s.grad_accum == 1
    t = terms(M, dataclasses.replace(s, optimizer="none"))
    assert t["grads_at_peak"] == pytest.approx(4 * M.n_params())
    assert terms(M, s)["grads_at_peak"] < 4 * M.n_params()
    out = run("--model", "llama3-70b", "--gpus", "8", "--optimizer", "none", "--precision", "bf16")
    assert out.returncode == 0 and "Nothing fits" in out.stdout, out.stderr
    assert "8-bit AdamW" not in out.stdout and "LoRA rank 16" in out.stdout


def test_cli_no_step_searches_only_the_shardings_with_no_sync(run):
    out = run("--model", "llama3-8b", "--gpu", "a100-80", "--gpus", "8", "--seq", "2048", "--optimizer", "none",
              "--precision", "bf16", "--json")
    assert out.returncode == 0, out.stderr
    cands = json.loads(out.stdout)["candidates"]
    assert cands and {c["sharding"] for c in cands} <= {"fsdp", "hsdp", "none"}
    assert all(c["optimizer"] == "none" for c in cands)
    _refused(run("--model", "llama3-8b", "--gpus", "8", "--optimizer", "none", "--stack", "megatron"),
             r"--optimizer none \(.*\) does not run with --stack megatron: .* use --stack pytorch")


def test_cli_no_step_is_labelled_and_not_recommended_as_training(run):
    out = run("--model", "llama3-8b", "--gpu", "a100-80", "--gpus", "1", "--seq", "2048", "--global-batch", "32",
              "--micro-batch", "8", "--precision", "bf16", "--sharding", "fsdp", "--checkpointing", "full", "--loss",
              "hf", "--block-code", "hf", "--pure-bf16", "--no-compile", "--optimizer", "none", "--explain")
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())
    assert "no optimizer step" in text and "fits" in text
    assert "per trained parameter, before sharding: no optimizer step 0 B states + 2 B grad" in text
    assert "not run by Overdrive: no optimizer step: a forward-and-backward benchmark" in text


def test_sgd_without_momentum_keeps_no_state():
    s = _setup(gpus_per_node=1, global_batch=8, sharding="none", pure_bf16=False)
    assert terms(M, dataclasses.replace(s, optimizer="sgd-nomomentum"))["optimizer"] == 0
    assert terms(M, dataclasses.replace(s, optimizer="sgd"))["optimizer"] == pytest.approx(4 * M.n_params())
    assert "torch.optim.SGD (momentum 0)" in " ".join(not_in_overdrive({"optimizer": "sgd-nomomentum"}))


def test_pure_bf16_states_are_labelled_as_counted(run):
    """--pure-bf16 counts bf16 AdamW states: the setup, the JSON and --explain say bf16, not the fp32 default."""
    s = _setup(gpus_per_node=1, global_batch=8, sharding="none")
    assert s.optimizer_dtype == "bf16"
    assert terms(M, s)["optimizer"] == pytest.approx(2 * 2 * M.n_params())
    assert _setup(gpus_per_node=1, global_batch=8, sharding="none", optimizer="adamw-8bit").optimizer_dtype == "8bit"
    out = run("--model", "llama3-8b", "--gpus", "8", "--precision", "bf16", "--sharding", "fsdp", "--pure-bf16",
              "--micro-batch", "1", "--seq", "2048", "--json")
    assert out.returncode == 0, out.stderr
    assert {c["optimizer_dtype"] for c in json.loads(out.stdout)["candidates"]} == {"bf16"}
    notes = not_in_overdrive({"optimizer_dtype": "bf16", "master_weights": "none"})
    assert len(notes) == 1 and notes[0].startswith("pure bf16")


@pytest.mark.parametrize("args, needle", [
    (["--stack", "megatron"], r"with --stack megatron: Megatron-Core shards with its own distributed optimizer.*"
                              r"use --sharding zero1 \(its distributed optimizer\) or fsdp, or drop --stack$"),
    (["--pp", "2"], r"with --pp > 1: DeepSpeed's PipelineEngine refuses ZeRO-2 and ZeRO-3; use --sharding zero1"),
    (["--gather-dtype", "fp32"], r"with --gather-dtype fp32: DeepSpeed gathers its 16-bit partitions in the model's "
                                 r"dtype; use --sharding fsdp \(FSDP2\), or drop --gather-dtype$"),
    (["--gather-dtype", "bf16", "--precision", "fp16"], r"with --gather-dtype bf16: DeepSpeed gathers its 16-bit "
                                                        r"partitions in the model's dtype"),
])
def test_zero3_refusals_give_the_reason_of_the_flag_asked(run, args, needle):
    out = run("--model", "llama3-8b", "--gpus", "8", "--sharding", "zero3", *args)
    _refused(out, needle)
    assert "pipeline" not in out.stderr or "--pp" in args


def test_zero3_gathers_a_bf16_model_in_bf16(run):
    out = run("--model", "llama3-8b", "--gpus", "8", "--sharding", "zero3", "--precision", "bf16", "--gather-dtype",
              "bf16", "--micro-batch", "1", "--checkpointing", "full")
    assert out.returncode == 0, out.stderr


def test_optimizer_offload_crosses_the_host_link_of_the_gpu():
    """Grace boards reach the CPU over NVLink-C2C: the offloaded step moves its bytes at that rate, as activation
    offload does, not at PCIe's."""
    kw = dict(seq=2048, micro_batch=1, global_batch=8, sharding="fsdp", gpus_per_node=8, checkpointing="full",
              offload="optimizer")
    pcie = compute_times(M, TrainSetup(gpu=gpu_by_key("b200"), **kw))["optimizer"]
    c2c = compute_times(M, TrainSetup(gpu=gpu_by_key("gb200"), **kw))["optimizer"]
    P = M.n_params() / 8
    assert pcie == pytest.approx(6 * P / (HOST_GBS["pcie"] * 1e9) + P / 1e9)
    assert c2c == pytest.approx(6 * P / (HOST_GBS["gb200"] * 1e9) + P / 1e9)


@pytest.mark.parametrize("args, named", [(["--sharding", "fsdp"], "--stack pytorch"),
                                         (["--stack", "megatron", "--sharding", "fsdp"], "--sharding fsdp")])
def test_no_overlap_grad_reduce_names_the_flag_that_is_not_megatrons(run, args, named):
    """The search's ZeRO-1 base is not what the user asked: the refusal names what they did ask."""
    out = run("--model", "llama3-8b", "--gpus", "8", "--no-overlap-grad-reduce", *args)
    _refused(out, rf"--no-overlap-grad-reduce is Megatron's DDP/distributed-optimizer option; {named} is not that")
    assert "zero1 is not" not in out.stderr


@pytest.mark.parametrize("opt", ["sgd-nomomentum", "none"])
def test_a_stateless_optimizer_has_no_state_dtype_to_ask_for_or_report(run, opt):
    """8-bit states of an optimizer that keeps none is a contradiction: refused in one line; its JSON reports no
    state dtype and --explain says it keeps no state."""
    base = ("--model", "llama3-8b", "--gpu", "a100-80", "--gpus", "8", "--seq", "2048", "--precision", "bf16",
            "--sharding", "fsdp", "--checkpointing", "full", "--micro-batch", "2", "--optimizer", opt)
    _refused(run(*base, "--optimizer-dtype", "8bit"),
             rf"--optimizer-dtype 8bit with --optimizer {opt}: it keeps no state to store in 8 bits; drop --optimizer-dtype$")
    _refused(run(*base, "--optimizer-dtype", "bf16"),
             rf"--optimizer-dtype bf16 with --optimizer {opt}: it keeps no state to store in bf16; drop --optimizer-dtype$")
    out = run(*base, "--pure-bf16", "--json")   # pure bf16 gives states its dtype; with none there is none to give
    assert out.returncode == 0, out.stderr
    assert {c["optimizer_dtype"] for c in json.loads(out.stdout)["candidates"]} == {None}
    text = " ".join(run(*base, "--explain").stdout.split())
    assert ("no optimizer step 0 B states" if opt == "none" else "sgd-nomomentum (no state) 0 B states") in text


def test_eight_bit_states_of_another_optimizer_are_named_as_that_optimizer(run):
    out = run("--model", "llama3-8b", "--gpu", "a100-80", "--gpus", "8", "--seq", "2048", "--precision", "bf16",
              "--sharding", "fsdp", "--checkpointing", "full", "--micro-batch", "2", "--optimizer", "lion",
              "--optimizer-dtype", "8bit")
    text = " ".join(out.stdout.split())
    assert out.returncode == 0 and "8-bit states · lion" in text and "8-bit Adam" not in text, out.stderr
    notes = not_in_overdrive({"optimizer": "lion", "optimizer_dtype": "8bit"})
    assert notes[0].startswith("8-bit Lion states: no Overdrive recipe; pass bitsandbytes' Lion8bit")
    assert not_in_overdrive({"optimizer": "sgd", "optimizer_dtype": "8bit"})[0].startswith(
        "8-bit SGD momentum states: no Overdrive recipe; pass bitsandbytes' SGD8bit")
    assert "AdamW8bit" in not_in_overdrive({"optimizer_dtype": "8bit"})[0]
    bf16 = not_in_overdrive({"optimizer": "sgd", "optimizer_dtype": "bf16"})[0]
    assert bf16.startswith("bf16 SGD momentum states: no Overdrive recipe (an optimizer that keeps them in bf16")


def test_adafactors_counted_state_has_nothing_for_eight_bits(run):
    _refused(run("--model", "llama3-8b", "--gpus", "8", "--optimizer", "adafactor", "--optimizer-dtype", "8bit"),
             r"--optimizer-dtype 8bit with --optimizer adafactor: its factored second moment .* is counted as none: "
             r"nothing to store in 8 bits; drop --optimizer-dtype$")


@pytest.mark.parametrize("opt, named", [("lion", "8-bit Lion states (bitsandbytes' Lion8bit)"),
                                        ("adamw", "8-bit AdamW states (torchao.optim.AdamW8bit"),
                                        ("adafactor", None), ("sgd-nomomentum", None)])
def test_when_nothing_fits_8_bit_states_are_offered_only_as_the_optimizer_that_has_them(run, opt, named):
    out = run("--model", "llama3-405b", "--gpu", "h100-sxm", "--gpus", "8", "--optimizer", opt, "--sharding", "fsdp")
    text = " ".join(out.stdout.split())
    assert out.returncode == 0 and "Nothing fits" in out.stdout, out.stderr
    if named:
        assert named in text
    # each suggestion is planned at full checkpointing, and says so when the leanest was not at full
    assert len(re.findall(r"- (?:full checkpointing \+ )?8-bit", text)) == (2 if named else 0)
