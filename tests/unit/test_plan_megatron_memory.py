"""Memory terms for what Megatron-Core + Transformer Engine recipes run: FP8 copies of GEMM inputs, selective
recompute of named modules, full recompute of N blocks per pipeline chunk, activation offload of N blocks,
bf16 gradient buffers, the in-place cross-entropy and the interleaved pipeline's warm-up, each against a
hand count."""

import dataclasses

import pytest

from overdrive.env import gpu_by_key
from overdrive.plan import TrainSetup, estimate, get_model
from overdrive.plan.memory import act_tensors, backward_grad_bytes, pipeline_blocks_in_flight, recomputed_blocks, terms
from overdrive.plan.logits import logits_bytes, logits_kept_bytes
from overdrive.plan.memory import act_bytes_per_layer as per_layer

GB300 = gpu_by_key("gb300")
M70 = get_model("llama3-70b")          # h 8192, kv 1024, F 28672, 80 blocks
H, KV, F = 8192, 1024, 28672


def _s(**kw):
    base = dict(gpu=GB300, gpus_per_node=64, seq=8192, precision="fp8", sharding="zero1")
    return TrainSetup(**{**base, **kw})


def test_fp8_storage_keeps_one_byte_gemm_inputs_and_the_16bit_attention_output():
    bf16 = sum(act_tensors(M70, _s(precision="bf16")).values())
    assert bf16 == 2 * (5 * H + (H + 2 * KV) + 2 * F + F)  # the 16-bit count (one storage per tensor)
    fp8 = act_tensors(M70, _s(fp8_activations=True))
    # norm inputs, q/k/v, flash's output and the SwiGLU input stay 16-bit; qkv/proj/fc1/fc2 inputs are FP8 copies
    assert sum(fp8.values()) == 2 * (3 * H + (H + 2 * KV) + 2 * F) + (3 * H + F)
    assert fp8["attn_out"] == 2 * H and fp8["proj_in"] == H
    # without --fp8-activations a low-precision run keeps 16-bit inputs, as torchao's float8 does
    assert sum(act_tensors(M70, _s()).values()) == bf16


@pytest.mark.parametrize("mods, dropped", [
    (("mlp",), H + 2 * F + F),              # mlp input, fc outputs (gated: 2F), activation output
    (("layernorm",), 2 * H),                # the two norm outputs
    (("core_attn",), 0),                    # flash attention: q, k, v are the kept inputs; the output is shared
    (("core_attn", "mlp", "layernorm"), 2 * H + 3 * F),   # the mlp input is one of the norm outputs
])
def test_selective_recompute_drops_what_each_module_keeps(mods, dropped):
    keep = sum(act_tensors(M70, _s(precision="bf16")).values())
    assert keep - sum(act_tensors(M70, _s(precision="bf16", recompute_modules=mods)).values()) == 2 * dropped
    # with FP8 storage core_attn drops flash's own 16-bit output (the projection keeps its FP8 copy), and
    # layernorm drops nothing: the GEMMs keep FP8 copies of the norm outputs, not the outputs themselves
    fp8 = act_tensors(M70, _s(fp8_activations=True, recompute_modules=("core_attn", "layernorm")))
    assert fp8["attn_out"] == 0 and fp8["proj_in"] == H and fp8["qkv_in"] == fp8["mlp_in"] == H


def test_selective_recompute_is_named_and_costs_time():
    with pytest.raises(ValueError, match="--recompute-modules 'moe_act' is not one of"):
        _s(recompute_modules=("moe_act",))
    assert _s(recompute_modules="mlp, core_attn").recompute_modules == ("mlp", "core_attn")
    base = estimate(M70, _s(gpus_per_node=8, pp=8, global_batch=64))
    mlp = estimate(M70, _s(gpus_per_node=8, pp=8, global_batch=64, recompute_modules=("mlp",)))
    assert mlp.times["recompute"] > 0 and mlp.step_s > base.step_s and mlp.memory_gib < base.memory_gib


