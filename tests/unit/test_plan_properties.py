"""Properties the planner keeps over many realistic configurations (seeded random draws, 1B-405B models, A100 to
GB200, 1-512 nodes, tp/pp/cp/vpp that divide, both stacks, every checkpointing, bf16/fp8): no crash, one-line
refusals that name the flag, nothing real frameworks run refused, sane figures, the explained terms adding up to
the step, and the monotonic behaviour physics asks for."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import random
import re
import subprocess
import sys

import pytest

from overdrive.env.catalog import gpu_by_key
from overdrive.plan import ModelSpec, TrainSetup, estimate, explain, get_model, plan
from overdrive.plan.explain import NOT_ADDED
from overdrive.plan.memory import _states
from overdrive.plan.pipeline import chunk_slots, stage_imbalance

GPUS = ("a100-40", "a100-80", "h100-sxm", "h200", "b200", "gb200")
MODELS = ("llama3-1b", "llama3-8b", "llama2-13b", "gpt3-5b", "gpt-64b", "llama3-70b", "gpt3-175b",
          "nemotron4-340b", "llama3-405b")
DRAWS = 300
EXTRA = dict(sequence_parallel=(True, False), sp_regather=(None, True), attention=("flash", "fa2", "cudnn", "unfused"), z_loss=(False, True),
             gather_dtype=("", "fp32", "bf16"), fused_kernels=(False, True), loss=("standard", "fused", "hf", "chunked"),
             offload=("none", "optimizer"), lora_rank=(0, 16), grad_dtype=("fp32", "bf16"),
             optimizer=("adamw", "adamw-8bit", "lion"), deepspeed_pipeline=(False, True),
             embedding_in_pipeline_split=(False, True), fp8_activations=(False, True), async_tp=(None, True, False),
             partition_activations=(True, False), master_weights=("fp32", "remainder"))


def _draw(rnd: random.Random):
    """A model and a TrainSetup's fields; None where the degrees do not divide the GPUs (a refusal, checked apart)."""
    m = get_model(rnd.choice(MODELS))
    gpn, nodes = rnd.choice((8, 8, 8, 4)), rnd.choice((1, 2, 4, 8, 16, 32, 64, 128, 256, 512))
    tp, pp, cp = rnd.choice((1, 2, 4, 8, 16)), rnd.choice((1, 1, 2, 4, 8, 16)), rnd.choice((1, 1, 2, 4))
    kw = dict(gpu=gpu_by_key(rnd.choice(GPUS)), gpus_per_node=gpn, nodes=nodes, tp=tp, pp=pp, cp=cp,
              vpp=rnd.choice((1, 1, 2, 4, None)) if pp > 1 else 1, stack=rnd.choice(("pytorch", "megatron")),
              precision=rnd.choice(("bf16", "fp8")), checkpointing=rnd.choice(("none", "selective", "full")),
              sharding=rnd.choice(("fsdp", "hsdp", "zero1", "none") if nodes > 1 else ("fsdp", "zero1", "none")),
              micro_batch=rnd.choice((1, 2, 4)), seq=rnd.choice((2048, 4096, 8192)))
    for k, choices in EXTRA.items():   # now and then a setting of the older stacks or a memory saver
        if rnd.random() < 0.15:
            kw[k] = rnd.choice(choices)
    return m, kw, rnd.choice((1, 2, 4, 8))


def _one_line_naming_a_flag(err: ValueError) -> None:
    msg = str(err)
    assert "\n" not in msg and "--" in msg, msg


def _cases(seed: int):
    """(model, setup, estimate) for every draw the planner accepts; refusals are checked on the way."""
    rnd, out = random.Random(seed), []
    for _ in range(DRAWS):
        m, kw, accum = _draw(rnd)
        try:
            s = TrainSetup(**kw)
            s = dataclasses.replace(s, global_batch=s.micro_batch * s.dp * accum)
            e = estimate(m, s)
        except ValueError as err:
            _one_line_naming_a_flag(err)
            continue
        out.append((m, e.setup, e))
    assert len(out) > DRAWS // 2   # most draws are real layouts: the properties below ran on them
    return out


@pytest.fixture(scope="module", params=[int(x) for x in os.environ.get("PLAN_PROPERTY_SEEDS", "0,1").split(",")])
def cases(request):
    return _cases(request.param)


