"""The second blind check of 2026-12-07 (six sources the project had never used, each run planned from the CLI and
the docs before anything was read back): its rows keep that plan, the doc states the figures from the data, and
each class of run the planner still misses is held to what it reads now and to its sign, so a change that moves
one shows here."""

import os
import sys

import pytest

from overdrive.plan.validation import evaluate, load_runs, summary

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "scripts"))
from plan_doc_blind2 import BLIND2_SOURCES, blind2_bullet, blind2_section, is_blind2  # noqa: E402

DOC = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "plan-validation.md")


@pytest.fixture(scope="module")
def rows():
    return [r for r in evaluate("validation") if is_blind2(r)]


def _ids(rows, *prefixes):
    return [r for r in rows if r["id"].startswith(prefixes)]


def test_rows_keep_their_first_plan_and_cite_their_source():
    runs = [r for r in load_runs() if r["source"].startswith(BLIND2_SOURCES)]
    assert len(runs) == 45
    for r in runs:
        assert r["role"] == "validation" and r["held_out"] == "unseen source", r["id"]
        assert r["first_planned"] > 0 and f"{r['first_planned']:g}" in r["note"], r["id"]
        assert " @ " in r["source"] and "second blind check" in r["note"]
    # the one row whose source contradicts itself (a ZeRO-2 70B above an H200's capacity) is not in the data
    assert not any(r["id"] == "ColossalAI llama2-70b 16xH200 bf16 zero2 seq 4096" for r in runs)


def test_the_doc_states_the_figures_from_the_data(rows):
    doc = open(DOC).read()
    val = evaluate("validation")
    assert blind2_bullet(val) in doc and blind2_section(val) in doc
    s = summary(rows)
    assert f"now median {100 * s['median_abs_error']:.1f}%" in doc


def test_short_sequences_wait_on_a_fixed_cost_per_micro_step(rows):
    """Qwen's rows up to 2,048 tokens (HF Trainer, PEFT, DeepSpeed ZeRO-3's module hooks) at a GPU host's time per
    op (a published B200 eager step's): the ZeRO-3 rows still planned fast (their hooks timed on one CPU rank,
    without the collectives' events and waits), the LoRA rows at 256 tokens now planned slow (counted as Hugging
    Face's Llama block, where Qwen's block with flash-attn's rotary dispatches fewer ops)."""
    short = [r for r in _ids(rows, "Qwen ") if int(r["id"].split()[-1]) <= 2048 and "multinode" not in r["id"]]
    assert len(short) == 9 and all(abs(r["error"]) <= 0.8 for r in short), short
    assert all(r["error"] > 0 for r in short if "zero3" in r["id"]), short
    lora256 = _ids(rows, "Qwen qwen-1.8b LoRA 1xA100-80 bf16 none seq 256",
                   "Qwen qwen-7b LoRA 1xA100-80 bf16 none seq 256")
    # the host-bound floor took the 256-token LoRA rows (the 1.8B's from +410% with no floor) from +88% and +66%
    # at a CPU host's 3.6 µs an op
    assert len(lora256) == 2 and all(-0.35 <= r["error"] < 0 for r in lora256), lora256


def test_long_sequences_of_the_same_table_are_within_a_quarter(rows):
    long_ = [r for r in _ids(rows, "Qwen ") if int(r["id"].split()[-1]) == 8192 and "multinode" not in r["id"]]
    assert len(long_) == 5 and all(abs(r["error"]) <= 0.25 for r in long_), long_