def test_block_recompute_keeps_only_inputs_of_the_first_n_blocks_of_each_chunk():
    s = _s(gpus_per_node=8, sharding="fsdp", recompute_layers=30)
    one, block_in = per_layer(M70, s), 8192 * H * 2
    grads = backward_grad_bytes(M70, s)   # the backward's own gradients, beside any checkpointing
    assert grads == 8192 * (H + F) * 2
    # at the peak: the stored blocks + the larger of the loss's logits and what the backward adds after it (the
    # recompute buffer, its gradients, the 16-bit logits the output keeps)
    t = terms(M70, s)
    stored = 30 * block_in + 50 * one
    assert t["activations"] + t["logits"] == stored + max(logits_bytes(M70, s), one + grads + logits_kept_bytes(M70, s))
    assert t["activations"] == stored and t["logits"] == logits_bytes(M70, s)   # 8K x 128K logits: the loss's
    # pipeline: 80 blocks over pp 4 x vpp 5 chunks of 4; N=1 per chunk -> 5 of the stage's 20 blocks
    # on Megatron's stack (whose flag this is) the last stage keeps no outputs, so the first stage is the peak
    p = _s(pp=4, vpp=5, global_batch=256, recompute_layers=1, stack="megatron")
    assert recomputed_blocks(M70, p) == 5
    flat = _s(pp=4, vpp=5, global_batch=256, stack="megatron")
    in_flight = pipeline_blocks_in_flight(M70, p) / 20
    # the stored blocks scale with the micro-batches in flight; the one-block recompute buffer does not
    assert terms(M70, p)["activations"] == pytest.approx((5 * block_in + 15 * per_layer(M70, p)) * in_flight
                                                         + per_layer(M70, p) + backward_grad_bytes(M70, p))
    # time: the forward again for 5 of 20 blocks, a quarter of what full checkpointing recomputes
    full = estimate(M70, dataclasses.replace(flat, checkpointing="full")).times["recompute"]
    assert estimate(M70, p).times["recompute"] == pytest.approx(0.25 * full)
    assert estimate(M70, flat).times["recompute"] == 0
    with pytest.raises(ValueError, match="both choose what to recompute"):
        _s(recompute_layers=2, checkpointing="full")


def test_activation_offload_keeps_the_other_blocks_and_one_in_flight():
    s = _s(sharding="fsdp", micro_batch=2, global_batch=256, offload_activations=20)
    t = terms(M70, s)
    kept = logits_kept_bytes(M70, s)
    assert t["activations"] + t["logits"] == 61 * per_layer(M70, s) + max(logits_bytes(M70, s),
                                                                          backward_grad_bytes(M70, s) + kept)
    e = estimate(M70, s)
    # NVLink-C2C (450 GB/s a direction) carries 20 blocks out and back well under one micro-batch's compute
    assert e.times["offload_exposed"] == 0
    pcie = estimate(M70, dataclasses.replace(s, gpu=gpu_by_key("b200"), gpus_per_node=8, nodes=8))
    assert pcie.times["offload_exposed"] > 0 and any("activation offload" in n for n in pcie.notes)
    with pytest.raises(ValueError, match="needs --pp 1"):
        _s(pp=4, offload_activations=2)
    with pytest.raises(ValueError, match="at most the model's 80 blocks"):
        estimate(M70, dataclasses.replace(s, offload_activations=80))


def test_bf16_gradient_buffer_and_inplace_cross_entropy():
    P = M70.n_params()
    z1 = terms(M70, _s(grad_dtype="bf16"))
    assert z1["grads"] == 2 * P  # Megatron's distributed optimizer keeps the whole (bf16) grad buffer
    fsdp = terms(M70, _s(sharding="fsdp", grad_dtype="bf16"))
    assert fsdp["grads"] == pytest.approx(2 * P / 64)
    logits = {loss: terms(M70, _s(loss=loss))["logits"] for loss in ("compiled", "inplace")}
    assert logits["inplace"] == 8192 * M70.vocab * 2 == logits["compiled"] / 2
    with pytest.raises(ValueError, match="--grad-dtype 'fp16'"):
        _s(grad_dtype="fp16")


