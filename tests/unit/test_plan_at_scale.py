"""Communication at scale from first principles (collectives.py, comm.py) and what the older stacks did
(no sequence parallelism, fp32 FSDP all-gathers, QK-norm, z-loss, hand-fused eager kernels)."""

import dataclasses
import json
import random

import pytest

from overdrive.env import gpu_by_key
from overdrive.plan import ModelSpec, TrainSetup, estimate, explain, get_model
from overdrive.plan.collectives import (LINK_EFF, RING_PLATEAU, choose_allreduce, gather_s, ring_latency_s,
                                        tree_latency_s)
from overdrive.plan.comm import comm_times, dp_exposed
from overdrive.plan.memory import act_bytes_per_layer, act_tensors
from overdrive.plan.throughput import HBM_EFF, compute_times

H100, A100 = gpu_by_key("h100-sxm"), gpu_by_key("a100-80")
GPT13 = ModelSpec(name="gpt-1.3b", n_layer=24, hidden=2048, n_head=16, n_kv_head=16, ffn=8192, vocab=50257,
                  gated_mlp=False, tied=True)


def test_ring_latency_is_nccls_model_hop_by_hop():
    # tuning.cc: base 8.4 µs + (steps − inter-node steps) × 3.4 + inter-node steps × 9.6; all-reduce ×1.9 multi-node
    assert ring_latency_s(16, 2, allreduce=True) == pytest.approx((8.4 + 28 * 3.4 + 2 * 9.6) * RING_PLATEAU * 1e-6)
    assert ring_latency_s(16, 2, allreduce=False) == pytest.approx((8.4 + 14 * 3.4 + 1 * 9.6) * 1e-6)
    assert ring_latency_s(8, 1, allreduce=True) == pytest.approx((8.4 + 14 * 3.4) * 1e-6)
    assert tree_latency_s(512, 64) == pytest.approx(2 * (7 * 28 + 6 * 50) * 1e-6)
    assert ring_latency_s(1, 1, allreduce=True) == 0


@pytest.mark.parametrize("n", [2, 3, 8, 17])
def test_bandwidth_terms_are_nccl_tests_bus_bandwidth_factors(n):
    bw, nbytes = 100e9, 1 << 30
    lat = ring_latency_s(n, 1, allreduce=False)
    assert gather_s(nbytes, n, 1, bw) - lat == pytest.approx((n - 1) / n * nbytes / bw)
    algo, t, t_lat = choose_allreduce(nbytes, n, 1, bw)
    assert algo == "ring" and t - t_lat == pytest.approx(2 * (n - 1) / n * nbytes / bw)


def test_tree_wins_at_hundreds_of_nodes_with_small_buckets_ring_with_big_ones():
    bw = LINK_EFF * 200e9
    assert choose_allreduce(25 * 2**20, 512, 64, bw)[0] == "tree"
    assert choose_allreduce(25 * 2**20, 16, 2, bw)[0] == "ring"
    algo, t, lat = choose_allreduce(25 * 2**20, 512, 64, bw)
    assert lat > 0.3 * t   # the latency is a third or more of each call at this scale


def test_bucket_overlap_closed_form_matches_a_simulated_stream():
    rng = random.Random(0)
    for _ in range(200):
        nb, t, bwd = rng.randint(1, 60), rng.uniform(1e-4, 2e-2), rng.uniform(1e-3, 0.5)
        s = TrainSetup(gpu=H100, sharding="none", overlap=1.0, gpus_per_node=8, nodes=2)
        exposed, _ = dp_exposed(s, {"dp": nb * t, "dp_buckets": nb, "dp_edge": t}, bwd, 0.0)
        c, end = bwd / nb, 0.0
        for k in range(1, nb + 1):   # bucket k is ready after k/nb of the backward; one stream, in order
            end = max(end, k * c) + t
        assert exposed == pytest.approx(end - bwd, rel=1e-9, abs=1e-12)


