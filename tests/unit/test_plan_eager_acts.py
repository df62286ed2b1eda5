"""The planner's block-code activation term equals what autograd saves, measured with saved-tensor hooks."""

import random

import pytest
import torch

from overdrive.plan.memory import act_tensors, eager_act_tensors
from overdrive.plan.saved_acts import TorchtuneBlock, measure_per_token, rope_cache, saved_bytes
from overdrive.plan.setup import TrainSetup
from overdrive.env.catalog import gpu_by_key
from overdrive.plan.specs import ModelSpec


def _setup(block, precision="bf16", compile_=False):
    return TrainSetup(gpu=gpu_by_key("a100-80"), gpus_per_node=1, nodes=1, seq=16, global_batch=2, micro_batch=2,
                      precision=precision, sharding="none", checkpointing="none", compile=compile_, block_code=block)


def _shapes(seed, n=3):
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        kv = rng.choice([1, 2, 3])
        heads = kv * rng.choice([1, 2, 4])
        hd = rng.choice([8, 16])
        hidden = heads * rng.choice([hd, 2 * hd, 12])   # a multiple of the heads (transformers asks it)
        ffn = rng.choice([40, 96, 136])
        out.append((hidden, ffn, heads, kv, hd))
    return out


@pytest.mark.parametrize("kind", ["torchtune", pytest.param("hf", marks=pytest.mark.slow)])  # hf: ~3 s to import
@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_formula_equals_saved_tensor_measurement_on_random_shapes(kind, precision):
    if kind == "hf":
        pytest.importorskip("transformers")
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    for hidden, ffn, heads, kv, hd in _shapes(hash((kind, precision)) % 1000):
        m = ModelSpec(name="t", n_layer=1, hidden=hidden, n_head=heads, n_kv_head=kv, ffn=ffn, vocab=32,
                      attn_head_dim=hd if hd * heads != hidden else 0)
        want = sum(eager_act_tensors(m, _setup(kind, precision)).values())
        got = measure_per_token(kind, hidden, ffn, heads, kv, hd, batch=2, seq=8, dtype=dtype)
        assert got == want, (kind, precision, hidden, ffn, heads, kv, hd, got, want)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["torchtune", "hf"])
def test_compiled_block_formula_equals_the_partitioner_s_saved_tensors(kind):
    if kind == "hf":
        pytest.importorskip("transformers")
    for hidden, ffn, heads, kv, hd in _shapes(7 if kind == "hf" else 11, n=2):
        m = ModelSpec(name="t", n_layer=1, hidden=hidden, n_head=heads, n_kv_head=kv, ffn=ffn, vocab=32,
                      attn_head_dim=hd if hd * heads != hidden else 0)
        want = sum(act_tensors(m, _setup(kind, compile_=True)).values())
        got = measure_per_token(kind, hidden, ffn, heads, kv, hd, batch=2, seq=8, compiled=True)
        assert got == want, (kind, hidden, ffn, heads, kv, hd, got, want)


def test_block_code_keeps_more_than_fused_and_copies_kv_only_for_gqa():
    m = ModelSpec(name="t", n_layer=1, hidden=64, n_head=4, n_kv_head=2, ffn=160, vocab=32)
    tt, hf = (sum(eager_act_tensors(m, _setup(k)).values()) for k in ("torchtune", "hf"))
    fused = sum(act_tensors(m, _setup("", compile_=True)).values())
    compiled = sum(act_tensors(m, _setup("torchtune", compile_=True)).values())
    assert fused < compiled < tt
    assert tt - hf == 2 * 2 * (64 - 32)        # k and v at the query width instead of the kv width
    assert hf > fused
    mqa = ModelSpec(name="t", n_layer=1, hidden=64, n_head=4, n_kv_head=1, ffn=160, vocab=32)
    # one kv head: expand(...).flatten(1, 2) is a view, nothing copied
    assert eager_act_tensors(mqa, _setup("torchtune")) == eager_act_tensors(mqa, _setup("hf"))


