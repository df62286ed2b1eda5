"""Pipeline stages that are not alike (plan/pipeline.py, memory.terms): each stage's parameters, the busiest stage
planned, what the embedding stage keeps per micro-batch in flight (--embed-norm, --dropout), DeepSpeed's kept
stage outputs, and the BLOOM-176B rows they were written for."""

import dataclasses
import json
import random

import pytest

from overdrive.env import gpu_by_key
from overdrive.plan import ModelSpec, TrainSetup
from overdrive.plan.memory import _activations, _buffers, _states, act_bytes_per_layer, terms
from overdrive.plan.pipeline import (embedding_bytes, embedding_micro_batches, stage_blocks, stage_outputs_bytes,
                                     stage_params)
from overdrive.plan.validation import load_runs, predict

from plan_cli import run  # noqa: F401 (a fixture)
from plan_models import A100, BLOOM, bloom_setup


def _bloom(**kw) -> TrainSetup:
    """tr11-176B-ml as launched: TP4 PP12 DP8, MBS 2, GBS 2048, DeepSpeed's PipelineEngine and BF16_Optimizer."""
    return bloom_setup(**{"micro_batch": 2, "global_batch": 2048, "partition_activations": False,
                          "embedding_in_pipeline_split": True, "embed_norm": True, "dropout": True, **kw})


