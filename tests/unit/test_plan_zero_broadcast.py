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


def _param_bcast_sync_handler(sizes: list[int], zero1_size: int) -> int:
    """InternLM's ParamBcastSyncHandler.__init__ (internlm/solver/optimizer/utils.py @ c7884462), line for line:
    the ranks it gives any parameter."""
    avg_param_num = sum(sizes) * 1.0 // zero1_size
    alloc_num, rank_to_go, ranks = 0, 0, set()
    for numel in sizes:
        alloc_num = alloc_num + numel
        if alloc_num > avg_param_num * 1.01 and rank_to_go < zero1_size - 1:
            rank_to_go = rank_to_go + 1
            alloc_num = 0
        ranks.add(rank_to_go)
    return len(ranks)


def _internlm_7b_parameters(tp: int) -> list[int]:
    """The real module order of InternLM's 7B (modeling_internlm.py @ c7884462: embedding; per block mixer.Wqkv
    weight and bias, out_proj weight and bias, norm1, norm2, mlp w1 w2 w3; norm; head), per TP rank."""
    h, f, v = 4096, 11008, 103168
    block = [3 * h * h // tp, 3 * h // tp, h * h // tp, h, h, h, h * f // tp, h * f // tp, h * f // tp]
    return [v * h // tp] + block * 32 + [h, v * h // tp]


@pytest.mark.parametrize("n, tp", [(8, 1), (64, 1), (128, 1), (512, 2), (1024, 1), (4096, 1)])
def test_owners_match_internlms_partition_of_its_real_parameters(n, tp):
    """The planner's compact tensor list (no biases) gives the owner count InternLM's own partition gives on the
    model's real parameter list, biases included."""
    s = _setup(max(1, n * tp // 8), tp=tp)
    assert zero_owners(INTERNLM_7B, s, n) == _param_bcast_sync_handler(_internlm_7b_parameters(tp), n)


def test_owners_at_1024_ranks_are_one_per_matrix():
    # shares of 7.1M elements, smaller than every matrix: the embedding lands on rank 1 (rank 0 empty), then each
    # of the 32 x 5 block matrices and the head open a rank of their own; the norms ride along
    assert zero_owners(INTERNLM_7B, _setup(128), 1024) == 1 + 32 * 5 + 1
    assert zero_owners(INTERNLM_7B, _setup(1), 8) == 8


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
    assert c["dp_bcast_calls"] == 162 and c["dp_bcast_latency"] == pytest.approx(162 * (8.4 + 1024 * 14) * 1e-6)
    plain = comm_times(INTERNLM_7B, _setup(128, zero_broadcast=False), 0.0)
    assert plain["dp_bcast"] == 0 and plain["dp_calls"] == 32    # reduce-scatter + all-gather per block


def test_the_broadcasts_slow_a_thousand_gpus_and_not_one_node():
    for nodes, lo, hi in ((1, 0.0, 0.01), (128, 0.3, 0.5)):
        on, off = estimate(INTERNLM_7B, _setup(nodes)), estimate(INTERNLM_7B, _setup(nodes, zero_broadcast=False))
        assert lo <= 1 - on.tokens_per_s_per_gpu / off.tokens_per_s_per_gpu <= hi, nodes
    e = estimate(INTERNLM_7B, _setup(128))
    # what the next forward covers: at most one micro-batch's forward, never more than the broadcasts take
    assert 0 < e.times["zero_bcast_exposed"] <= e.times["zero_bcast"]
    assert any("broadcasts of the updated weights" in n for n in e.notes)


@pytest.mark.parametrize("kw, needle", [
    (dict(sharding="fsdp"), "--sharding fsdp"), (dict(sharding="none"), "--sharding none"),
    (dict(stack="megatron", compile=True), "--stack megatron")])
def test_refused_outside_zero1_on_the_pytorch_stack(kw, needle):
    with pytest.raises(ValueError, match="--zero-broadcast") as e:
        _setup(2, **kw)
    assert needle in str(e.value)


def test_cli_explains_it_searches_only_zero1_and_refuses_fsdp(capsys):
    args = ("--layers", "32", "--hidden", "4096", "--heads", "32", "--ffn", "11008", "--vocab", "103168",
            "--gpu", "a100-80", "--gpus", "8", "--nodes", "64", "--seq", "2048", "--global-batch", "4096",
            "--precision", "bf16", "--zero-broadcast", "--no-compile", "--inter-gbs", "6.25")
    cp = invoke(capsys, *args, "--json")
    assert cp.returncode == 0, cp.stderr
    assert {c["sharding"] for c in json.loads(cp.stdout)["candidates"]} == {"zero1"}
    cp = invoke(capsys, *args, "--sharding", "zero1", "--micro-batch", "2", "--checkpointing", "none", "--explain")
    assert cp.returncode == 0, cp.stderr
    assert "weight broadcasts: " in cp.stdout and "zero_bcast_exposed" in cp.stdout
    cp = invoke(capsys, *args, "--sharding", "fsdp")
    assert cp.returncode == 2 and "--zero-broadcast" in cp.stderr and len(cp.stderr.strip().splitlines()) == 1
