"""DeepSpeed's PipelineEngine (--deepspeed-pipeline) and the tied embedding's all-reduce under pipelining
(comm.py, throughput.py): each term checked against its formula, and the planner without it."""

import dataclasses

import pytest

from overdrive.plan import TrainSetup, estimate, explain
from overdrive.plan.collectives import LINK_EFF, choose_allreduce, gather_s
from overdrive.plan.comm import DS_ALLREDUCE_ELEMENTS, comm_times
from overdrive.plan.search import plan
from overdrive.plan.throughput import BF16_ACCUM_BYTES, HBM_EFF
from overdrive.plan.validation import load_runs, plan_flags, predict

from plan_models import A100, BLOOM, bloom_setup


def _setup(**kw) -> TrainSetup:
    return bloom_setup(**{"micro_batch": 1, "global_batch": 192, **kw})


def test_gradients_reduced_after_the_flush_are_all_exposed():
    on = estimate(BLOOM, _setup())
    off = estimate(BLOOM, _setup(deepspeed_pipeline=False))
    assert on.times["dp_exposed"] == pytest.approx(on.times["dp_comm"])
    # the overlapped schedule hides most of it under the last micro-batch and the drain
    assert off.times["dp_exposed"] < 0.1 * off.times["dp_comm"]


def test_bf16_optimizer_all_reduces_fp32_grads_then_gathers_bf16_params():
    s = _setup()
    c = comm_times(BLOOM, s, 0.0)
    P = BLOOM.n_params() / (s.tp * s.pp)
    nb = -(-P // DS_ALLREDUCE_ELEMENTS)
    # the DP group: 8 replicas, 2 per node (tp 4 fills half a node), 4 nodes, 2 NICs per member pair
    bw = LINK_EFF * min(A100.nvlink_gbs, 2 * s.inter_gbs) * 1e9
    per = choose_allreduce(P * 4 / nb, 8, 4, bw)[1] + gather_s(P * 2 / nb, 8, 4, bw)
    assert c["dp_buckets"] == nb and c["dp"] == pytest.approx(nb * per)
    fp16 = comm_times(BLOOM, dataclasses.replace(s, precision="fp16"), 0.0)
    assert fp16["dp"] < c["dp"]   # fp16 ZeRO-1: a reduce-scatter, not an fp32 all-reduce


def test_fp32_gradient_accumulation_every_micro_batch_with_bf16_only():
    s = _setup()
    e = estimate(BLOOM, s)
    per_mb = BF16_ACCUM_BYTES * BLOOM.n_params() / (s.tp * s.pp) / (A100.hbm_tbs * 1e12 * HBM_EFF)
    assert e.times["fp32_grad_accum"] == pytest.approx(s.grad_accum * per_mb)
    assert estimate(BLOOM, dataclasses.replace(s, precision="fp16")).times["fp32_grad_accum"] == 0
    assert estimate(BLOOM, _setup(deepspeed_pipeline=False)).times["fp32_grad_accum"] == 0
    # it is in the micro-batch time, so the bubble carries it too
    without = dataclasses.replace(s, precision="fp16")
    assert e.step_s - estimate(BLOOM, without).step_s > s.grad_accum * per_mb


def test_tied_embedding_all_reduced_between_the_pipeline_ends():
    s = _setup(deepspeed_pipeline=False)
    e = estimate(BLOOM, s)
    # first and last stage are 11·32 ranks apart: two nodes, one GPU each, over one NIC
    expect = choose_allreduce(BLOOM.vocab * BLOOM.hidden / 4 * 4, 2, 2, LINK_EFF * s.inter_gbs * 1e9)[1]
    assert e.times["embed_allreduce"] == pytest.approx(expect)
    assert e.step_s == pytest.approx(e.compute_s + e.times["dp_exposed"] + e.times["nccl_sms"] + expect)
    untied = dataclasses.replace(BLOOM, tied=False)
    assert estimate(untied, s).times["embed_allreduce"] == 0
    assert estimate(BLOOM, _setup(pp=1, tp=8, global_batch=48, deepspeed_pipeline=False)).times["embed_allreduce"] == 0
    bf16_grads = estimate(BLOOM, dataclasses.replace(s, grad_dtype="bf16")).times["embed_allreduce"]
    assert bf16_grads < 0.6 * expect


def test_refusals_name_the_fix():
    with pytest.raises(ValueError, match="use --sharding zero1 or none"):
        _setup(sharding="fsdp")
    with pytest.raises(ValueError, match="no interleaved schedule"):
        _setup(vpp=2, global_batch=384)


def test_search_keeps_to_what_the_engine_runs():
    e = estimate(BLOOM, _setup(vpp=None, global_batch=384))   # 48 micro-batches: interleaving would be possible
    assert e.setup.vpp == 1 and "DeepSpeed's PipelineEngine runs 1F1B only" in e.notes[0]
    got = plan(BLOOM, A100, precisions=["bf16"], checkpointing=["full"], micro_batches=[1], gpus_per_node=8,
               nodes=48, seq=2048, global_batch=192, tp=4, pp=12, stack="megatron", deepspeed_pipeline=True)
    assert {c["sharding"] for c in got["candidates"]} <= {"zero1", "none"}
    assert any("fp32_grad_accum" in line for line in explain(e))


def test_published_deepspeed_rows_carry_the_flag():
    rows = [r for r in load_runs() if r.get("deepspeed_pipeline")]
    assert {r["id"].split()[0] for r in rows} == {"BLOOM-176B", "MT-NLG"}
    for r in rows:
        assert "--deepspeed-pipeline" in plan_flags(r)
        assert predict(r)["vpp"] == 1


def test_checkpoints_whole_on_every_tp_rank_without_partition_activations():
    from overdrive.plan.memory import terms

    split, whole = _setup(global_batch=2048, micro_batch=2), _setup(global_batch=2048, micro_batch=2,
                                                                     partition_activations=False)
    a, b = terms(BLOOM, split)["activations"], terms(BLOOM, whole)["activations"]
    # the stored inputs (in flight on the first stage) grow tp-fold; the one block being recomputed does not
    block_input = 2 * 2048 * BLOOM.hidden * 2 / 4
    from overdrive.plan.pipeline import pipeline_blocks_in_flight

    assert b - a == pytest.approx(pipeline_blocks_in_flight(BLOOM, split) * block_input * 3, rel=1e-6)
    sp = dataclasses.replace(whole, sequence_parallel=True)   # with SP the input is sharded over the sequence
    assert terms(BLOOM, sp)["activations"] == pytest.approx(terms(BLOOM, dataclasses.replace(split, sequence_parallel=True))["activations"])


def test_bf16_optimizer_keeps_bf16_grads_beside_the_fp32_ones():
    from overdrive.plan.memory import terms

    from overdrive.plan.pipeline import stage_params

    s = _setup()
    t = terms(BLOOM, s)
    P = stage_params(BLOOM, s)[t["pp_rank"]] / s.tp   # the planned (busiest) stage's parameters
    assert t["grads"] == pytest.approx(6 * P)
    assert terms(BLOOM, _setup(deepspeed_pipeline=False))["grads"] == pytest.approx(4 * P)
    assert terms(BLOOM, dataclasses.replace(s, precision="fp16"))["grads"] == pytest.approx(4 * P)
