"""--zero-broadcast: InternLM's Hybrid ZeRO-1 (gradients all-reduced, the updated weights sent back by one
broadcast per owning rank), NCCL's broadcast cost, the owner count, and the flag as a user meets it."""

import json

import pytest

from overdrive.env.catalog import gpu_by_key
from overdrive.plan.collectives import broadcast_s
from overdrive.plan.comm import comm_times, zero_owners
from overdrive.plan.estimate import estimate
from overdrive.plan.setup import TrainSetup
from overdrive.plan.specs import ModelSpec
from plan_cli import invoke

INTERNLM_7B = ModelSpec(name="internlm-7b", n_layer=32, hidden=4096, n_head=32, n_kv_head=32, ffn=11008,
                        vocab=103168, tied=False)


def _setup(nodes: int, tp: int = 1, **kw) -> TrainSetup:
    gpus = 8 * nodes
    base = dict(gpu=gpu_by_key("a100-80"), nodes=nodes, seq=2048, micro_batch=2 * tp, tp=tp,
                global_batch=gpus // tp * 2 * tp * 4, precision="bf16", sharding="zero1", compile=False,
                loss="inplace", grad_dtype="bf16", inter_gbs=6.25, sequence_parallel=False, zero_broadcast=True)
    return TrainSetup(**{**base, **kw})


def _partition_param_list(sizes: list[int], zero_world_size: int) -> int:
    """InternLM's HybridZeroOptimizer._partition_param_list (hybrid_zero_optim.py @ 20fe5ac2), line for line: the
    ranks it gives any parameter."""
    params_per_rank = [[] for _ in range(zero_world_size)]
    numel_per_rank = [0 for _ in range(zero_world_size)]
    for numel in sorted(sizes, reverse=True):
        rank_to_go = numel_per_rank.index(min(numel_per_rank))
        params_per_rank[rank_to_go].append(numel)
        numel_per_rank[rank_to_go] += numel
    return sum(1 for p in params_per_rank if p)


@pytest.mark.parametrize("n, tp, pp", [(8, 1, 1), (64, 1, 1), (128, 1, 1), (226, 1, 1), (512, 2, 1), (1024, 1, 1),
                                       (4096, 1, 1), (64, 1, 2)])
