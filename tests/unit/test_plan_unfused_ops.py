"""--unfused-ops: what Megatron-LM's pre-Transformer-Engine code runs as eager kernels (RoPE, SwiGLU, the layout
copies around flash attention), counted byte by byte from the code; and ZeRO-2's reduce-scatter in every
micro-batch (DeepSpeed's stage 2, Megatron-LLaMA's overlapped distributed optimizer)."""

import dataclasses
import json
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "scripts"))
from measure_eager_bytes import ByteCounter, measure  # noqa: E402
from overdrive.env.catalog import gpu_by_key  # noqa: E402
from overdrive.plan.comm import comm_times, dp_exposed, reduces_every_micro_batch
from overdrive.plan.estimate import estimate
from overdrive.plan.setup import TrainSetup, check_layout
from overdrive.plan.specs import ModelSpec
from overdrive.plan.throughput import HBM_EFF, UNFUSED_ELEMS
from overdrive.plan.validation import load_runs, plan_flags, predict
from plan_cli import invoke, refused

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
MEASURED = os.path.join(ROOT, "benchmarks/results/cpu/2026-12-07-eager-bytes/eager-bytes.json")
# LLaMA-13B as Megatron-LLaMA's examples/LLaMA/LLaMA_13_slurm.sh builds it
LLAMA_13B = ModelSpec(name="llama-13b", n_layer=40, hidden=5120, n_head=40, n_kv_head=40, ffn=13824, vocab=32000)
ALL = ("rope", "swiglu", "attn-layout")


def _setup(**kw) -> TrainSetup:
    base = dict(gpu=gpu_by_key("a100-80"), nodes=4, seq=2048, micro_batch=4, global_batch=2048, tp=2,
                precision="bf16", sharding="zero2", checkpointing="none", stack="megatron", inter_gbs=12.5,
                attention="fa1", async_tp=False)
    return TrainSetup(**{**base, **kw})


def test_the_constants_are_the_committed_count_and_the_count_reproduces():
    with open(MEASURED) as f:
        committed = json.load(f)["cases"]
    fresh = measure()
    for op in ALL:
        assert UNFUSED_ELEMS[op] == committed[op]["extra"] == fresh[op]["extra"], op


def test_the_byte_counter_counts_kernels_not_views():
    x, y = torch.randn(64, 32), torch.randn(64, 32)
    c = ByteCounter()
    with c:
        c.bytes = 0
        x.t().reshape(-1)       # a view, then a copy to flatten it: the copy's read and write
        x + y                   # read two, write one
        torch.empty_like(x)     # an allocation moves nothing
        x.add_(y)               # read both, write the target
    n = x.numel() * x.element_size()
    assert c.bytes == 2 * n + 3 * n + 0 + 3 * n


def test_each_op_adds_its_bytes_to_the_memory_bound_time():
    base = estimate(LLAMA_13B, _setup())
    tok = 4 * 2048 / 2   # a TP rank's share of the micro-batch's tokens, in the planner's full-width units
    per_tok = {"rope": 20 * (5120 + 5120), "swiglu": 9 * 13824, "attn-layout": 6 * 5120 + 4 * 5120}
    hbm = gpu_by_key("a100-80").hbm_tbs * 1e12 * HBM_EFF
    for op in ALL:
        e = estimate(LLAMA_13B, _setup(unfused_ops=(op,)))
        added = (e.times["memory_bound"] - base.times["memory_bound"]) / base.setup.grad_accum
        assert added == pytest.approx(40 * tok * per_tok[op] * 2 / hbm, rel=1e-6), op
        assert e.tokens_per_s_per_gpu < base.tokens_per_s_per_gpu
    both = estimate(LLAMA_13B, _setup(unfused_ops=ALL))
    assert both.times["memory_bound"] > 2 * base.times["memory_bound"]   # the eager ops outweigh the fused block


def test_gqa_counts_the_narrower_key_and_value():
    gqa = dataclasses.replace(LLAMA_13B, n_kv_head=8)
    base = estimate(gqa, _setup())
    e = estimate(gqa, _setup(unfused_ops=("attn-layout",)))
    mha = estimate(LLAMA_13B, _setup(unfused_ops=("attn-layout",)))
    ratio = (e.times["memory_bound"] - base.times["memory_bound"]) / (
        mha.times["memory_bound"] - estimate(LLAMA_13B, _setup()).times["memory_bound"])
    assert ratio == pytest.approx((6 * 5120 + 4 * 1024) / (10 * 5120), rel=1e-6)


@pytest.mark.parametrize("kw, needle", [
    (dict(unfused_ops=("rope",), stack="pytorch", compile=False), "add --stack megatron"),
    (dict(unfused_ops=("flash",)), "unfused-ops"),
    (dict(unfused_ops=("attn-layout",), attention="unfused"), "--attention unfused has none"),
])
def test_refusals_name_the_flag_and_the_fix(kw, needle):
    with pytest.raises(ValueError, match=needle):
        _setup(**kw)


