"""The loss's memory peak comes first in the backward: its logits are freed before the last block's recompute buffer
and the backward's gradients exist (memory.terms, logits.logits_kept_bytes); the allocator's cache, with room to
spare, keeps both (Estimate.cached_gib, what max_memory_reserved reads)."""

import dataclasses
import json

import pytest
from plan_cli import run  # noqa: F401 (a fixture)

from overdrive.env import gpu_by_key
from overdrive.plan import TrainSetup, estimate, get_model
from overdrive.plan.logits import logits_bytes, logits_kept_bytes
from overdrive.plan.memory import GIB, RESERVED_SHARE, act_bytes_per_layer, backward_grad_bytes, terms
from overdrive.plan.validation import load_runs, predict

M = get_model("llama3-8b")
H200 = gpu_by_key("h200")


def _s(**kw) -> TrainSetup:
    base = dict(gpu=H200, gpus_per_node=8, seq=4096, micro_batch=8, global_batch=64, precision="bf16",
                sharding="zero2", checkpointing="full", compile=False)
    if kw.get("stack", "pytorch") == "pytorch":
        base["block_code"] = "hf"
    return TrainSetup(**(base | kw))


@pytest.mark.parametrize("loss, stack, precision, per_logit", [
    ("hf", "pytorch", "bf16", 4),           # its definition: the model output keeps the fp32 logits
    ("standard", "pytorch", "bf16", 0),     # torchtitan `del pred`, the HF Trainer's compute_loss, Colossal-AI's
    ("compiled", "pytorch", "bf16", 0),     # benchmark `del outputs`: the loop frees the output first
    ("compiled-fp32", "pytorch", "bf16", 0),   # torchtune `del logits`
    ("chunked", "pytorch", "bf16", 0),
    ("standard", "pytorch", "fp32", 0),
    ("fused", "pytorch", "bf16", 0),        # one chunk at a time: nothing whole to keep
    ("standard", "megatron", "bf16", 0),    # Megatron's model returns the loss alone
])
def test_what_the_loop_keeps_of_the_logits(loss, stack, precision, per_logit):
    kw = dict(loss=loss, stack=stack, precision=precision)
    if stack == "megatron":
        kw |= dict(compile=True, sharding="zero1")
    s = _s(**kw)
    assert logits_kept_bytes(M, s) == 4096 * 8 * M.vocab * per_logit
    assert logits_kept_bytes(M, s) <= logits_bytes(M, s)   # the loss's phase holds what is kept, and more


def test_the_peak_is_the_larger_phase_and_the_cache_holds_both():
    s = _s()
    t = terms(M, s)
    per_layer, grads = act_bytes_per_layer(M, s), backward_grad_bytes(M, s)
    stored = 32 * 4096 * 8 * M.hidden * 2
    loss, kept = logits_bytes(M, s), logits_kept_bytes(M, s)
    assert loss > per_layer + grads + kept   # 32K tokens x 128K vocabulary: the loss's phase is the peak
    assert t["activations"] == pytest.approx(stored) and t["logits"] == pytest.approx(loss)
    assert t["peak_phase"] == "loss" and kept == 0
    # the allocator's cache keeps the loss's freed blocks beside the backward's: the two added
    assert t["cached"] - t["allocated"] == pytest.approx(per_layer + grads)
    # a fused loss (one 1,024-token chunk): the backward's phase is the peak, with no logits kept beside it
    f = terms(M, _s(loss="fused"))
    assert logits_bytes(M, _s(loss="fused")) < per_layer + grads
    assert f["activations"] == pytest.approx(stored + per_layer + grads) and f["logits"] == 0
    assert f["allocated"] < t["allocated"] and f["peak_phase"] in ("blocks", "end")
    # --loss hf keeps its fp32 logits (4 of its 16 bytes) beside the blocks' backward
    h = _s(loss="hf", micro_batch=1, global_batch=8, checkpointing="none")
    th = terms(dataclasses.replace(M, vocab=1024), h)
    small = dataclasses.replace(M, vocab=1024)
    assert th["peak_phase"] == "blocks" and th["logits"] == pytest.approx(logits_kept_bytes(small, h))