def test_a_small_model_over_64_nodes_is_latency_bound_and_says_so():
    """The issue's worst row: a 1.3B model data-parallel over 64 nodes at one sequence per GPU, predicted 3x too
    fast without the per-call latency. DDP's buckets (whole tensors, 25 MB caps: 73 calls for this model) over 512
    ranks: a third of the communication is NCCL's latency, and the step is communication-bound."""
    from overdrive.plan.comm import ddp_buckets

    kw = dict(gpu=A100, gpus_per_node=8, seq=2048, micro_batch=1, precision="bf16", sharding="none",
              inter_gbs=25)
    big = estimate(GPT13, TrainSetup(**kw, nodes=64, global_batch=512))
    one = estimate(GPT13, TrainSetup(**kw, nodes=1, global_batch=8))
    assert big.comm["dp_calls"] == len(ddp_buckets(GPT13, big.setup, 4)) == 73
    assert big.times["dp_latency"] > 0.3 * big.times["dp_comm"]
    assert one.times["dp_latency"] < 0.3 * one.times["dp_comm"]   # NVLink hops: 56 µs a call, not ~2 ms
    assert big.tokens_per_s_per_gpu < 0.5 * one.tokens_per_s_per_gpu
    assert any("latency over" in n for n in big.notes)
    text = "\n".join(explain(big))
    assert "tuning.cc" in text and "PERFORMANCE.md" in text and "tree" in text


def test_tensor_parallel_across_nodes_is_planned_with_its_cost():
    m = get_model("llama3-70b")
    base = dict(gpu=H100, gpus_per_node=8, nodes=2, seq=4096, precision="bf16", sharding="zero1",
                checkpointing="full", global_batch=16, stack="megatron")
    inside = estimate(m, TrainSetup(**base, tp=8, pp=2))
    across = estimate(m, TrainSetup(**base, tp=16))
    assert across.comm["tp_nodes"] == 2 and inside.comm["tp_nodes"] == 1
    # per GPU, a TP16 collective crosses the NICs (8 x 50 GB/s a node), not NVLink, and is not overlapped
    assert across.times["tp_exposed"] > 3 * inside.times["tp_exposed"]
    assert any("spans 2 nodes" in n for n in across.notes)
    with pytest.raises(ValueError, match="multiple of"):
        TrainSetup(gpu=H100, gpus_per_node=8, nodes=3, tp=12)


def test_without_sequence_parallelism_the_norm_tensors_stay_whole_on_every_tp_rank():
    """Korthikanti et al. 2022: TP alone keeps sbh·(10 + 24/t + 5as/ht) bytes; with SP all of it is /t. Here the
    replicated part is the norms' inputs and outputs, 8h bytes per token in bf16 (no dropout masks)."""
    m = get_model("llama3-8b")
    s = TrainSetup(gpu=H100, tp=4, seq=4096, micro_batch=2, precision="bf16", sp_regather=True)   # Megatron's SP
    off = dataclasses.replace(s, sequence_parallel=False)
    tokens = 4096 * 2
    rep = sum(v for k, v in act_tensors(m, s).items() if k in ("norm1_in", "qkv_in", "norm2_in", "mlp_in"))
    assert rep == 8 * m.hidden
    assert act_bytes_per_layer(m, off) - act_bytes_per_layer(m, s) == pytest.approx(tokens * rep * (1 - 1 / 4))
    # PyTorch's DTensor TP (the pytorch stack's way) saves the gathered GEMM inputs whole: between the two
    dtensor = dataclasses.replace(s, sp_regather=None)
    gathered = sum(v for k, v in act_tensors(m, s).items() if k in ("qkv_in", "mlp_in"))
    assert dtensor.keeps_gathered and not s.keeps_gathered and not off.keeps_gathered
    assert act_bytes_per_layer(m, dtensor) - act_bytes_per_layer(m, s) == pytest.approx(tokens * gathered * 3 / 4)
    assert act_bytes_per_layer(m, s) < act_bytes_per_layer(m, dtensor) < act_bytes_per_layer(m, off)
    assert not dataclasses.replace(dtensor, stack="megatron").keeps_gathered   # Megatron regathers by default
    e_on, e_off = estimate(m, s), estimate(m, off)
    assert e_off.breakdown_gib["activations"] > e_on.breakdown_gib["activations"]
    assert e_off.comm["tp"] == pytest.approx(e_on.comm["tp"])        # 4 all-reduces = 8 gathers/scatters of bytes
    assert compute_times(m, off)["memory"] > compute_times(m, s)["memory"]
    assert act_bytes_per_layer(m, dataclasses.replace(off, tp=1)) == act_bytes_per_layer(m, dataclasses.replace(s, tp=1))