def test_the_measurement_sees_a_math_kernel_s_squared_term():
    """The math SDPA kernel saves per-score tensors: bytes per token grow with the sequence (flash's do not)."""
    a = measure_per_token("torchtune", 64, 160, 4, 2, batch=1, seq=8, sdpa="math")
    b = measure_per_token("torchtune", 64, 160, 4, 2, batch=1, seq=16, sdpa="math")
    f8 = measure_per_token("torchtune", 64, 160, 4, 2, batch=1, seq=8)
    f16 = measure_per_token("torchtune", 64, 160, 4, 2, batch=1, seq=16)
    assert b > a and f8 == f16


def test_saved_bytes_counts_a_shared_storage_once():
    x = torch.randn(4, 8, requires_grad=True)
    w = torch.randn(8, 8, requires_grad=True)
    total, _ = saved_bytes(lambda: (x @ w).sin() + (x @ w).cos(), exclude=[w])
    # x saved by both matmuls (once), each matmul output saved by sin / cos (two storages)
    assert total == 4 * 8 * 4 * 3


def test_block_code_needs_the_pytorch_stack():
    with pytest.raises(ValueError, match="--stack pytorch"):
        TrainSetup(gpu=gpu_by_key("h100-sxm"), gpus_per_node=1, nodes=1, seq=16, global_batch=2, stack="megatron",
                   block_code="torchtune")
    with pytest.raises(ValueError, match="torchtune, hf"):
        _setup("eager")


def _tt(**kw):
    base = dict(gpu=gpu_by_key("a100-80"), gpus_per_node=1, nodes=1, seq=4096, global_batch=2, micro_batch=2,
                precision="bf16", sharding="none", checkpointing="none", block_code="torchtune")
    return TrainSetup(**{**base, **kw})


def test_torchtune_losses_count_what_they_keep_per_logit():
    from overdrive.plan.memory import terms
    from overdrive.plan.specs import get_model
    m = get_model("llama3-3b")
    n = 4096 * 2 * m.vocab
    # compiled loss on the model's fp32 logits: the saved fp32 input + the fp32 gradient
    assert terms(m, _tt(loss="compiled-fp32"))["logits"] == 8 * n
    assert terms(m, _tt(loss="compiled"))["logits"] == 4 * n
    # torchtune's chunked loss, compiled: every chunk's bf16 logits saved, one chunk's bf16 gradient
    assert terms(m, _tt(loss="chunked"))["logits"] == n * (2 + 2 / 8)
    # eager: each chunk's log_softmax keeps an fp32 copy too, and one chunk's backward holds 4 + 4 + 2 bytes
    assert terms(m, _tt(loss="chunked", compile=False))["logits"] == n * (2 + 4 + 10 / 8)


def test_offload_of_checkpointed_blocks_moves_only_their_inputs():
    from overdrive.plan.throughput import compute_times
    from overdrive.plan.specs import get_model
    m = get_model("llama3-3b")
    full = compute_times(m, _tt(checkpointing="full", offload_activations=27))["offload"]
    none = compute_times(m, _tt(checkpointing="none", offload_activations=27))["offload"]
    tokens = 4096 * 2
    assert full == pytest.approx(2 * 27 * tokens * m.hidden * 2 / (25 * 1e9))
    assert none > 5 * full


def test_explain_prints_the_eager_block_s_tensors(tmp_path):
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-m", "overdrive", "plan", "--model", "llama3-3b", "--gpu", "a100-80",
                          "--gpus", "1", "--seq", "4096", "--global-batch", "2", "--micro-batch", "2",
                          "--precision", "bf16", "--sharding", "none", "--checkpointing", "none", "--no-compile",
                          "--block-code", "torchtune", "--explain"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "eager torchtune block" in out.stdout and "139,368 B" in out.stdout.replace("\n", "")
    bad = subprocess.run([sys.executable, "-m", "overdrive", "plan", "--model", "llama3-3b", "--gpu", "a100-80",
                          "--stack", "megatron", "--block-code", "torchtune"], capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode == 2 and "--stack pytorch" in bad.stderr