def test_what_it_found_missing_is_held_to_its_sign(rows):
    # Qwen's LoRA under ZeRO-2 on 2 nodes, published at half the one-GPU rate: planned as the one-GPU rate
    multinode = _ids(rows, "Qwen qwen-7b LoRA multinode")
    assert len(multinode) == 2 and all(0.7 <= r["error"] <= 1.3 for r in multinode), multinode
    # nanotron's ZeRO-1 at data parallel 128 across 64 nodes: +198% and +263% at first sight; --zero-sliced (its fp32
    # all-reduce after the backward and the weights' gather after the step, both exposed; its per-rank, per-tensor
    # host loops, at a GPU host's 8.6 µs an op, outlast them) takes them to +115% and +65%
    dp128 = _ids(rows, "nanotron 1.34B 512x", "nanotron 3.57B 512x")
    assert len(dp128) == 2 and all(0.5 <= r["error"] <= 1.3 for r in dp128), dp128
    assert all(r["zero_sliced"] for r in load_runs() if r["id"].startswith("nanotron") and " zero1 " in r["id"])
    # nanotron's 80B: TP16 across nodes, TP4·PP16, TP8·PP4 (published at half the MFU of TP4·PP16)
    big = _ids(rows, "nanotron 80.0B")
    assert len(big) == 3 and all(0.25 <= r["error"] <= 2.4 for r in big), big
    # Megatron-LLaMA's 13B on A100 with the FlashAttention 1 its code imports (+24% to +42% as FlashAttention-2),
    # its pre-TE eager RoPE/SwiGLU/layout copies, blocking TP collectives and ZeRO-2's reduce-scatter in every
    # micro-batch (+5% to +30%); left: a replicated head, no gradient-accumulation fusion
    mllama = _ids(rows, "Megatron-LLaMA")
    assert len(mllama) == 5 and all(0.0 <= r["error"] <= 0.32 for r in mllama), mllama
    # ArcticTraining's packed 136K sequences with --doc-len and --gpu-mem: -76% at first sight
    arctic = _ids(rows, "ArcticTraining")
    assert len(arctic) == 1 and -0.3 <= arctic[0]["error"] < 0, arctic


def test_the_rest_are_within_a_quarter(rows):
    held = {r["id"] for r in _ids(rows, "Qwen ", "nanotron 1.34B 512x", "nanotron 3.57B 512x", "nanotron 80.0B",
                                   "nanotron 8.86B 512x", "Megatron-LLaMA", "ArcticTraining")}
    rest = [r for r in rows if r["id"] not in held]
    # Colossal-AI 3, nanotron at 4 to 32 data-parallel ranks (12), picotron 2
    assert len(rest) == 17 and max(abs(r["error"]) for r in rest) <= 0.25, summary(rest)


def test_nanotron_ddp_at_128_ranks_with_ddps_own_buckets(rows):
    """nanotron's DDP row at 128 data-parallel ranks over 64 nodes read +14% while DDP's buckets were counted as
    gradient bytes / 25 MB (338 calls, 0.24 s of NCCL latency); PyTorch's Reducer closes buckets on whole tensors
    (162 with a Llama's q, k and v apart; nanotron's fused qkv_proj and gate_up_proj would make 98) and the
    all-reduce hides under the backward alone: +24%. Published, the step is its compute plus all of the
    all-reduce (0.62 s: 0.26 s of compute, 0.38 s planned on the wire), which no term explains."""
    r = _ids(rows, "nanotron 8.86B 512x")[0]
    assert 0.15 <= r["error"] <= 0.4


def test_memory_where_the_source_says_what_it_measured(rows):
    mem = [r for r in rows if "memory_error" in r]
    assert len(mem) == 23
    # nanotron's pipeline rows publish rank 0 (the first stage) and are not compared
    assert not any(r["id"].startswith("nanotron") and " pp1 " not in r["id"] for r in mem)
    # every completed run plans to fit: Colossal-AI's 7B ZeRO-2 at micro-batch 36 planned +21% (not fitting) while
    # the loss's 52.7 GiB of fp32 logits were counted beside the recompute buffer that comes after them
    assert [r["id"] for r in rows if not r["fits"]] == []
    assert -0.10 <= _ids(rows, "ColossalAI llama-7b 8xH200")[0]["memory_error"] <= 0
