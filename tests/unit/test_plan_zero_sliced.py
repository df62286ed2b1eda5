"""--zero-sliced: nanotron's ZeRO-1 (every tensor sliced over the data-parallel ranks, the updated weights all-gathered
after the step with per-rank, per-tensor host work), DDP's buckets (count and memory), the measured host costs, and
the flag as a user meets it."""

import json
import os

import pytest
import torch
import torch.distributed as dist

from overdrive.env.catalog import gpu_by_key
from overdrive.plan.comm import DDP_BUCKET_BYTES, DDP_FIRST_BUCKET_BYTES, _tensors, comm_times, ddp_buckets
from overdrive.plan.estimate import estimate
from overdrive.plan.host import HOST_US_PER_OP, ZERO_SLICED_AFTER_STEP, ZERO_SLICED_HOOK, zero_sliced_ops
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


@pytest.mark.parametrize("sizes", [
    [100_000_000, 7_000_000, 2_000_000, 3072, 3072, 6_000_000, 6_000_000, 6_000_000, 3072],
    [3072] * 40 + [9_000_000] * 5, [1000] * 3, [40_000_000], [500_000, 600_000, 13_000_000, 13_000_000, 1]])
def test_ddp_buckets_are_the_reducers(sizes):
    # the count DDP's own assignment gives the same tensors, in the model's order, with its default limits
    tensors = [torch.empty(n, dtype=torch.bfloat16, device="meta") for n in sizes]
    buckets, _ = dist._compute_bucket_assignment_by_size(tensors, [DDP_FIRST_BUCKET_BYTES, DDP_BUCKET_BYTES],
                                                         [False] * len(tensors))
    assert ddp_buckets([2 * n for n in sizes]) == len(buckets)


def test_host_constants_are_the_committed_measurement():
    with open(MEASURED) as f:
        m = json.load(f)
    assert "c252843" in m["source"]
    assert ZERO_SLICED_AFTER_STEP == pytest.approx(m["after_step_fit"]["median_per_rank_tensor"], abs=0.005)
    lo, hi = m["after_step_fit"]["range_per_rank_tensor"]
    assert 0.5 < lo <= ZERO_SLICED_AFTER_STEP <= hi < 1.5
    fit = m["hook_fit"]
    for ours, key, tol in zip(ZERO_SLICED_HOOK, ("per_rank_tensor", "per_rank", "per_tensor", "constant"),
                              (0.005, 0.005, 0.05, 0.05)):
        assert ours == pytest.approx(fit[key], abs=tol), key
    # the measurement's clock is the planner's
    assert m["plain_clock"]["us_per_op_fastest"] == pytest.approx(HOST_US_PER_OP, rel=0.1)
    # and the fit describes each case it was made from
    for case in m["hook"]:
        a, b, c, d = ZERO_SLICED_HOOK
        k, n = case["bucket_tensors"], case["dp"]
        assert a * n * k + b * n + c * k + d == pytest.approx(case["ops_worth"], rel=0.15), case


def test_host_work_grows_with_ranks_times_tensors():
    s8, s128 = _setup(1, tp=1), _setup(64, tp=4)
    T = len(_tensors(NANO_3B, s128))
    assert T == 1 + 28 * 7 + 1   # the embedding (tied: no head), 7 tensors a block, the final norm
    hook, after = zero_sliced_ops(s128, T, 10)
    assert after == pytest.approx(ZERO_SLICED_AFTER_STEP * 128 * T)
    assert hook == pytest.approx(ZERO_SLICED_HOOK[0] * 128 * T + ZERO_SLICED_HOOK[1] * 128 * 10
                                 + ZERO_SLICED_HOOK[2] * T + ZERO_SLICED_HOOK[3] * 10)
    assert zero_sliced_ops(s8, T, 10)[1] == pytest.approx(after * 8 / 128)
    plain = TrainSetup(**{**s128.__dict__, "zero_sliced": False})
    assert zero_sliced_ops(plain, T, 10) == (0.0, 0.0)