@pytest.mark.parametrize("seed", range(40))
def test_stage_parameters_add_up_to_the_model(seed):
    rng = random.Random(seed)
    h = rng.choice([512, 1024, 2048, 4096])
    tied, split = rng.random() < 0.5, rng.random() < 0.5
    m = ModelSpec(name="m", n_layer=rng.randint(4, 96), hidden=h, n_head=h // 128, n_kv_head=h // 128,
                  ffn=4 * h, vocab=rng.choice([32000, 50304, 128256]), tied=tied, bias=rng.random() < 0.5,
                  gated_mlp=rng.random() < 0.5, learned_pos=rng.choice([0, 2048]))
    slots = m.n_layer + (2 if split else 0)
    pp = rng.choice([p for p in (1, 2, 4, 8) if p <= slots])
    vpp = rng.choice([v for v in (1, 2, 3) if pp > 1 and pp * v <= slots] or [1])
    s = TrainSetup(gpu=A100, gpus_per_node=8, nodes=max(1, pp // 8), pp=pp, vpp=vpp, stack="megatron",
                   sharding="zero1", embedding_in_pipeline_split=split)
    P = stage_params(m, s)
    assert len(P) == pp and sum(stage_blocks(m, s)) == m.n_layer
    # every block on exactly one stage; the embedding on the first, the head on the last, a tied one on both
    assert sum(P) == pytest.approx(m.n_params() + (m.vocab * m.hidden if tied and pp > 1 else 0))
    if pp > 1:
        assert P[0] >= stage_blocks(m, s)[0] * m.layer_params() + m.vocab * m.hidden


def test_bloom_stages_first_and_last_hold_the_embedding_beside_five_blocks():
    s = _bloom()
    # 70 blocks + the embedding's two slots over 12 stages: 6 slots each (DeepSpeed's partition_balanced)
    assert stage_blocks(BLOOM, s) == [5] + [6] * 10 + [5]
    P = stage_params(BLOOM, s)
    layer, emb = BLOOM.layer_params(), BLOOM.vocab * BLOOM.hidden
    assert P[0] == 5 * layer + emb and P[5] == 6 * layer and P[-1] == 5 * layer + emb + 2 * BLOOM.hidden
    # the first stage holds 8% more than the average stage the planner used to plan
    assert P[0] / (BLOOM.n_params() / 12) == pytest.approx(1.085, abs=0.002)


def _stage_total(m, s, rank):
    params, grads, opt = _states(m, s, rank)
    acts = _activations(m, s, rank)[0]
    return params + opt + _buffers(m, s, rank) + acts + grads   # grad_accum > 1 in every setup below


@pytest.mark.parametrize("kw", [{}, dict(embed_norm=False, dropout=False), dict(embedding_in_pipeline_split=False),
                                dict(tp=8, nodes=48, global_batch=1024), dict(micro_batch=1, global_batch=192)])
def test_the_busiest_stage_is_the_one_planned(kw):
    s = _bloom(**kw)
    assert s.grad_accum > 1
    t = terms(BLOOM, s)
    totals = [_stage_total(BLOOM, s, r) for r in range(s.pp)]
    assert t["pp_rank"] == max(range(s.pp), key=totals.__getitem__)
    assert t["allocated"] == pytest.approx(max(totals) + (t["logits"] if t["pp_rank"] == s.pp - 1 else 0))
    # BLOOM's first stage: the embedding, and 12 micro-batches in flight
    assert t["pp_rank"] == 0
    P0 = stage_params(BLOOM, s)[0] / s.tp
    assert t["grads"] == pytest.approx(6 * P0)   # the BF16_Optimizer's fp32 + bf16 gradients of that stage


def test_a_heavy_head_moves_the_peak_to_the_last_stage():
    # untied 256K vocabulary on a small model: the last stage holds the head and its logits
    m = ModelSpec(name="m", n_layer=8, hidden=2048, n_head=16, n_kv_head=16, ffn=8192, vocab=256000, tied=False)
    s = TrainSetup(gpu=A100, gpus_per_node=8, pp=4, vpp=1, seq=2048, global_batch=64, stack="megatron",
                   sharding="zero1", checkpointing="full")
    t = terms(m, s)
    assert t["pp_rank"] == 3 and t["logits"] > 0
    assert stage_params(m, s)[3] > stage_params(m, s)[1]


def test_dropout_adds_one_byte_per_element_per_site():
    s = _bloom(attention="flash", embed_norm=False, dropout=False)
    on = dataclasses.replace(s, dropout=True)
    tokens = s.seq * s.micro_batch
    # two masks per block of h bytes per token, on every TP rank without sequence parallelism
    assert act_bytes_per_layer(BLOOM, on) - act_bytes_per_layer(BLOOM, s) == pytest.approx(tokens * 2 * BLOOM.hidden)
    sp = dataclasses.replace(on, sequence_parallel=True)
    assert act_bytes_per_layer(BLOOM, sp) - act_bytes_per_layer(BLOOM, dataclasses.replace(sp, dropout=False)) == \
        pytest.approx(tokens * 2 * BLOOM.hidden / s.tp)
    # the embedding dropout's mask, for each of the pp micro-batches the first stage holds (1F1B), never recomputed;
    # under full recompute a block's masks count once, in the block being recomputed
    assert embedding_bytes(BLOOM, on) == tokens * BLOOM.hidden and embedding_micro_batches(BLOOM, on) == 12
    diff = terms(BLOOM, on)["activations"] - terms(BLOOM, s)["activations"]
    assert diff == pytest.approx(12 * tokens * BLOOM.hidden + tokens * 2 * BLOOM.hidden)


def test_embed_norm_keeps_its_input_per_micro_batch_in_flight():
    s = _bloom(dropout=False, embed_norm=False)
    on = dataclasses.replace(s, embed_norm=True)
    tokens = s.seq * s.micro_batch
    assert embedding_bytes(BLOOM, on) == tokens * (2 * BLOOM.hidden + 8)   # 16-bit input, fp32 mean and rstd
    assert terms(BLOOM, on)["activations"] - terms(BLOOM, s)["activations"] == \
        pytest.approx(12 * tokens * (2 * BLOOM.hidden + 8))
    # one micro-batch a step: one in flight; interleaved (pp 4, v 2): rank 0's 11 warm-up forwards, 7 on chunk 0
    assert embedding_micro_batches(BLOOM, dataclasses.replace(on, global_batch=16)) == 1
    m = ModelSpec(name="m", n_layer=16, hidden=1024, n_head=8, n_kv_head=8, ffn=4096, vocab=32000)
    il = TrainSetup(gpu=A100, gpus_per_node=8, pp=4, vpp=2, global_batch=64, stack="megatron", sharding="zero1")
    assert embedding_micro_batches(m, il) == 7


def test_deepspeed_keeps_each_stage_output_split_over_tp():
    s = _bloom()
    out = s.seq * s.micro_batch * BLOOM.hidden * 2
    assert stage_outputs_bytes(BLOOM, s, 0) == 12 * out / 4
    assert stage_outputs_bytes(BLOOM, s, 5) == 7 * out / 4
    assert stage_outputs_bytes(BLOOM, s, 11) == 0                          # the last stage returns the loss
    assert stage_outputs_bytes(BLOOM, dataclasses.replace(s, deepspeed_pipeline=False), 0) == 0   # Megatron frees them


def test_bloom_prequel_memory_errors_shrink():
    rows = [r for r in load_runs() if "tr11-176B-ml" in r["source"] and r.get("memory_gib")]
    assert len(rows) == 5
    for r in rows:
        assert r["embed_norm"] and r["dropout"]
        now = predict(r)
        without = predict({k: v for k, v in r.items() if k not in ("embed_norm", "dropout")})
        assert abs(now["memory_error"]) < abs(without["memory_error"])
        # first sight -46..-52%, -24..-28% with the BF16_Optimizer and partition terms, now within 17%
        assert -0.17 < now["memory_error"] < 0
        # the embedding norm is memory only; dropout also costs the unfused scores' traffic (throughput.py)
        no_norm = predict({k: v for k, v in r.items() if k != "embed_norm"})
        assert now["predicted"] == pytest.approx(no_norm["predicted"]) and now["predicted"] < without["predicted"]


def test_explain_names_the_planned_stage_and_lists_the_parameters_by_stage():
    from overdrive.plan import estimate, explain

    line = next(x for x in explain(estimate(BLOOM, _bloom())) if "pipeline peak" in x)
    assert "at the first stage" in line
    assert "parameters by stage (B, before tp): 15.9, " + ", ".join(["14.8"] * 10) + ", 15.9" in line


def test_interleaved_plans_compare_the_two_ends_only():
    """The gap memory.terms leaves open: under Megatron's interleaved schedule rank 1 can hold more blocks than rank 0
    (whose first chunk is a block short with the embedding in the split), but only the ends are compared; counted,
    no interleaving of Llama 3 405B's 8K run would fit, though it ran interleaved (its own schedule)."""
    from overdrive.plan import get_model
    from overdrive.plan.pipeline import pipeline_blocks_in_flight

    m = get_model("llama3-405b")
    s = TrainSetup(gpu=gpu_by_key("h100-sxm"), gpus_per_node=8, nodes=1024, tp=8, pp=16, vpp=4, seq=8192,
                   global_batch=2048, sharding="zero2", embedding_in_pipeline_split=True)
    assert pipeline_blocks_in_flight(m, s, 1) > pipeline_blocks_in_flight(m, s, 0)   # 77 x 2 > 31 x 1 + 48 x 2
    assert terms(m, s)["pp_rank"] in (0, s.pp - 1)
    one = dataclasses.replace(s, vpp=1)   # 1F1B: every stage compared; rank 1's extra block and states win there
    assert terms(m, one)["pp_rank"] == 1


def test_selective_recompute_of_unfused_attention_drops_the_scores():
    from overdrive.plan import get_model
    from overdrive.plan.memory import act_tensors

    m = get_model("llama3-8b")
    s = TrainSetup(gpu=A100, gpus_per_node=8, nodes=1, tp=8, seq=4096, micro_batch=1, global_batch=8,
                   precision="bf16", sharding="zero1", stack="megatron", attention="unfused", dropout=True,
                   checkpointing="none")
    kept = act_tensors(m, s)
    assert kept["scores"] == 5 * m.n_head * 4096
    assert act_tensors(m, dataclasses.replace(s, recompute_modules=("core_attn",)))["scores"] == 0


def test_dropout_costs_the_unfused_scores_traffic_and_is_refused_on_llama_block_code():
    from overdrive.plan import estimate, get_model
    from overdrive.plan.throughput import UNFUSED_DROPOUT_BYTES

    m = get_model("llama3-8b")
    s = TrainSetup(gpu=A100, gpus_per_node=8, nodes=1, tp=8, seq=4096, micro_batch=1, global_batch=8,
                   precision="bf16", sharding="zero1", stack="megatron", attention="unfused", checkpointing="none")
    on, off = estimate(m, dataclasses.replace(s, dropout=True)), estimate(m, s)
    hbm = A100.hbm_tbs * 1e12 * 0.8
    extra = m.n_layer * (m.n_head / 8) * 4096 * 4096 * UNFUSED_DROPOUT_BYTES / hbm
    assert on.times["attention"] - off.times["attention"] == pytest.approx(on.setup.grad_accum * extra, rel=1e-6)
    with pytest.raises(ValueError, match="--dropout with --block-code hf: .*drop --dropout"):
        TrainSetup(gpu=A100, gpus_per_node=1, seq=2048, precision="bf16", block_code="hf", compile=False,
                   dropout=True)


def test_a_bloom_config_turns_the_embedding_norm_on(tmp_path):
    import json

    from overdrive.plan import plan
    from overdrive.plan.specs import get_model

    cfg = {"model_type": "bloom", "n_layer": 4, "hidden_size": 1024, "n_head": 16, "vocab_size": 250880,
           "architectures": ["BloomForCausalLM"]}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    m = get_model(str(tmp_path))
    assert m.embed_norm
    r = plan(m, "a100-80", gpus_per_node=1, seq=2048, global_batch=4)
    assert all(c["embed_norm"] for c in r["candidates"])


def test_explain_itemises_what_the_embedding_keeps():
    from overdrive.plan import estimate, explain, get_model

    m = get_model("llama3-8b")
    s = TrainSetup(gpu=A100, gpus_per_node=8, nodes=1, seq=4096, micro_batch=1, global_batch=8, precision="bf16",
                   sharding="fsdp", checkpointing="none", embed_norm=True, dropout=True)
    line = next(x for x in explain(estimate(m, s)) if x.lstrip().startswith("embedding (first stage)"))
    assert f"1 micro-batch(es) in flight x {embedding_bytes(m, s) / 2**20:,.1f} MiB" in line
    assert "--embed-norm" in line and "--dropout" in line
    plain = dataclasses.replace(s, embed_norm=False, dropout=False)
    assert not any("embedding (first stage)" in x for x in explain(estimate(m, plain)))


def test_a_pipeline_engine_that_keeps_the_loss_plans_no_kept_outputs(run):
    """--stack pytorch with --pp: by default the last stage keeps the loss alone (today's torchtitan passes
    step(return_outputs=False); nanotron's and picotron's 1F1B engines never kept more); --pp-keep-outputs plans
    torch.distributed.pipelining's merged output, every micro-batch's fp32 logits, exactly. A nanotron run (1.34B,
    8 GPUs, DP4 PP2, micro-batch 4, 256 sequences of 4,096: 16 micro-batches per rank) measured 41.8 GB."""
    args = ("--layers", "16", "--hidden", "2048", "--heads", "32", "--ffn", "8192", "--vocab", "131072", "--tied",
            "--gpu", "h100-sxm", "--gpus", "8", "--seq", "4096", "--pp", "2", "--vpp", "1", "--micro-batch", "4",
            "--global-batch", "256", "--sharding", "zero1", "--checkpointing", "none", "--precision", "bf16",
            "--no-compile", "--fused-kernels", "--json")
    lean = json.loads(run(*args).stdout)["candidates"][0]
    kept = json.loads(run(*args, "--pp-keep-outputs").stdout)["candidates"][0]
    assert lean["fits"] and not kept["fits"]
    assert lean["pp_keep_outputs"] is False and kept["pp_keep_outputs"] is True
    grown = (kept["memory_gib"] - lean["memory_gib"]) * 2 ** 30
    outputs = 16 * 4 * 4096 * 131072 * 4                       # micro-batches x tokens x vocab x fp32
    assert grown == pytest.approx(outputs, rel=0.06)           # the fragmentation reserve grows with it, to 3 GiB
    plain = " ".join(run(*args[:-1], "--pp-keep-outputs").stdout.split())
    assert "- the loss alone on the last stage (today's torchtitan: no --pp-keep-outputs): " in plain
    text = " ".join(run(*args[:-1], "--pp-keep-outputs", "--explain").stdout.split())
    assert "--pp-keep-outputs: torch.distributed.pipelining keeps them" in text
    for other in (("--pp", "1"), ("--stack", "megatron")):
        flags = [a for a in args]
        i = flags.index(other[0]) if other[0] in flags else None
        if i is not None:
            flags[i + 1] = other[1]
        else:
            flags += list(other)
        if other[0] == "--pp":
            flags[flags.index("--vpp"):flags.index("--vpp") + 2] = []
        if other[0] == "--stack":
            flags = [f for f in flags if f not in ("--no-compile", "--fused-kernels")]
        d = json.loads(run(*flags, "--pp-keep-outputs").stdout)
        assert all(any(n.startswith("--pp-keep-outputs changes nothing here") for n in c["notes"])
                   for c in d["candidates"]), other