def test_owners_are_internlms_greedy_partition(n, tp, pp):
    s = _setup(max(1, n * tp * pp // 8), tp=tp, pp=pp, global_batch=None)
    from overdrive.plan.pipeline import param_tensors

    assert zero_owners(INTERNLM_7B, s, n) == _partition_param_list(param_tensors(INTERNLM_7B, s), n)


def test_owner_count_at_1024_ranks():
    # every tensor gets a rank of its own: the embedding, 32 x (QKV, output, two norms, three MLP matrices), the
    # final norm and the head (InternLM's real model also has its attention biases, 64 more: not expressible)
    assert zero_owners(INTERNLM_7B, _setup(128), 1024) == 1 + 32 * 7 + 2
    assert zero_owners(INTERNLM_7B, _setup(1), 8) == 8
    # a pipeline stage holds its blocks and, first stage, the embedding; not the head
    assert zero_owners(INTERNLM_7B, _setup(128, pp=2, global_batch=None), 1024) == 1 + 16 * 7


def test_broadcast_cost_is_nccls_ring_model():
    bw = 40e9
    t, lat = broadcast_s(90e6, 1024, 128, bw)
    assert lat == pytest.approx((8.4 + 1024 * 14.0) * 1e-6)
    assert t == pytest.approx(lat + 90e6 / bw)          # bus bandwidth = algorithm bandwidth for a broadcast
    assert broadcast_s(90e6, 8, 1, bw)[1] == pytest.approx((8.4 + 8 * 4.0) * 1e-6)
    assert broadcast_s(90e6, 1, 1, bw) == (0.0, 0.0) and broadcast_s(0, 8, 1, bw) == (0.0, 0.0)
    # latency doubles with the ranks: what InternLM's TP 1 and TP 2 rows at 1,024 GPUs lose
    assert broadcast_s(1, 1024, 128, bw)[1] / broadcast_s(1, 512, 128, bw)[1] == pytest.approx(2, rel=0.01)


def test_gradients_are_all_reduced_in_512m_buckets_and_the_broadcasts_counted_apart():
    s = _setup(128)
    c = comm_times(INTERNLM_7B, s, 0.0)
    assert c["dp_buckets"] == 14 and c["dp_algo"] in ("ring", "tree")   # 7.3B / 512Mi elements
    assert c["dp_bcast_calls"] == 227 and c["dp_bcast_latency"] == pytest.approx(227 * (8.4 + 1024 * 14) * 1e-6)
    plain = comm_times(INTERNLM_7B, _setup(128, zero_broadcast=False), 0.0)
    assert plain["dp_bcast"] == 0 and plain["dp_calls"] == 32    # reduce-scatter + all-gather per block


def test_the_broadcasts_slow_a_thousand_gpus_and_not_one_node():
    for nodes, lo, hi in ((1, 0.0, 0.03), (128, 0.4, 0.6)):
        on, off = estimate(INTERNLM_7B, _setup(nodes)), estimate(INTERNLM_7B, _setup(nodes, zero_broadcast=False))
        assert lo <= 1 - on.tokens_per_s_per_gpu / off.tokens_per_s_per_gpu <= hi, nodes
    e = estimate(INTERNLM_7B, _setup(128))
    # waited for before the step ends: all of it in the step, and in the communication total
    assert e.comm["dp_bcast"] > 0 and e.times["zero_bcast_exposed"] == pytest.approx(e.comm["dp_bcast"])
    assert e.comm_s >= e.comm["dp_bcast"]
    assert any("broadcasts of the updated weights" in n for n in e.notes)
    # the bytes follow the weights' dtype
    fp32 = comm_times(INTERNLM_7B, _setup(128, precision="fp32", grad_dtype="fp32"), 0.0)
    bf16 = comm_times(INTERNLM_7B, _setup(128), 0.0)
    assert fp32["dp_bcast"] - fp32["dp_bcast_latency"] == pytest.approx(2 * (bf16["dp_bcast"] - bf16["dp_bcast_latency"]))


@pytest.mark.parametrize("kw, needle", [
    (dict(sharding="fsdp"), "--sharding fsdp"), (dict(sharding="none"), "--sharding none"),
    (dict(stack="megatron", compile=True), "--stack megatron"), (dict(lora_rank=16), "--lora-rank"),
    (dict(optimizer_in_backward=True, global_batch=None), "--optimizer-in-backward")])
def test_refused_outside_zero1_on_the_pytorch_stack(kw, needle):
    with pytest.raises(ValueError, match="--zero-broadcast") as e:
        _setup(2, **kw)
    assert needle in str(e.value)


def test_cli_explains_it_searches_only_zero1_and_refuses_fsdp(capsys):
    args = ("--layers", "32", "--hidden", "4096", "--heads", "32", "--ffn", "11008", "--vocab", "103168",
            "--gpu", "a100-80", "--gpus", "8", "--nodes", "64", "--seq", "2048", "--global-batch", "4096",
            "--precision", "bf16", "--zero-broadcast", "--grad-dtype", "bf16", "--no-compile", "--inter-gbs", "6.25")
    cp = invoke(capsys, *args, "--json")
    assert cp.returncode == 0, cp.stderr
    assert {c["sharding"] for c in json.loads(cp.stdout)["candidates"]} == {"zero1"}
    cp = invoke(capsys, *args, "--sharding", "zero1", "--micro-batch", "2", "--checkpointing", "none", "--explain")
    assert cp.returncode == 0, cp.stderr
    assert "weight broadcasts: " in cp.stdout and "zero_bcast_exposed" in cp.stdout and "InternLM" in cp.stdout
    cp = invoke(capsys, *args, "--sharding", "fsdp")
    assert cp.returncode == 2 and "--zero-broadcast" in cp.stderr and len(cp.stderr.strip().splitlines()) == 1


def test_fp32_gradients_plan_torchs_zero_redundancy_optimizer_beside_ddp():
    """torch's ZeroRedundancyOptimizer beside DDP under autocast (zero_redundancy_optimizer.py): the fp32 model on
    every rank with DDP's bucket copies and no separate master, the states sharded; DDP's 25 MB all-reduce buckets;
    then `_sync_params` broadcasts every fp32 tensor from its owner, one call each (parameters_as_bucket_view off)."""
    from overdrive.plan.comm import ddp_buckets
    from overdrive.plan.memory import memory_breakdown
    from overdrive.plan.pipeline import torch_layout

    torch_s, ddp_s = _setup(4, grad_dtype="fp32"), _setup(4, grad_dtype="fp32", zero_broadcast=False, sharding="none")
    assert torch_s.torch_zero and not _setup(4).torch_zero
    zb, ddp = memory_breakdown(INTERNLM_7B, torch_s), memory_breakdown(INTERNLM_7B, ddp_s)
    P = INTERNLM_7B.n_params()
    assert zb["params"] == pytest.approx(ddp["params"]) == pytest.approx(6 * P / 2**30, rel=1e-6)
    assert zb["grads"] == pytest.approx(ddp["grads"])                       # DDP's gradients and its bucket copies
    assert zb["optimizer"] == pytest.approx(ddp["optimizer"] / torch_s.shards)
    c, i = comm_times(INTERNLM_7B, torch_s, 0.0), comm_times(INTERNLM_7B, _setup(4), 0.0)
    assert c["dp_buckets"] == len(ddp_buckets(INTERNLM_7B, torch_s, 4)) and i["dp_buckets"] == 14
    assert max(ddp_buckets(INTERNLM_7B, torch_s, 4)[1:-1]) < 2 * 4 * 4096 * 11008   # whole tensors, none split
    tensors = torch_layout(INTERNLM_7B, torch_s)   # a Llama-family model in PyTorch: q, k and v apart
    assert c["dp_bcast_calls"] == len(tensors) == 1 + 32 * 9 + 2 and i["dp_bcast_calls"] == 32
    # every call is one fp32 tensor: bytes twice InternLM's bf16 broadcasts of the same model, latency per tensor
    assert c["dp_bcast"] - c["dp_bcast_latency"] == pytest.approx(2 * (i["dp_bcast"] - i["dp_bcast_latency"]), rel=1e-6)
    assert c["dp_bcast_latency"] == pytest.approx(len(tensors) / 32 * i["dp_bcast_latency"], rel=1e-6)
    assert estimate(INTERNLM_7B, torch_s).memory_gib > estimate(INTERNLM_7B, _setup(4)).memory_gib + 15


def test_a_bias_model_broadcasts_its_biases_too():
    from overdrive.plan.pipeline import param_tensors

    gpt = ModelSpec(name="gpt", n_layer=4, hidden=256, n_head=4, n_kv_head=4, ffn=1024, vocab=1000, tied=True,
                    gated_mlp=False, learned_pos=128, bias=True)
    s = _setup(1, grad_dtype="fp32", global_batch=None)
    block = [256, 256, 256 * 768, 768, 256 * 256, 256, 256, 256, 256 * 1024, 1024, 1024 * 256, 256]
    assert param_tensors(gpt, s) == [1000 * 256, 128 * 256] + block * 4 + [256, 256]
    assert sum(param_tensors(gpt, s)) == gpt.n_params()
    assert len(param_tensors(INTERNLM_7B, s)) == 1 + 32 * 7 + 2   # no biases: weights alone
    assert comm_times(gpt, _setup(1, grad_dtype="fp32", global_batch=None), 0.0)["dp_bcast_calls"] == 2 + 12 * 4 + 2


def test_pure_bf16_broadcasts_its_bf16_weights():
    """--pure-bf16 keeps the model in bf16, so torch's optimizer broadcasts 2-byte tensors (param.data)."""
    fp32 = comm_times(INTERNLM_7B, _setup(4, grad_dtype="fp32"), 0.0)
    bf16 = comm_times(INTERNLM_7B, _setup(4, grad_dtype="fp32", pure_bf16=True), 0.0)
    assert bf16["dp_bcast_calls"] == fp32["dp_bcast_calls"]
    assert bf16["dp_bcast"] - bf16["dp_bcast_latency"] == pytest.approx(
        (fp32["dp_bcast"] - fp32["dp_bcast_latency"]) / 2, rel=1e-6)
