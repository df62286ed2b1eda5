"""Packed documents (--doc-len): each query attends within its own document, so document-masked attention does
s·d work per sequence instead of s² and its kernel runs at the rate of d-token launches (plan/throughput.py)."""

import json
import random

import pytest

from overdrive.env import gpu_by_key
from overdrive.plan import ModelSpec, TrainSetup
from overdrive.plan.attention import attention_share
from overdrive.plan.estimate import estimate, model_flops_per_token
from overdrive.plan.validation import plan_flags

from plan_cli import refused, run  # noqa: F401 (a fixture)

H100 = gpu_by_key("h100-sxm")
M = ModelSpec(name="8b-like", n_layer=32, hidden=4096, n_head=32, n_kv_head=8, ffn=14336, vocab=128256, tied=False)


def _setup(**kw) -> TrainSetup:
    base = dict(gpu=H100, gpus_per_node=8, seq=32768, micro_batch=1, global_batch=8, precision="bf16",
                sharding="fsdp", checkpointing="full")
    return TrainSetup(**(base | kw))


def test_attention_work_follows_the_document_not_the_sequence():
    rng = random.Random(11)
    for _ in range(12):
        seq = rng.choice([4096, 16384, 65536])
        d = rng.choice([256, 1024, 2048, seq // 2])
        cp = rng.choice([1, 2])
        whole, packed = (estimate(M, _setup(seq=seq, cp=cp, doc_len=x)) for x in (0, d))
        # FLOPs scale by d/s; the kernel's rate by its share at d tokens against s/cp
        expect = d / seq * attention_share(whole.setup, seq / cp) / attention_share(packed.setup, min(seq / cp, d))
        assert packed.times["attention"] == pytest.approx(whole.times["attention"] * expect, rel=1e-9)
        assert packed.times["gemm"] == pytest.approx(whole.times["gemm"], rel=1e-12)   # the linears see every token
        assert packed.memory_gib == pytest.approx(whole.memory_gib, rel=1e-12)         # flash memory is linear in s
        assert packed.tokens_per_s_per_gpu > whole.tokens_per_s_per_gpu


def test_a_document_as_long_as_the_sequence_is_no_packing():
    a, b = estimate(M, _setup(doc_len=0)), estimate(M, _setup(doc_len=32768))
    assert a.step_s == b.step_s and a.mfu == b.mfu


def test_mfu_counts_the_attention_the_documents_do():
    s = _setup(doc_len=2048)
    assert model_flops_per_token(M, s) == M.flops_per_token(2048) < M.flops_per_token(32768)


def test_unfused_attention_computes_the_masked_scores_anyway_and_says_so():
    whole, packed = (estimate(M, _setup(seq=4096, attention="unfused", doc_len=x)) for x in (0, 512))
    assert packed.times["attention"] == whole.times["attention"]
    assert any(n.startswith("--doc-len changes no time here: unfused attention") and "MFU counts only" in n
               for n in packed.notes)
    assert packed.mfu == pytest.approx(whole.mfu * M.flops_per_token(512) / M.flops_per_token(4096))
    assert not any("--doc-len" in n for n in estimate(M, _setup(seq=4096, doc_len=512)).notes)


@pytest.mark.parametrize("bad", [-1, 1.5, True])
def test_a_document_length_that_is_not_a_count_is_refused(bad):
    with pytest.raises(ValueError, match="--doc-len must be a whole number of tokens"):
        _setup(doc_len=bad)


def test_a_document_longer_than_the_sequence_is_cut_at_it():
    """What-would-fit suggestions shorten the sequence under the user's --doc-len: the document is cut at it."""
    assert _setup(seq=4096, doc_len=8192).attn_len == 4096
    assert estimate(M, _setup(seq=4096, doc_len=8192)).step_s == estimate(M, _setup(seq=4096)).step_s


def test_the_cli_plans_packed_documents_and_reports_them(run):
    flags = ["--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--seq", "65536", "--micro-batch", "1",
             "--precision", "bf16", "--sharding", "fsdp", "--checkpointing", "full", "--json"]
    whole = json.loads(run(*flags).stdout)["candidates"][0]
    cp = run(*flags, "--doc-len", "2048")
    assert cp.returncode == 0, cp.stderr
    packed = json.loads(cp.stdout)["candidates"][0]
    assert packed["doc_len"] == 2048 and whole["doc_len"] == 0
    assert packed["tokens_per_s_per_gpu"] > 1.5 * whole["tokens_per_s_per_gpu"]   # attention is most of 64K
    text = " ".join(run(*flags[:-1], "--doc-len", "2048", "--explain").stdout.split())
    assert "at 2048 tokens" in text and "(packed documents: s·d, --doc-len d)" in text
    assert "seq 65536 of 2048-token documents" in text
    table = " ".join(run(*flags[:-1], "--doc-len", "2048").stdout.split())
    assert "seq 65536 of 2048-token documents" in table
    refused(run(*flags, "--doc-len", "-5"), "--doc-len -5: give the documents' tokens")


def test_a_suggested_shorter_sequence_can_be_run_with_the_same_doc_len(run, tmp_path):
    """'Nothing fits' suggests a shorter sequence; the user re-runs it with their --doc-len, now longer than the
    sequence: planned with the documents cut at it, and said so (not refused)."""
    flags = ["--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "2", "--doc-len", "131072", "--json"]
    r = json.loads(run(*flags, "--seq", "262144").stdout)
    assert r["top"] is None and any("shorter sequence" in x for x in r["suggestions"])
    cp = run(*flags, "--seq", "8192")
    assert cp.returncode == 0, cp.stderr
    c = json.loads(cp.stdout)["candidates"][0]
    assert any("--doc-len 131072 is longer than the sequence: documents are cut at 8192" in n for n in c["notes"])
    plain = json.loads(run(*flags[:-3], "--json", "--seq", "8192").stdout)["candidates"][0]
    assert c["tokens_per_s_per_gpu"] == plain["tokens_per_s_per_gpu"]


def test_a_refused_plan_leaves_no_out_folder(run, tmp_path):
    out = tmp_path / "a" / "b"
    refused(run("--seq", "4096", "--tp", "3", "--out", str(out)), "tp 3 .* does not divide")
    refused(run("--seq", "4096", "--doc-len", "-1", "--out", str(out)), "--doc-len -1")
    assert not (tmp_path / "a").exists()


def test_a_published_run_with_packed_documents_is_expressed_with_its_flag():
    r = {"model": "llama3-8b", "gpu": "h100-sxm", "gpus": 8, "seq": 8192, "doc_len": 1024, "precision": "bf16",
         "sharding": "fsdp", "checkpointing": "full"}
    assert "--doc-len 1024" in plan_flags(r)
    assert "--doc-len" not in plan_flags({k: v for k, v in r.items() if k != "doc_len"})