def _sane(e) -> None:
    s = e.setup
    assert 0 < e.step_s < math.inf and e.tokens_per_s_per_gpu > 0 and 0 < e.memory_gib < math.inf
    # MFU is reported against the bf16 peak; what runs cannot beat the peak of the precision it runs at
    peak = s.gpu.fp8_tflops if s.low_precision else s.gpu.bf16_tflops
    assert 0 < e.mfu * s.gpu.bf16_tflops / peak < 1, (e.label, e.mfu)
    assert all(v >= 0 and math.isfinite(v) for v in e.times.values()), e.times
    assert all(v >= 0 and math.isfinite(v) for v in e.breakdown_gib.values()), e.breakdown_gib


def _step_sum(e) -> float:
    return sum(v for k, v in e.times.items() if k not in NOT_ADDED)


def test_figures_are_finite_and_sane_and_the_terms_add_up_to_the_step(cases):
    for _, _, e in cases:
        _sane(e)
        assert _step_sum(e) == pytest.approx(e.step_s, rel=1e-9)


def test_explain_prints_terms_that_add_up_to_the_step_it_prints(cases):
    for _, _, e in cases[::25]:
        lines = explain(e)
        start = lines.index(next(x for x in lines if x.startswith("time per optimizer step")))
        terms = [float(m.group(1)) for x in lines[start + 1:]
                 if (m := re.match(r"  (?!step)\w+ +([\d.]+) ms  ", x))]
        step = float(re.search(r"  step +([\d.]+) ms", "\n".join(lines)).group(1))
        assert terms
        assert sum(terms) == pytest.approx(step, abs=0.05 * len(terms) + 0.05)


def test_more_inter_node_bandwidth_never_lowers_tokens_per_s(cases):
    for m, s, e in cases:
        if s.nodes > 1:
            faster = estimate(m, dataclasses.replace(s, inter_gbs=2 * s.net_gbs))
            assert faster.tokens_per_s_per_gpu >= e.tokens_per_s_per_gpu * (1 - 1e-9), (s, e.tokens_per_s_per_gpu)


def test_more_accumulation_never_lowers_tokens_per_s(cases):
    # at the same virtual stages: with --vpp searched, more micro-batches in flight may leave a faster vpp
    # without room (Megatron's interleaved warm-up grows with them), which the search says in its notes
    for m, s, e in cases:
        more = estimate(m, dataclasses.replace(s, global_batch=2 * s.global_batch))
        assert more.tokens_per_s_per_gpu >= e.tokens_per_s_per_gpu * (1 - 1e-9), (s, e.tokens_per_s_per_gpu)


def test_more_checkpointing_never_raises_memory_or_speed(cases):
    order = ("none", "selective", "full")
    for m, s, e in cases:
        for more in order[order.index(s.checkpointing) + 1:]:
            r = estimate(m, dataclasses.replace(s, checkpointing=more))
            assert r.memory_gib <= e.memory_gib + 1e-9, (s, more)
            assert r.tokens_per_s_per_gpu <= e.tokens_per_s_per_gpu * (1 + 1e-9), (s, more)


def test_fp8_never_holds_more_weight_memory_than_bf16(cases):
    """Stage by stage: the busiest stage itself may change (Transformer Engine's FP8 weight cache under Megatron
    grows with a stage's blocks, not its embedding), the weights of each stage never grow."""
    for m, s, e in cases:
        if s.precision == "bf16" and s.gpu.fp8_tflops:
            fp8 = estimate(m, dataclasses.replace(s, precision="fp8")).setup
            for rank in range(s.pp):
                assert _states(m, fp8, rank)[0] <= _states(m, dataclasses.replace(fp8, precision="bf16"), rank)[0] + 1, s


def test_doubling_nodes_at_the_same_per_gpu_batch_never_speeds_the_step_up(cases):
    """Only the sharded optimizer step shrinks (each GPU steps half the parameters); everything else only grows
    with more ranks. Megatron's default gradient bucket grows with the data-parallel size (max(40M, 1M·dp)
    parameters, megatron/core/distributed/distributed_data_parallel_config.py), so its bucket count, and the
    latency paid per bucket, falls (and with it the SMs NCCL holds under the backward, nccl_sms): a few percent
    of the step, never more. When the data-parallel group leaves its node NCCL runs 16 ring channels instead
    of 24 (collectives.nccl_channels), so the compute under the calls gets SMs back: that term alone may fall."""
    for m, s, e in cases:
        if s.nodes > 256:
            continue
        big = estimate(m, dataclasses.replace(s, nodes=2 * s.nodes, global_batch=2 * s.global_batch))
        before, after = e.step_s - e.times["optimizer"], big.step_s - big.times["optimizer"]
        if e.comm["dp_nodes"] == 1 < big.comm["dp_nodes"]:
            before, after = before - e.times["nccl_sms"], after - big.times["nccl_sms"]
        assert after >= before * (1 - (0.04 if s.stack == "megatron" else 1e-9)), (s, before, after)
        if s.stack == "megatron":   # the rest of the step, without the data-parallel terms, never shrinks
            rest = [x.step_s - x.times["optimizer"] - x.times["dp_exposed"] - x.times["nccl_sms"] for x in (e, big)]
            assert rest[1] >= rest[0] * (1 - 1e-9)