def test_after_step_is_exposed_and_the_host_part_bites_at_many_ranks():
    big = _setup(64)
    c = comm_times(NANO_3B, big, 0.0)
    assert c["dp_after"] > 0 and c["zero_sliced_after_ops"] > 0 and c["dp_buckets"] == ddp_buckets(
        [2 * t for t in _tensors(NANO_3B, big)])
    on, off = estimate(NANO_3B, big), estimate(NANO_3B, TrainSetup(**{**big.__dict__, "zero_sliced": False}))
    after = max(c["dp_after"], c["zero_sliced_after_ops"] * HOST_US_PER_OP * 1e-6)
    assert on.times["zero_sliced_exposed"] >= after
    assert on.step_s > off.step_s + 0.5 * after
    assert any("sliced ZeRO-1" in n for n in on.notes)
    assert c["zero_sliced_after_ops"] * HOST_US_PER_OP * 1e-6 > c["dp_after"]   # the host's loops, not the wire
    # 2 ranks in one node: the host's part is small, the all-gather over NVLink as well
    small = _setup(1, tp=4)
    cs = comm_times(NANO_3B, small, 0.0)
    on, off = estimate(NANO_3B, small), estimate(NANO_3B, _setup(1, tp=4, zero_sliced=False))
    assert cs["zero_sliced_after_ops"] * HOST_US_PER_OP * 1e-6 < 0.01 * on.step_s
    assert on.step_s == pytest.approx(off.step_s, rel=0.03)
    assert not any("sliced ZeRO-1" in n for n in on.notes)


def test_memory_keeps_the_fp32_accumulator_and_ddps_buckets():
    s = _setup(64)
    P = NANO_3B.n_params() / 4
    assert ddp_bucket_bytes(NANO_3B, s) == pytest.approx(2 * P)   # the bf16 model's buckets
    on, off = terms(NANO_3B, s), terms(NANO_3B, TrainSetup(**{**s.__dict__, "zero_sliced": False}))
    # one micro-batch a step: plain ZeRO-1 frees the gradients before the forward; nanotron keeps 4P of fp32
    # accumulator and 2P of DDP buckets through it
    assert on["allocated"] - off["allocated"] >= 4 * P
    # PyTorch DDP under autocast: fp32 buckets beside the fp32 gradients, on several ranks only
    ddp = _setup(64, sharding="none", zero_sliced=False)
    assert ddp_bucket_bytes(NANO_3B, ddp) == pytest.approx(4 * P)
    assert ddp_bucket_bytes(NANO_3B, _setup(1, tp=8, sharding="none", zero_sliced=False)) == 0
    assert ddp_bucket_bytes(NANO_3B, _setup(64, sharding="fsdp", zero_sliced=False)) == 0


@pytest.mark.parametrize("kw, needle", [
    (dict(sharding="fsdp"), "--sharding fsdp"), (dict(sharding="none"), "--sharding none"),
    (dict(stack="megatron", compile=True), "--stack megatron"),
    (dict(zero_broadcast=True, grad_dtype="bf16"), "--zero-broadcast"),
    (dict(optimizer_in_backward=True), "--optimizer-in-backward")])
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
    assert {c["sharding"] for c in out["candidates"]} == {"zero1"} and all(c["zero_sliced"] for c in out["candidates"])
    assert any("nanotron" in g for g in out["how_to_run"]["not_in_overdrive"])
    cp = invoke(capsys, *args, "--sharding", "zero1", "--micro-batch", "2", "--checkpointing", "none", "--explain")
    assert cp.returncode == 0, cp.stderr
    assert "after the step: one all-gather" in cp.stdout and "zero_sliced_exposed" in cp.stdout
    cp = invoke(capsys, *args, "--sharding", "fsdp")
    assert cp.returncode == 2 and "--zero-sliced" in cp.stderr and len(cp.stderr.strip().splitlines()) == 1