def test_the_model_must_have_what_is_named():
    gelu = dataclasses.replace(LLAMA_13B, gated_mlp=False)
    with pytest.raises(ValueError, match="no gated"):
        check_layout(gelu, _setup(unfused_ops=("swiglu",)))
    learned = dataclasses.replace(LLAMA_13B, learned_pos=2048)
    with pytest.raises(ValueError, match="learned positions"):
        check_layout(learned, _setup(unfused_ops=("rope",)))


def test_a_list_is_parsed_once_each():
    s = _setup(unfused_ops="rope, swiglu,rope")
    assert s.unfused_ops == ("rope", "swiglu")


def test_zero2_reduce_scatters_in_every_micro_batch():
    one, four = _setup(global_batch=16 * 4), _setup(global_batch=16 * 4 * 4)   # dp 16 ranks: 1 vs 4 micro-batches
    assert (one.grad_accum, four.grad_accum) == (1, 4)
    assert not reduces_every_micro_batch(one) and reduces_every_micro_batch(four)
    c1, c4 = comm_times(LLAMA_13B, one, 0.0), comm_times(LLAMA_13B, four, 0.0)
    assert c4["dp"] == pytest.approx(c1["dp"] + 3 * c4["dp_rs_mb"])
    assert c4["dp_calls"] == c1["dp_calls"] + 3 * c4["dp_buckets"]
    # ZeRO-1 reduces once a step whatever the accumulation; so does ZeRO-2 under torch pipelining
    z1 = _setup(global_batch=16 * 4 * 4, sharding="zero1")
    assert comm_times(LLAMA_13B, z1, 0.0)["dp"] == pytest.approx(
        comm_times(LLAMA_13B, dataclasses.replace(z1, global_batch=16 * 4), 0.0)["dp"])
    piped = _setup(global_batch=16 * 4 * 4, stack="pytorch", compile=False, attention="fa2", pp=2, nodes=8)
    assert not reduces_every_micro_batch(piped)


def test_zero2s_micro_batch_calls_hide_under_their_own_micro_batch():
    s = _setup(global_batch=16 * 4 * 4)
    c = comm_times(LLAMA_13B, s, 0.0)
    rs = c["dp_rs_mb"]
    exposed, hide = dp_exposed(s, c, t_mb=100 * rs, bubble=0.0)   # long micro-batches hide every call
    assert exposed < c["dp"] / 4 and hide == pytest.approx(4 * 100 * rs)
    exposed, _ = dp_exposed(s, c, t_mb=rs / 100, bubble=0.0)       # short ones hide nothing
    assert exposed == pytest.approx(c["dp"], rel=0.02)


def test_megatron_llama_rows_say_what_its_code_ran():
    rows = [r for r in load_runs() if r["id"].startswith("Megatron-LLaMA")]
    assert len(rows) == 5
    for r in rows:
        flags = plan_flags(r)
        assert "--unfused-ops rope,swiglu,attn-layout" in flags and "--no-async-tp" in flags, flags
        assert abs(predict(r)["error"]) < 0.35


def test_cli_plans_explains_and_refuses_in_one_line(capsys):
    args = ("--layers", "40", "--hidden", "5120", "--heads", "40", "--ffn", "13824", "--vocab", "32000", "--gpu",
            "a100-80", "--gpus", "8", "--nodes", "4", "--seq", "2048", "--global-batch", "2048", "--micro-batch",
            "4", "--precision", "bf16", "--sharding", "zero2", "--tp", "2", "--checkpointing", "none", "--stack",
            "megatron", "--attention", "fa1", "--no-async-tp")
    cp = invoke(capsys, *args, "--unfused-ops", "rope,swiglu,attn-layout", "--json")
    assert cp.returncode == 0, cp.stderr
    cands = json.loads(cp.stdout)["candidates"]
    assert cands and all(c["unfused_ops"] == ["rope", "swiglu", "attn-layout"] for c in cands)
    cp = invoke(capsys, *args, "--unfused-ops", "rope", "--explain")
    assert cp.returncode == 0 and "20(q+kv) rope" in " ".join(cp.stdout.split())
    refused(invoke(capsys, *args, "--unfused-ops", "gelu"), "--unfused-ops")
    pytorch = args[:-5] + ("--attention", "fa2", "--no-compile")   # without --stack megatron
    refused(invoke(capsys, *pytorch, "--unfused-ops", "rope"), "--stack megatron")
    refused(invoke(capsys, *args, "--gelu-mlp", "--unfused-ops", "swiglu"), "no gated")