def test_fp32_fsdp_all_gather_doubles_its_bytes_and_buffers():
    m = get_model("llama3-8b")
    s = TrainSetup(gpu=H100, gpus_per_node=8, nodes=4, seq=4096, precision="bf16", sharding="fsdp")
    f32 = dataclasses.replace(s, gather_dtype="fp32")
    a, b = comm_times(m, s, 0.0), comm_times(m, f32, 0.0)
    assert b["dp"] > 1.3 * a["dp"]
    layer = m.layer_params()
    assert (estimate(m, f32).breakdown_gib["other"] - estimate(m, s).breakdown_gib["other"]) * 2**30 == \
        pytest.approx(2 * layer * 2, rel=0.06)   # two gathered blocks, 2 more bytes each (+ the reserve on top)
    with pytest.raises(ValueError, match="keep one"):
        TrainSetup(gpu=H100, precision="fp8", gather_dtype="fp32", fp8_all_gather=True)


def test_qk_norm_from_the_config_and_in_memory_and_time(tmp_path):
    from overdrive.plan import model_from_hf_config

    p = tmp_path / "config.json"
    p.write_text(json.dumps({"model_type": "qwen3", "num_hidden_layers": 28, "hidden_size": 1024, "head_dim": 128,
                             "num_attention_heads": 16, "num_key_value_heads": 8, "intermediate_size": 3072,
                             "vocab_size": 151936, "tie_word_embeddings": True}))
    m = model_from_hf_config(str(p))
    assert m.qk_norm
    plain = dataclasses.replace(m, qk_norm=False)
    s = TrainSetup(gpu=H100, gpus_per_node=1, seq=4096, micro_batch=1)
    extra = act_bytes_per_layer(m, s) - act_bytes_per_layer(plain, s)
    assert extra == 4096 * (m.q_dim + m.kv_dim) * 2
    assert compute_times(m, s)["memory"] > compute_times(plain, s)["memory"]
    assert m.n_params() - plain.n_params() == m.n_layer * 2 * m.head_dim


def test_z_loss_costs_a_pass_over_the_logits_unless_the_loss_is_fused():
    m = get_model("llama3-1b")
    s = TrainSetup(gpu=H100, gpus_per_node=1, seq=4096, micro_batch=1, loss="standard")
    z = dataclasses.replace(s, z_loss=True)
    d = compute_times(m, z)["memory"] - compute_times(m, s)["memory"]
    assert d == pytest.approx(4096 * m.vocab * 12 / (H100.hbm_tbs * 1e12 * HBM_EFF), rel=1e-9)
    fused = dataclasses.replace(s, loss="fused")
    assert compute_times(m, dataclasses.replace(fused, z_loss=True))["memory"] == compute_times(m, fused)["memory"]


def test_hand_fused_eager_kernels_move_what_compiled_code_moves():
    m = get_model("llama3-8b")
    s = TrainSetup(gpu=H100, gpus_per_node=1, seq=4096, micro_batch=1)
    eager = dataclasses.replace(s, compile=False)
    fused = dataclasses.replace(eager, fused_kernels=True)
    assert compute_times(m, fused)["memory"] == compute_times(m, s)["memory"] < compute_times(m, eager)["memory"]