def test_interleaved_warmup_matches_korthikanti_and_counts_the_embedding_slot():
    # even chunks: L/pp x (pp + (pp-1)/v) block-micro-batches on the first stage
    s = _s(pp=4, vpp=5, global_batch=256)
    assert pipeline_blocks_in_flight(M70, s) == pytest.approx(80 / 4 * (4 + 3 / 5))
    assert pipeline_blocks_in_flight(M70, _s(pp=4, global_batch=256)) == 80  # 1F1B: pp micro-batches x 20
    # 405B (126 blocks) over pp 16 x vpp 4 with the embedding and loss in the split: 2 slots per chunk, the
    # first chunk holds 1 block; warm-up (16-1)*2 + 3*16 = 78 forwards + 1: chunk 0 gets 16 + 15, the rest 48
    m405 = get_model("llama3-405b")
    e = _s(gpus_per_node=64, nodes=4, tp=4, pp=16, vpp=4, global_batch=1536, embedding_in_pipeline_split=True)
    assert pipeline_blocks_in_flight(m405, e) == 31 * 1 + 48 * 2


def test_the_last_stage_keeps_every_micro_batch_output_only_with_pp_keep_outputs():
    from overdrive.plan.pipeline import pipeline_outputs_bytes

    m405 = get_model("llama3-405b")
    h100 = gpu_by_key("h100-96gb")
    # torchtitan's 405B 1F1B run (2024-12, before step(return_outputs=False)): 512 GPUs, TP8 PP8, 8 data-parallel
    # ranks, 256 sequences of 8,192: 32 each
    s = TrainSetup(gpu=h100, gpus_per_node=8, nodes=64, seq=8192, global_batch=256, precision="fp8", tp=8, pp=8,
                   checkpointing="full", sharding="fsdp", pp_keep_outputs=True)
    assert s.grad_accum == 32
    assert pipeline_outputs_bytes(m405, s) == 32 * 8192 * m405.vocab / 8 * 4      # fp32 logits, vocab-sharded
    assert pipeline_outputs_bytes(m405, dataclasses.replace(s, stack="megatron")) == 0   # Megatron keeps the loss
    assert pipeline_outputs_bytes(m405, dataclasses.replace(s, pp=1, global_batch=256)) == 0
    # the default: today's torchtitan (return_outputs=False), nanotron's and picotron's engines keep the loss alone
    loss_only = dataclasses.replace(s, pp_keep_outputs=False)
    assert pipeline_outputs_bytes(m405, loss_only) == 0
    assert terms(m405, s)["pp_last"] - terms(m405, loss_only)["pp_last"] == pytest.approx(pipeline_outputs_bytes(m405, s))
    # 1F1B: the first stage holds pp micro-batches in flight, the last one; 126 blocks over 8 stages split as
    # torchtitan splits them, the first six 16 blocks, the last two 15
    assert pipeline_blocks_in_flight(m405, s) == 8 * 16
    assert pipeline_blocks_in_flight(m405, s, rank=7) == 1 * 15
    t = terms(m405, s)
    # the last stage is this run's peak: its one micro-batch, the loss and the 32 kept outputs
    assert t["logits"] > pipeline_outputs_bytes(m405, s)
    first = terms(m405, dataclasses.replace(s, stack="megatron"))
    assert first["logits"] == 0 and first["activations"] > t["activations"]


def test_explain_names_the_pipeline_end_that_sets_the_peak():
    from overdrive.plan import explain

    m405 = get_model("llama3-405b")
    s = TrainSetup(gpu=gpu_by_key("h100-96gb"), gpus_per_node=8, nodes=64, seq=8192, global_batch=256,
                   precision="fp8", tp=8, pp=8, checkpointing="full", sharding="fsdp", pp_keep_outputs=True)
    line = next(x for x in explain(estimate(m405, s)) if "pipeline peak" in x)
    assert "at the last stage" in line and "--pp-keep-outputs: torch.distributed.pipelining" in line
    assert "15.66 GiB" in line
    lean = next(x for x in explain(estimate(m405, dataclasses.replace(s, pp_keep_outputs=False))) if "pipeline peak" in x)
    assert "fp32 output" not in lean
    meg = next(x for x in explain(estimate(m405, dataclasses.replace(s, stack="megatron", sharding="zero1")))
               if "pipeline peak" in x)
    assert "at the first stage" in meg and "torch.distributed.pipelining" not in meg
    assert not [x for x in explain(estimate(m405, dataclasses.replace(s, pp=1, nodes=64))) if "pipeline peak" in x]
