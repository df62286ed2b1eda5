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
    ("standard", "pytorch", "bf16", 2),     # the model output's 16-bit logits
    ("compiled", "pytorch", "bf16", 2),
    ("hf", "pytorch", "bf16", 4),           # Hugging Face before 4.46 returned .float() logits
    ("compiled-fp32", "pytorch", "bf16", 4),
    ("standard", "pytorch", "fp32", 4),
    ("fused", "pytorch", "bf16", 0),        # one chunk at a time: nothing whole to keep
    ("standard", "megatron", "bf16", 0),    # Megatron's model returns the loss alone
])
def test_what_the_loop_keeps_of_the_logits(loss, stack, precision, per_logit):
    kw = dict(loss=loss, stack=stack, precision=precision)
    if stack == "megatron":
        kw |= dict(compile=True, sharding="zero1")
    s = _s(**kw)
    assert logits_kept_bytes(M, s) == 4096 * 8 * M.vocab * per_logit
    assert logits_kept_bytes(M, s) <= logits_bytes(M, s)


def test_the_peak_is_the_larger_phase_and_the_cache_holds_both():
    s = _s()
    t = terms(M, s)
    per_layer, grads = act_bytes_per_layer(M, s), backward_grad_bytes(M, s)
    stored = 32 * 4096 * 8 * M.hidden * 2
    loss, kept = logits_bytes(M, s), logits_kept_bytes(M, s)
    assert loss > per_layer + grads + kept   # 32K tokens x 128K vocabulary: the loss's phase is the peak
    assert t["activations"] == pytest.approx(stored) and t["logits"] == pytest.approx(loss)
    # the allocator's cache keeps the loss's freed blocks beside the backward's: the two added
    assert t["cached"] - t["allocated"] == pytest.approx(per_layer + grads)
    # a fused loss (one 1,024-token chunk): the backward's phase is the peak, with no logits kept beside it
    f = terms(M, _s(loss="fused"))
    assert logits_bytes(M, _s(loss="fused")) < per_layer + grads
    assert f["activations"] == pytest.approx(stored + per_layer + grads) and f["logits"] == 0
    assert f["allocated"] < t["allocated"]


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
    assert c["cached_gib"] > c["allocated_gib"] > 0
    text = " ".join(run(*flags, "--explain").stdout.split())
    assert f"max_memory_reserved about {c['cached_gib'] * (1 + RESERVED_SHARE):.1f} GiB" in text
