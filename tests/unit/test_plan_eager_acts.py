"""The planner's eager-block activation term equals what autograd saves, measured with saved-tensor hooks."""

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
                      precision=precision, sharding="none", checkpointing="none", compile=compile_, eager_block=block)


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


@pytest.mark.parametrize("kind", ["torchtune", "hf"])
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


def test_eager_block_keeps_more_than_fused_and_copies_kv_only_for_gqa():
    m = ModelSpec(name="t", n_layer=1, hidden=64, n_head=4, n_kv_head=2, ffn=160, vocab=32)
    tt, hf = (sum(eager_act_tensors(m, _setup(k)).values()) for k in ("torchtune", "hf"))
    fused = sum(act_tensors(m, _setup("", compile_=True)).values())
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


def test_eager_block_needs_no_compile_on_the_pytorch_stack():
    with pytest.raises(ValueError, match="--no-compile"):
        _setup("torchtune", compile_=True)
    with pytest.raises(ValueError, match="torchtune, hf"):
        _setup("eager")
