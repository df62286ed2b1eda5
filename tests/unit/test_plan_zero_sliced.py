"""--zero-sliced: nanotron's ZeRO-1 as its benchmarks ran it (fp32 accumulation, so no DDP: one all-reduce of the
fp32 gradients after the backward; every tensor sliced over the data-parallel ranks, the weights all-gathered after
the step with per-rank, per-tensor host work), the measured host costs, the memory, DDP's buckets for plain DDP, and
the flag as a user meets it."""

import json
import os

import pytest

from overdrive.env.catalog import gpu_by_key
from overdrive.plan.collectives import choose_allreduce, group_layout
from overdrive.plan.comm import comm_times, zero_sliced_tensors
from overdrive.plan.estimate import estimate
from overdrive.plan.host import (HOST_US_PER_OP, HOST_US_PER_OP_CPU, ZERO_SLICED_ACCUMULATE, ZERO_SLICED_POST,
                                 ZERO_SLICED_PRE, accumulate_ops, zero_sliced_ops)
from overdrive.plan.memory import ddp_bucket_bytes, terms
from overdrive.plan.setup import TrainSetup
from overdrive.plan.specs import ModelSpec
from plan_cli import invoke

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
MEASURED = os.path.join(ROOT, "benchmarks/results/cpu/2026-12-07-zero-sliced-host/zero-sliced-host.json")
# nanotron's scaling benchmark 3.57B (scripts/scaling_benchmarks.py @ e24d2483: 28 layers, hidden 3072, 32 heads, ffn
# 8192, vocab 131072, tied)
NANO_3B = ModelSpec(name="nanotron-3.57b", n_layer=28, hidden=3072, n_head=32, n_kv_head=32, ffn=8192, vocab=131072,
                    tied=True)


def _setup(nodes: int, tp: int = 4, **kw) -> TrainSetup:
    base = dict(gpu=gpu_by_key("h100-sxm"), nodes=nodes, seq=4096, micro_batch=2, tp=tp, precision="bf16",
                sharding="zero1", compile=False, fused_kernels=True, attention="fa2", grad_dtype="fp32",
                sp_regather=True, async_tp=True, zero_sliced=True)
    return TrainSetup(**{**base, **kw})


def test_host_constants_are_the_committed_measurement():
    with open(MEASURED) as f:
        m = json.load(f)
    assert "c252843" in m["source"]
    fit = m["fit"]
    assert ZERO_SLICED_PRE == pytest.approx(fit["pre_per_rank_tensor"], abs=0.005)
    assert ZERO_SLICED_POST == pytest.approx(fit["post_per_rank_tensor"], abs=0.005)
    assert ZERO_SLICED_ACCUMULATE == pytest.approx(fit["accumulate_per_tensor"], abs=0.005)
    # the measurement's clock is the planner's, and the fit describes every case it was made from
    assert m["plain_clock"]["us_per_op_fastest"] == pytest.approx(HOST_US_PER_OP_CPU, rel=0.1)
    for case in m["after_step"]:
        want = (ZERO_SLICED_PRE + ZERO_SLICED_POST) * case["dp"] * case["tensors"]
        assert want == pytest.approx(case["ops_worth"], rel=0.2), case
        assert 0.2 < case["pre_ops_worth"] / case["ops_worth"] < 0.7, case


def test_nanotrons_tensors_merge_gate_and_up():
    s = _setup(64)
    T = zero_sliced_tensors(NANO_3B, s)
    # tied: the embedding, then qkv, o, gate_up, down and two norms a block, then the final norm
    assert len(T) == 1 + 28 * 6 + 1
    # the model's parameters over TP 4, but the 57 norms, which every TP rank holds whole
    assert sum(T) == NANO_3B.n_params() / 4 + 57 * 3072 * 3 / 4