def test_random_plans_rank_candidates_with_sane_figures():
    rnd = random.Random(7)
    planned = 0
    for _ in range(12):
        m, kw, accum = _draw(rnd)
        kw = {k: v for k, v in kw.items() if k not in ("precision", "checkpointing", "sharding", "micro_batch")}
        g = kw.pop("gpu")
        try:
            base = TrainSetup(gpu=g, **kw)
            r = plan(m, g, global_batch=base.dp * 4 * accum, **kw)
        except ValueError as err:
            _one_line_naming_a_flag(err)
            continue
        planned += 1
        for c in r["candidates"]:
            assert c["step_s"] > 0 and c["tokens_per_s_per_gpu"] > 0 and c["memory_gib"] > 0
            assert all(v >= 0 for v in c["times_s"].values())
    assert planned >= 6


# what real frameworks run, never refused
PUBLISHED_SHAPES = [
    # TP across nodes in whole nodes (Megatron-LM 2021 ran tp 8 on 8-GPU nodes; tp 16 over two 8-GPU nodes)
    ("llama3-405b", dict(gpu="h100-sxm", nodes=64, tp=16, pp=4, global_batch=64)),
    # 4 GPUs per node (GB200 NVL trays, A100 40GB 4-GPU hosts), tp across two of them
    ("llama3-70b", dict(gpu="gb200", gpus_per_node=4, nodes=16, tp=8, pp=2, global_batch=64)),
    ("llama3-8b", dict(gpu="a100-40", gpus_per_node=4, nodes=8, global_batch=128)),
    # uneven blocks per stage (torchtitan splits 126 blocks over 8 stages as 16 x 6 + 15 x 2)
    ("llama3-405b", dict(gpu="h100-sxm", nodes=64, tp=8, pp=8, global_batch=256)),
    # fewer KV heads than TP ranks: each KV head replicated
    ("llama3-70b", dict(gpu="h100-sxm", nodes=4, tp=16, global_batch=32)),
    # global batch with gradient accumulation, on the Megatron stack
    ("gpt3-175b", dict(gpu="a100-80", nodes=128, tp=8, pp=8, global_batch=1536, stack="megatron")),
]


@pytest.mark.parametrize("name,kw", PUBLISHED_SHAPES)
def test_published_layouts_are_planned(name, kw):
    kw = dict(kw)
    r = plan(get_model(name), kw.pop("gpu"), **kw)
    assert r["candidates"] and all(c["tokens_per_s_per_gpu"] > 0 for c in r["candidates"])


@pytest.mark.parametrize("stack", ["pytorch", "megatron"])
def test_a_vocab_tp_does_not_divide_is_planned(stack):
    # GPT-2's 50,257 tokens, Mistral/Llama-2 style 32,001: Megatron pads the vocab to a multiple of tp
    for vocab in (50257, 32001):
        m = ModelSpec(name="odd-vocab", n_layer=24, hidden=2048, n_head=16, n_kv_head=16, ffn=8192, vocab=vocab,
                      gated_mlp=False)
        r = plan(m, "h100-sxm", tp=8, nodes=2, global_batch=64, stack=stack)
        assert r["top"] is not None


