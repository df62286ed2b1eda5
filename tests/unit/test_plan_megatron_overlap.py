"""Megatron without --overlap-grad-reduce (--no-overlap-grad-reduce): one bucket, reduced after the backward and
gathered after the step, all of it exposed; refused where the stack always overlaps."""

import dataclasses

import pytest

from overdrive.env import gpu_by_key
from overdrive.plan import TrainSetup, estimate, get_model
from overdrive.plan.collectives import gather_s
from overdrive.plan.comm import comm_times, group_layout
from overdrive.plan.validation import plan_flags
from plan_cli import run  # noqa: F401 (a fixture)

H100 = gpu_by_key("h100-sxm")


def _setup(**kw) -> TrainSetup:
    base = dict(gpu=H100, gpus_per_node=8, nodes=4, seq=8192, micro_batch=1, global_batch=256, precision="bf16",
                sharding="zero1", pp=2, vpp=1, checkpointing="none", stack="megatron")
    return TrainSetup(**{**base, **kw})


def test_one_bucket_all_exposed():
    m = get_model("llama3-8b")
    on, off = _setup(), _setup(overlap_grad_reduce=False)
    e_on, e_off = estimate(m, on), estimate(m, off)
    c = comm_times(m, off, 0.0)
    assert c["dp_buckets"] == 1 and comm_times(m, on, 0.0)["dp_buckets"] > 1
    # the distributed optimizer's reduce-scatter of fp32 gradients and all-gather of bf16 parameters, whole
    nodes, bw = group_layout(off, off.dp, 1)
    P = m.n_params() / off.pp
    assert c["dp"] == pytest.approx(gather_s(P * 4, off.dp, nodes, bw) + gather_s(P * 2, off.dp, nodes, bw))
    assert e_off.times["dp_exposed"] == pytest.approx(e_off.times["dp_comm"])
    assert e_off.times["nccl_sms"] == 0     # nothing runs beside the compute
    assert e_on.times["dp_exposed"] < 0.5 * e_on.times["dp_comm"]
    assert e_off.step_s > e_on.step_s
    # the compute itself is the same
    assert e_off.compute_s == pytest.approx(e_on.compute_s)


@pytest.mark.parametrize("kw", [dict(stack="pytorch", sharding="zero1"), dict(sharding="fsdp"),
                                dict(sharding="hsdp")])
def test_refused_where_the_stack_always_overlaps(kw):
    with pytest.raises(ValueError, match="--no-overlap-grad-reduce is Megatron's .*drop the flag"):
        _setup(overlap_grad_reduce=False, **kw)


def test_a_published_row_carries_the_flag_to_its_command_line():
    row = {"model": "llama3-8b", "gpu": "h100-sxm", "gpus": 16, "seq": 8192, "global_batch": 512,
           "micro_batch": 1, "precision": "bf16", "sharding": "zero1", "pp": 2, "stack": "megatron",
           "overlap_grad_reduce": False}
    flags = plan_flags(row)
    assert "--no-overlap-grad-reduce" in flags
    assert "--no-overlap-grad-reduce" not in plan_flags({**row, "overlap_grad_reduce": True})


def test_cli_flag_plans_it_and_the_candidate_records_it(capsys):
    from overdrive.cli import main

    args = ["plan", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--nodes", "2", "--seq", "8192",
            "--global-batch", "64", "--micro-batch", "1", "--precision", "bf16", "--pp", "2", "--stack", "megatron",
            "--checkpointing", "none", "--json"]
    assert main(args + ["--no-overlap-grad-reduce"]) == 0
    import json

    out = json.loads(capsys.readouterr().out)
    top = out["candidates"][0]
    assert top["overlap_grad_reduce"] is False and top["sharding"] in ("zero1", "none")
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out)["candidates"][0]["overlap_grad_reduce"] is True


def test_vpp_search_keeps_the_flag():
    m = get_model("llama3-8b")
    e = estimate(m, dataclasses.replace(_setup(overlap_grad_reduce=False), vpp=None))
    assert e.setup.overlap_grad_reduce is False


@pytest.mark.parametrize("kw,match", [
    (dict(sharding="zero2"), "not that: use --stack megatron with --sharding zero1 or none"),
    (dict(deepspeed_pipeline=True, vpp=1), "reduces after the pipeline flush already"),
    (dict(sharding="fsdp", offload="params"), "--offload params needs FSDP: drop one"),
])
def test_refused_where_it_cannot_apply(kw, match):
    with pytest.raises(ValueError, match=match):
        _setup(overlap_grad_reduce=False, **kw)


def test_one_data_parallel_rank_says_the_flag_changes_nothing():
    m = get_model("llama3-8b")
    e = estimate(m, _setup(nodes=1, gpus_per_node=2, pp=2, global_batch=16, overlap_grad_reduce=False))
    assert any("changes nothing here: one data-parallel rank" in n for n in e.notes)


def test_un_overlapped_reduction_is_called_unhidden_not_hidden_under_no_compute(run):
    """--no-overlap-grad-reduce exposes all of the data-parallel traffic: the note says so, and never that there was
    '0 ms of compute to hide it under' (the step has seconds of compute; nothing is overlapped with it)."""
    import json as _json
    d = _json.loads(run("--model", "llama2-13b", "--gpu", "a100-80", "--gpus", "8", "--nodes", "32", "--seq", "4096",
                        "--global-batch", "512", "--micro-batch", "1", "--tp", "2", "--sharding", "zero1", "--stack",
                        "megatron", "--checkpointing", "none", "--precision", "bf16", "--no-overlap-grad-reduce",
                        "--json").stdout)
    notes = [n for n in d["candidates"][0]["notes"] if n.startswith("communication-bound")]
    assert len(notes) == 1 and "none of it hidden: with --no-overlap-grad-reduce nothing overlaps the compute" in notes[0]
    assert "0 ms of compute" not in notes[0]