def test_cli_flags_of_the_older_stacks(capsys):
    from plan_cli import invoke

    def call(*a):
        r = invoke(capsys, *a)
        return r.returncode, r.stdout, r.stderr

    def run(*a):
        rc, out, err = call("--model", "llama3-8b", "--json", "--precision", "bf16", "--micro-batch", "1",
                            "--checkpointing", "none", *a)
        assert rc == 0, err
        return json.loads(out)["candidates"][0]

    base = run("--tp", "4")
    off = run("--tp", "4", "--sequence-parallel", "off")
    assert off["breakdown"]["activations"] > base["breakdown"]["activations"]
    assert run("--gather-dtype", "fp32", "--sharding", "fsdp")["times_s"]["dp_comm"] > \
        run("--sharding", "fsdp")["times_s"]["dp_comm"]
    assert run("--qk-norm")["breakdown"]["activations"] > run()["breakdown"]["activations"]
    assert run("--z-loss")["times_s"]["memory_bound"] > run()["times_s"]["memory_bound"]
    assert run("--no-compile", "--fused-kernels")["times_s"]["memory_bound"] == run()["times_s"]["memory_bound"]
    rc, _, err = call("--fused-kernels")
    assert rc == 2 and "--no-compile" in err
    rc, out, err = call("--tp", "16", "--gpus", "8", "--nodes", "2", "--json", "--micro-batch", "1",
                        "--precision", "bf16")
    assert rc == 0, err
    assert any("spans 2 nodes" in n for n in json.loads(out)["candidates"][0]["notes"])


def test_fsdp_root_unit_opens_and_closes_every_micro_batch():
    """fully_shard on each block, then on the model, leaves the embedding, the final norm and an untied head in the
    root unit: gathered once a micro-batch (in the compute dtype even with FP8 all-gather: the head and the embedding
    are never float8) and reduce-scattered last, with nothing to hide either. The exposed edge is the root's calls
    and one block's; the data-parallel bytes still add up to every parameter gathered twice (the root once) and
    every gradient reduced once."""
    from overdrive.plan.collectives import gather_s, group_layout
    from overdrive.plan.comm import _root_unit, comm_times

    m = get_model("llama3-8b")
    s = TrainSetup(gpu=gpu_by_key("h100-sxm"), gpus_per_node=8, seq=4096, micro_batch=1, global_batch=64,
                   sharding="fsdp", precision="bf16", checkpointing="none")
    root = _root_unit(m, s)
    assert root == pytest.approx(2 * m.vocab * m.hidden + m.hidden)   # untied embedding and head, the final norm
    assert root > 3 * m.layer_params()                                  # a 128K vocabulary: more than three blocks
    c = comm_times(m, s, 0.0)
    nodes, bw = group_layout(s, s.shards, s.tp)
    blk = (m.n_params() - root) / m.n_layer
    edge = gather_s(root * 2, 8, nodes, bw) + gather_s(root * 4, 8, nodes, bw) + gather_s(blk * 2, 8, nodes, bw) \
        + gather_s(blk * 4, 8, nodes, bw)
    assert c["dp_edge"] == pytest.approx(s.grad_accum * edge, rel=1e-9)
    assert c["dp_calls"] == s.grad_accum * (3 * m.n_layer + 2)
    # FP8 all-gather gathers the blocks in one byte, the root still in two
    f = comm_times(m, dataclasses.replace(s, precision="fp8", fp8_all_gather=True), 0.0)
    assert f["dp_edge"] - c["dp_edge"] == pytest.approx(
        s.grad_accum * (gather_s(blk, 8, nodes, bw) - gather_s(blk * 2, 8, nodes, bw)), rel=1e-9)
    # megatron's FSDP and pipelined stages split evenly, as before
    assert _root_unit(m, dataclasses.replace(s, stack="megatron")) == 0
    assert _root_unit(m, dataclasses.replace(s, pp=2, global_batch=64)) == 0