def test_gradient_accumulation_keeps_the_gradients_beside_either_phase():
    one, accum = terms(M, _s(global_batch=64)), terms(M, _s(global_batch=128))
    assert accum["grads_at_peak"] == pytest.approx(accum["grads"]) and accum["allocated"] > one["allocated"]


def test_validation_compares_each_measure_with_its_own_figure():
    """max_memory_allocated against the peak; max_memory_reserved against the cache plus its share."""
    runs = {r["id"]: r for r in load_runs()}
    colossal = runs["ColossalAI llama-7b 8xH200 bf16 zero2 seq 4096"]   # max_memory_allocated
    p = predict(colossal)
    assert p["memory_measure"] == "allocated" and p["memory_predicted"] == pytest.approx(p["allocated_gib"])
    assert p["fits"] and -0.10 <= p["memory_error"] <= 0
    titan = next(r for r in runs.values() if r["id"] == "torchtitan 8B 8xH100 FSDP")   # torchtitan's max_reserved
    from overdrive.plan.validation import _setup, run_model
    e = estimate(run_model(titan), _setup(titan))
    assert predict(titan)["memory_predicted"] == pytest.approx(e.cached_gib * (1 + RESERVED_SHARE))
    assert e.cached_gib >= e.allocated_gib
    assert dataclasses.fields(e)   # an Estimate carries both figures
    assert abs(e.cached_gib * GIB - terms(run_model(titan), _setup(titan))["cached"]) < 1


def test_json_and_explain_say_both_figures(run):
    flags = ["--model", "llama3-8b", "--gpu", "h200", "--gpus", "8", "--seq", "4096", "--micro-batch", "8",
             "--precision", "bf16", "--sharding", "zero2", "--checkpointing", "full"]
    c = json.loads(run(*flags, "--json").stdout)["candidates"][0]
    assert c["cached_gib"] > c["allocated_gib"] > 0 and c["peak_phase"] == "loss"
    text = " ".join(run(*flags, "--explain").stdout.split())
    assert f"max_memory_allocated should read {c['allocated_gib']:.2f} GiB at the loss's backward" in text
    assert f"max_memory_reserved about {c['cached_gib'] * (1 + RESERVED_SHARE):.1f} GiB" in text
    assert "after the loss's peak (not in it)" in text
    # past the capacity the cache is not what the allocator keeps: it frees it and retries
    big = flags[:-5] + ["36", "--precision", "bf16", "--sharding", "zero2", "--checkpointing", "full", "--explain"]
    big[big.index("--model") + 1], big[big.index("--gpu") + 1] = "llama3-8b", "h200"
    text = " ".join(run(*big).stdout.split())
    assert "max_memory_reserved up to the capacity" in text or "max_memory_reserved about" in text


def test_the_cache_is_the_busiest_stages_and_zero_sliced_splits_its_phases():
    """Under a pipeline the stage with the largest peak need not hold the largest sum of phases; nanotron's ZeRO-1
    (--zero-sliced) keeps its fp32 accumulator beside the same two phases, not beside their sum."""
    m = dataclasses.replace(M, vocab=32000)
    s = TrainSetup(gpu=H200, gpus_per_node=8, seq=8192, micro_batch=1, global_batch=64, pp=8, vpp=1,
                   precision="bf16", sharding="none", checkpointing="full")
    t = terms(m, s)
    # the first stage peaks (most micro-batches in flight); a stage without the loss has one phase, so its sum is
    # its peak: a larger cache can only be the last stage's
    assert t["pp_rank"] == 0 and t["cached"] > t["allocated"]
    nano = get_model("llama3-8b")
    z = TrainSetup(gpu=gpu_by_key("h100-sxm"), gpus_per_node=8, nodes=8, seq=4096, micro_batch=2, global_batch=128,
                   precision="bf16", sharding="zero1", zero_sliced=True, grad_dtype="fp32", checkpointing="full",
                   compile=False, fused_kernels=True, attention="fa2")
    tz = terms(nano, z)
    # the step's two 16-bit copies of the weights peak, long after the loss's logits were freed (the old sum had them)
    assert tz["peak_phase"] == "end" and tz["allocated"] < tz["cached"]