def test_the_cli_plans_tp_across_nodes_as_one_json_document():
    env = {**os.environ, "PYTHONPATH": os.path.join(os.path.dirname(__file__), "..", "..", "src")}
    out = subprocess.run([sys.executable, "-m", "overdrive", "plan", "--model", "llama3-405b", "--gpu", "h100-sxm",
                          "--nodes", "64", "--tp", "16", "--pp", "4", "--global-batch", "64", "--json"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["top"]["tp"] == 16 and any("spans 2 nodes" in n for n in doc["top"]["notes"])


def test_an_uneven_pipeline_split_runs_at_its_busiest_rank():
    """41 blocks over 8 stages: the first stage holds 6 (torchtitan's split), the others 5; every micro-batch
    waits for the 6, so the blocks' time is that of 6 blocks per stage, not of 41/8."""
    def shaped(layers):
        return ModelSpec(name=f"l{layers}", n_layer=layers, hidden=4096, n_head=32, n_kv_head=8, ffn=14336,
                         vocab=128256)
    s = TrainSetup(gpu=gpu_by_key("h100-sxm"), nodes=1, pp=8, global_batch=32, sharding="none")
    assert chunk_slots(shaped(41), s) == [6, 5, 5, 5, 5, 5, 5, 5]
    assert stage_imbalance(shaped(41), s) == pytest.approx(6 * 8 / 41)
    assert stage_imbalance(shaped(40), s) == 1.0
    even, uneven = estimate(shaped(40), s), estimate(shaped(48), s)
    odd = estimate(shaped(41), s)
    # 41 blocks cost the pipeline what 48 (6 a stage) do, not 41/40 of 40
    assert odd.times["gemm"] == pytest.approx(uneven.times["gemm"], rel=0.02)
    # (the head's GEMM is the same in all three: the 8 extra blocks' time is all there, not an eighth of it)
    assert odd.times["gemm"] - even.times["gemm"] > 0.9 * (uneven.times["gemm"] - even.times["gemm"])
    # interleaved, the extra blocks spread over the ranks: 41 over 8 x 2 chunks, rank 0 holds 3 + 3
    s2 = dataclasses.replace(s, vpp=2)
    assert chunk_slots(shaped(41), s2)[:9] == [3, 3, 3, 3, 3, 3, 3, 3, 3]
    assert stage_imbalance(shaped(41), s2) == pytest.approx(6 * 8 / 41)


def test_memory_grows_with_what_a_gpu_holds_and_shrinks_with_what_it_shards(cases):
    """Sequence parallelism off keeps the norm tensors whole on every TP rank; a larger micro-batch or sequence
    holds more activations; FSDP/ZeRO over twice the nodes holds a smaller shard; a faster NVLink never slows."""
    for m, s, e in cases:
        if s.tp > 1:
            assert estimate(m, dataclasses.replace(s, sequence_parallel=False)).memory_gib >= e.memory_gib - 1e-9, s
        bigger = dataclasses.replace(s, micro_batch=2 * s.micro_batch, global_batch=2 * s.global_batch)
        assert estimate(m, bigger).memory_gib >= e.memory_gib - 1e-9, s
        assert estimate(m, dataclasses.replace(s, seq=2 * s.seq)).memory_gib >= e.memory_gib - 1e-9, s
        # From one shard to two is not monotone, nor with the optimizer offloaded, and physics says so: under a
        # pipeline FSDP keeps every block gathered, and its unsharded gradients, across the micro-batches, so
        # sharding adds those copies; only the states it then halves pay for them (a 340B model at TP4 PP2 with
        # the optimizer offloaded: 249 GiB on one shard, 368 on two).
        if s.sharding in ("fsdp", "zero1") and s.nodes <= 256 and s.offload == "none" and s.shards > 1:
            # NCCL's buffers aside: a group that leaves its node connects its tree too (collectives.communicator_bytes)
            wider = estimate(m, dataclasses.replace(s, nodes=2 * s.nodes, global_batch=2 * s.global_batch))
            assert wider.memory_gib - wider.nccl_gib <= e.memory_gib - e.nccl_gib + 1e-9, s
            assert wider.nccl_gib <= 3 * max(e.nccl_gib, 0.5), s
        nvlink = dataclasses.replace(s, intra_gbs=2 * s.gpu.nvlink_gbs)
        assert estimate(m, nvlink).tokens_per_s_per_gpu >= e.tokens_per_s_per_gpu * (1 - 1e-9), s


def test_a_one_micro_batch_pipeline_peaks_where_gradients_and_logits_meet():
    """One micro-batch a step: the last stage's backward holds all its gradients beside the logits, which can
    top the first stage's larger activations. Picking the end by activations alone made turning sequence
    parallelism off (more activations) plan 0.5 GiB less (llama2-13b, 1,024 B200s, TP2 PP16 CP4)."""
    from overdrive.plan.memory import terms

    # 48 blocks, 3 on each of the 16 stages (with llama2-13b's 40, the first eight stages hold one block more than
    # the last and, with the embedding, more states: the first stage is the peak, its gradients and all)
    m = dataclasses.replace(get_model("llama2-13b"), n_layer=48)
    s = TrainSetup(gpu=gpu_by_key("b200"), nodes=128, tp=2, pp=16, cp=4, stack="megatron", sharding="zero1",
                   checkpointing="selective", micro_batch=4, seq=8192)
    s = dataclasses.replace(s, global_batch=4 * s.dp)
    off = dataclasses.replace(s, sequence_parallel=False)
    t = terms(m, off)
    # one micro-batch of 3 blocks at either end (selective recompute of one of three keeps no less than all three:
    # no separate recompute buffer); at the loss's peak the last stage has not the backward's gradients yet
    from overdrive.plan.memory import backward_grad_bytes
    assert t["pp_first"] == pytest.approx(t["pp_last"] - t["logits"] + backward_grad_bytes(m, off))
    assert t["logits"] > 0 and t["pp_rank"] == 15 and t["grads_at_peak"] == 0   # without SP the loss's peak is it
    on = terms(m, s)   # with SP the backward's end peaks: all of the stage's gradients beside one block
    assert on["pp_rank"] == 15 and on["grads_at_peak"] > 0
    assert estimate(m, off).memory_gib > estimate(m, s).memory_gib


def test_lora_mfu_counts_the_flops_a_frozen_base_does():
    """LoRA's base weights get no weight gradient: 4N per token, not 6N, plus the adapters' 6. Counted as 6N, a
    175B LoRA step planned at 107% MFU of the bf16 peak."""
    from overdrive.plan.estimate import model_flops_per_token
    from overdrive.plan.memory import lora_params

    m = get_model("gpt3-175b")
    s = TrainSetup(gpu=gpu_by_key("h200"), gpus_per_node=4, nodes=64, stack="megatron", sharding="none",
                   micro_batch=4, seq=8192, lora_rank=16, loss="fused", sequence_parallel=False)
    s = dataclasses.replace(s, global_batch=8 * s.dp)
    assert model_flops_per_token(m, s) == m.flops_per_token(8192) - 2 * m.n_params_matmul() + 6 * lora_params(m, 16)
    e = estimate(m, s)
    assert 0 < e.mfu < 1
    full = estimate(m, dataclasses.replace(s, lora_rank=0))
    assert e.tokens_per_s_per_gpu > full.tokens_per_s_per_gpu   # a third fewer GEMMs...
    assert abs(e.mfu - full.mfu) < 0.1                          # ...at about the same share of the peak


@pytest.mark.parametrize("split", [False, True])
def test_checkpointing_a_one_block_stage_keeps_no_more_than_not_checkpointing(split):
    """24 blocks over 16 stages: the last holds one block (none besides the loss with the embedding and the loss
    in the split). Full checkpointing's recompute buffer is that block's own activations, not more: the planner
    counted the buffer on top of what the stage stored, so full planned more memory than selective."""
    m = get_model("gpt3-5b")
    s = TrainSetup(gpu=gpu_by_key("gb200"), nodes=256, pp=16, vpp=1, precision="fp8", sharding="fsdp",
                   checkpointing="selective", seq=8192, embedding_in_pipeline_split=split)
    s = dataclasses.replace(s, global_batch=4 * s.dp)
    mems = [estimate(m, dataclasses.replace(s, checkpointing=ac)).memory_gib for ac in ("none", "selective", "full")]
    assert mems == sorted(mems, reverse=True)


def test_fsdp_with_the_optimizer_offloaded_still_holds_its_16_bit_shard():
    """--offload optimizer moves the states and the fp32 master to the CPU; the 16-bit shard FSDP gathers from
    stays on the GPU (ZeRO-Offload). It planned no weights at all, so one data-parallel rank (no gathered
    buffers either) held none: nemotron4-340b over 8 H100s planned 170 GiB, and 329 GiB on twice the GPUs."""
    m = get_model("nemotron4-340b")
    s = TrainSetup(gpu=gpu_by_key("h100-sxm"), gpus_per_node=4, nodes=2, tp=4, pp=2, sharding="fsdp",
                   checkpointing="full", offload="optimizer", global_batch=2)
    P = m.n_params() / (s.tp * s.pp)
    for nodes in (2, 4, 8):
        e = estimate(m, dataclasses.replace(s, nodes=nodes, global_batch=nodes))
        assert e.breakdown_gib["params"] * 2**30 == pytest.approx(2 * P / e.setup.shards)
        assert e.breakdown_gib["optimizer"] == 0