_DDP_PROBE = """
import torch, torch.distributed as dist, torch.nn as nn
dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
class Block(nn.Module):
    def __init__(s, h, f):
        super().__init__()
        s.ln1, s.qkv, s.o = nn.LayerNorm(h), nn.Linear(h, 3 * h), nn.Linear(h, h)
        s.ln2, s.fc, s.proj = nn.LayerNorm(h), nn.Linear(h, f), nn.Linear(f, h)
    def forward(s, x):
        x = x + s.o(s.qkv(s.ln1(x))[..., :x.shape[-1]])
        return x + s.proj(torch.relu(s.fc(s.ln2(x))))
class GPT(nn.Module):
    def __init__(s):
        super().__init__()
        s.wte, s.wpe = nn.Embedding(5000, 768), nn.Embedding(64, 768)
        s.blocks, s.lnf = nn.ModuleList([Block(768, 3072) for _ in range(4)]), nn.LayerNorm(768)
    def forward(s, idx):
        x = s.wte(idx) + s.wpe(torch.arange(idx.shape[1]))
        for b in s.blocks:
            x = b(x)
        return s.lnf(x) @ s.wte.weight.t()
d = nn.parallel.DistributedDataParallel(GPT())
for _ in range(3):
    d(torch.randint(0, 5000, (1, 64))).sum().backward()
print(d._get_ddp_logging_data()["rebuilt_bucket_sizes"])
"""


def test_ddp_buckets_are_torchs_own():
    """PyTorch's Reducer, run here (gloo, one CPU rank): after the first step it rebuilds its buckets in gradient
    order, whole tensors, the first closing at 1 MiB and the rest at 25 MiB. ddp_buckets gives the same sizes for
    the same model: a GPT-2 block of 7.1M parameters about fills one bucket; the tied embedding comes last."""
    import os
    import subprocess
    import sys

    from overdrive.plan.comm import ddp_buckets

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", _DDP_PROBE], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    torch_sizes = [int(x) for x in out.stdout.strip().splitlines()[-1].split(",")]
    gpt = ModelSpec(name="gpt", n_layer=4, hidden=768, n_head=12, n_kv_head=12, ffn=3072, vocab=5000, tied=True,
                    gated_mlp=False, learned_pos=64, bias=True)
    s = TrainSetup(gpu=A100, gpus_per_node=8, sharding="none", seq=64, micro_batch=1)
    assert ddp_buckets(gpt, s, 4) == torch_sizes
    assert len(torch_sizes) == 5 and torch_sizes[0] < 10 * 2**20 and torch_sizes[-1] > 4 * 5000 * 768


def test_a_llama_registers_q_k_v_apart_and_its_qk_norm_gains():
    """DDP's buckets follow the model's own tensors: a Llama-family model in PyTorch (Hugging Face, torchtitan,
    torchtune) has q, k and v projections apart, so a 64 MB q and a 16 MB k and v close buckets of their own."""
    from overdrive.plan.comm import ddp_buckets
    from overdrive.plan.pipeline import param_tensors, torch_layout

    llama = get_model("llama3-8b")
    s = TrainSetup(gpu=H100, gpus_per_node=8, sharding="none", seq=4096, micro_batch=1)
    assert len(torch_layout(llama, s)) == len(param_tensors(llama, s)) + 2 * llama.n_layer
    assert sum(torch_layout(llama, s)) == sum(param_tensors(llama, s)) == llama.n_params()
    qk = dataclasses.replace(llama, qk_norm=True)
    assert len(param_tensors(qk, s)) == len(param_tensors(llama, s)) + 2 * llama.n_layer
    assert len(ddp_buckets(llama, s, 4)) == 194   # fp32 gradients: every q, o and MLP matrix a bucket of its own