def test_host_work_grows_with_ranks_times_tensors():
    T = len(zero_sliced_tensors(NANO_3B, _setup(64)))
    pre, post = zero_sliced_ops(_setup(64), T)
    assert (pre, post) == (pytest.approx(ZERO_SLICED_PRE * 128 * T), pytest.approx(ZERO_SLICED_POST * 128 * T))
    assert zero_sliced_ops(_setup(4, tp=4), T)[1] == pytest.approx(post * 8 / 128)
    assert zero_sliced_ops(_setup(64, zero_sliced=False, sharding="fsdp"), T) == (0.0, 0.0)
    assert accumulate_ops(NANO_3B, _setup(64)) == pytest.approx(ZERO_SLICED_ACCUMULATE * T)


def test_gradients_are_one_exposed_all_reduce_and_the_gather_waits():
    s = _setup(64)
    c = comm_times(NANO_3B, s, 0.0)
    nodes, bw = group_layout(s, 128, 4)
    assert c["dp_calls"] == 1 and c["dp"] == pytest.approx(choose_allreduce(NANO_3B.n_params() / 4 * 4, 128, nodes,
                                                                             bw)[1])
    on = estimate(NANO_3B, s)
    assert on.times["dp_exposed"] == pytest.approx(c["dp"]) and on.times["nccl_sms"] == 0   # nothing hides it
    pre, post = (x * HOST_US_PER_OP * 1e-6 for x in zero_sliced_ops(s, c["zero_sliced_tensors"]))
    # the host's loops need not wait for the all-reduce: the tail is the longer of the GPU's calls and the host's loops
    ar = on.times["dp_exposed"]
    assert on.times["zero_sliced_exposed"] == pytest.approx(max(ar + c["dp_after"], pre + post) - ar)
    # at 128 ranks over 50 GB/s NICs the host's loops outlast the all-reduce and the gather: they are the tail
    assert pre + post > ar + c["dp_after"]
    assert on.times["zero_sliced_exposed"] == pytest.approx(pre + post - ar)
    # a slow network leaves the wire after the all-reduce (the gather) as the tail
    slow = estimate(NANO_3B, _setup(64, inter_gbs=5))
    cs = slow.comm
    assert pre + post < slow.times["dp_exposed"] + cs["dp_after"]
    assert slow.times["zero_sliced_exposed"] == pytest.approx(cs["dp_after"])
    off = estimate(NANO_3B, _setup(64, zero_sliced=False))
    assert on.step_s > off.step_s + pre + post - c["dp"]
    assert any("sliced ZeRO-1" in n for n in on.notes)
    # 2 ranks in one node: the host's part is small (2% of the step at 8.6 µs an op)
    small = _setup(1, tp=4)
    cs = comm_times(NANO_3B, small, 0.0)
    assert sum(zero_sliced_ops(small, cs["zero_sliced_tensors"])) * HOST_US_PER_OP * 1e-6 < 0.03 * estimate(
        NANO_3B, small).step_s


def test_a_tensor_that_does_not_split_evenly_gathers_by_broadcasts():
    odd = ModelSpec(name="odd", n_layer=4, hidden=1000, n_head=8, n_kv_head=8, ffn=2600, vocab=32003, tied=True)
    s = _setup(2, tp=1, global_batch=None)   # 16 ranks: the norms' 1,000 elements do not split in 16
    c = comm_times(odd, s, 0.0)
    assert c["dp_after_calls"] == 16
    even = comm_times(NANO_3B, _setup(2, tp=1, global_batch=None), 0.0)
    assert even["dp_after_calls"] == 1


def test_memory_keeps_the_fp32_accumulator_not_ddp_buckets():
    s = _setup(64)
    P = NANO_3B.n_params() / 4
    assert ddp_bucket_bytes(NANO_3B, s) == 0   # nanotron builds no DDP with fp32 accumulation and ZeRO
    on, off = terms(NANO_3B, s), terms(NANO_3B, _setup(64, zero_sliced=False))
    # one micro-batch a step: plain ZeRO-1 frees the gradients before the forward; nanotron keeps its 4P
    assert on["allocated"] - off["allocated"] == pytest.approx(4 * P, rel=0.05)
    # PyTorch DDP under autocast: fp32 buckets beside the fp32 gradients, on several ranks only
    ddp = _setup(64, sharding="none", zero_sliced=False)
    assert ddp_bucket_bytes(NANO_3B, ddp) == pytest.approx(4 * P)
    assert ddp_bucket_bytes(NANO_3B, _setup(1, tp=8, sharding="none", zero_sliced=False)) == 0
    assert ddp_bucket_bytes(NANO_3B, _setup(64, sharding="fsdp", zero_sliced=False)) == 0


@pytest.mark.parametrize("kw, needle", [
    (dict(sharding="fsdp"), "--sharding fsdp"), (dict(sharding="none"), "--sharding none"),
    (dict(stack="megatron", compile=True), "--stack megatron"),
    (dict(zero_broadcast=True), "--zero-broadcast"), (dict(sharding="zero3", zero_init=False), "--no-zero-init"),
    (dict(optimizer_in_backward=True), "--optimizer-in-backward"), (dict(optimizer="none"), "--optimizer none"),
    (dict(precision="fp32"), "--precision fp32"), (dict(precision="fp8"), "--precision fp8"),
    (dict(grad_dtype="bf16"), "--grad-dtype bf16"), (dict(pure_bf16=True), "--pure-bf16"),
    (dict(master_weights="remainder"), "--master-weights remainder"), (dict(compile=True), "--no-compile"),
    (dict(optimizer="lion"), "--optimizer lion"), (dict(optimizer_dtype="8bit"), "--optimizer-dtype 8bit"),
    (dict(zero_init=False), "--no-zero-init"), (dict(overlap_grad_reduce=False), "--no-overlap-grad-reduce"),
    (dict(offload="params"), "--offload params"),
    (dict(lora_rank=16), "--lora-rank"), (dict(cp=2), "--cp 2"), (dict(offload="optimizer"), "--offload optimizer"),
    (dict(checkpointing="selective"), "--checkpointing selective")])
def test_refused_outside_nanotrons_zero1(kw, needle):
    with pytest.raises(ValueError, match="--zero-sliced") as e:
        _setup(2, **kw)
    assert needle in str(e.value)


def test_cli_searches_zero1_explains_and_refuses_in_one_line(capsys):
    args = ("--layers", "28", "--hidden", "3072", "--heads", "32", "--ffn", "8192", "--vocab", "131072",
            "--gpu", "h100-sxm", "--gpus", "8", "--nodes", "64", "--seq", "4096", "--global-batch", "256",
            "--tp", "4", "--precision", "bf16", "--zero-sliced", "--no-compile", "--fused-kernels")
    cp = invoke(capsys, *args, "--json")
    assert cp.returncode == 0, cp.stderr
    out = json.loads(cp.stdout)
    cands = out["candidates"]
    assert {c["sharding"] for c in cands} == {"zero1"} and all(c["zero_sliced"] for c in cands)
    assert {c["precision"] for c in cands} == {"bf16"} and {c["checkpointing"] for c in cands} <= {"none", "full"}
    assert any("nanotron" in g for g in out["how_to_run"]["not_in_overdrive"]) and out["how_to_run"]["other_stack"]
    cp = invoke(capsys, *args)
    assert cp.returncode == 0 and "Next step (parts of the pick are not Overdrive's, below; the nearest in Overdrive)" \
        in " ".join(cp.stdout.split())
    cp = invoke(capsys, *args, "--sharding", "zero1", "--micro-batch", "2", "--checkpointing", "none", "--explain")
    assert cp.returncode == 0, cp.stderr
    assert "after the step: one all-gather" in cp.stdout and "zero_sliced_exposed" in cp.stdout
    one = ("--layers", "2", "--hidden", "3072", "--heads", "32", "--ffn", "8192", "--vocab", "131072", "--gpu",
           "h100-sxm", "--gpus", "1", "--seq", "4096", "--precision", "bf16", "--zero-sliced", "--sharding", "zero1",
           "--micro-batch", "1", "--checkpointing", "none", "--no-compile")
    cp = invoke(capsys, *one)
    assert cp.returncode == 0 and "one data-parallel rank: nothing is sliced" in cp.stdout, cp.stdout + cp.stderr
    cp = invoke(capsys, *args, "--sharding", "fsdp")
    assert cp.returncode == 2 and "--zero-sliced" in cp.stderr and len(cp.stderr.strip().splitlines()) == 1
