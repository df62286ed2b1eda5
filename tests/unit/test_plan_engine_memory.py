"""What the engines keep beyond the model's own tensors: Transformer Engine's cached FP8 weights under Megatron and
NCCL's communicator buffers, each against the engine's own numbers, and where the plan shows them."""

import dataclasses
import json

import pytest

from plan_cli import run  # noqa: F401 (a fixture)
from overdrive.env import gpu_by_key
from overdrive.plan import TrainSetup, estimate, get_model
from overdrive.plan.collectives import CONNECTION_BYTES, communicator_bytes, nccl_channels
from overdrive.formats import planned_format
from overdrive.plan.engine_memory import (linear_params, nccl_buffer_bytes, nccl_groups, te_weight_cache_bytes,
                                          weight_copies)
from overdrive.plan.memory import GIB, terms
from overdrive.plan.pipeline import stage_blocks
from overdrive.plan.validation import evaluate, load_runs

H100, B200 = gpu_by_key("h100-sxm"), gpu_by_key("b200")
M8 = get_model("llama3-8b")


def _mega(**kw) -> TrainSetup:
    base = dict(gpu=H100, tp=2, seq=8192, sharding="zero1", precision="fp8", stack="megatron", global_batch=64)
    return TrainSetup(**{**base, **kw})


def test_nccl_connection_is_the_three_protocol_buffers():
    # src/init.cc: LL 8 lines x 512 threads x 8 steps x 16 B, LL128 120 x 640 x 8 x 8 B, Simple 4 MiB
    assert CONNECTION_BYTES == 524_288 + 4_915_200 + 4_194_304
    ch = nccl_channels(8, 1)
    # one node: the ring's connection alone; across nodes the tree's chain adds one (two ranks) or two
    assert communicator_bytes(4, 1, 8) == ch * CONNECTION_BYTES
    assert communicator_bytes(1, 1, 8) == 0 and communicator_bytes(1, 2, 8) == 0
    inter = nccl_channels(9, 2)
    assert communicator_bytes(2, 2, 9) == inter * 2 * CONNECTION_BYTES
    assert communicator_bytes(16, 2, 9) == inter * 3 * CONNECTION_BYTES
    # ring + tree on 24 channels is what NVIDIA/nccl #964 measured on 4 A100s (544 MB two ranks, 688 MB four)
    assert ch * 3 * CONNECTION_BYTES / 1e6 == pytest.approx(688, rel=0.02)
    assert ch * 2 * CONNECTION_BYTES / 1e6 == pytest.approx(544, rel=0.2)
    assert communicator_bytes(4, 1, 8, nvlink=False) < communicator_bytes(4, 1, 8)   # PCIe: 4 channels


@pytest.mark.parametrize("kw, groups", [
    (dict(nodes=1, gpus_per_node=1, tp=1), {}),
    (dict(nodes=1, tp=1), {"world": (8, 1)}),                                    # DDP/FSDP over the default group
    (dict(nodes=2, tp=2), {"world": (16, 2), "data": (8, 2), "tensor": (2, 1)}),
    # dp 1: the gradients go over the data x context group, the attention's ring over the context group
    (dict(nodes=4, tp=8, pp=2, cp=2), {"world": (32, 4), "data": (2, 2), "tensor": (8, 1), "context": (2, 2)}),
    (dict(nodes=1, tp=8), {"world": (8, 1)}),                                    # the tensor group is the world
    # HSDP: FSDP over the 4 data ranks of a node, the shards' gradients all-reduced between the 2 nodes
    (dict(nodes=2, tp=2, sharding="hsdp"), {"world": (16, 2), "shard": (4, 1), "replicate": (2, 2), "tensor": (2, 1)}),
    (dict(nodes=2, tp=8, sharding="hsdp"), {"world": (16, 2), "data": (2, 2), "tensor": (8, 1)}),  # 1 shard/node
])
def test_nccl_groups_follow_the_layout(kw, groups):
    s = TrainSetup(gpu=H100, **kw)
    assert nccl_groups(s) == groups
    assert nccl_buffer_bytes(s) == sum(communicator_bytes(n, nodes, 9) for n, nodes in groups.values())


def test_nccl_buffers_sit_outside_the_allocator_but_in_the_fit():
    s = _mega(nodes=2)
    e = estimate(M8, s)
    assert e.nccl_gib == pytest.approx(nccl_buffer_bytes(s) / GIB) and 0.5 < e.nccl_gib < 2
    t = terms(M8, s)
    assert e.allocated_gib == pytest.approx(t["allocated"] / GIB)          # not in max_memory_allocated
    assert e.memory_gib == pytest.approx(sum(e.breakdown_gib.values()))    # but in what the GPU must hold
    one = estimate(M8, dataclasses.replace(s, nodes=1, gpus_per_node=1, tp=1))
    assert one.nccl_gib == 0


def test_te_caches_every_linear_weight_and_its_transpose_under_megatron():
    s = _mega()
    per_gpu = linear_params(M8) * stage_blocks(M8, s)[0] / s.tp
    assert te_weight_cache_bytes(M8, s) == pytest.approx(2 * per_gpu)           # FP8 weight + transpose (Hopper)
    assert terms(M8, s)["te_weight_cache"] == te_weight_cache_bytes(M8, s)
    without = estimate(M8, dataclasses.replace(s, stack="pytorch"))
    assert terms(M8, without.setup)["te_weight_cache"] == 0                      # torchao/te.Linear: cast per call
    assert te_weight_cache_bytes(M8, dataclasses.replace(s, precision="bf16")) == 0
    # --fp8-all-gather (Megatron's --fp8-param-gather): the FP8 parameter and its transpose replace the bf16 one
    assert te_weight_cache_bytes(M8, dataclasses.replace(s, fp8_all_gather=True)) == 0
    # Blackwell needs no transpose for per-tensor FP8; MXFP8 keeps a columnwise copy with its own scales
    bw = dataclasses.replace(s, gpu=B200)
    assert weight_copies(bw) == 1 and te_weight_cache_bytes(M8, bw) == pytest.approx(per_gpu)
    mx = dataclasses.replace(bw, precision="mxfp8")
    assert planned_format("mxfp8").stored_bytes == 1 + 1 / 32 and planned_format("nvfp4").stored_bytes == 0.5 + 1 / 16
    assert te_weight_cache_bytes(M8, mx) == pytest.approx(2 * (1 + 1 / 32) * per_gpu)
    pp = dataclasses.replace(s, pp=4, tp=1, global_batch=64)   # the busiest stage's blocks only
    assert te_weight_cache_bytes(M8, pp) == pytest.approx(2 * linear_params(M8) * stage_blocks(M8, pp)[0])
    assert estimate(M8, s).memory_gib > estimate(M8, dataclasses.replace(s, fp8_all_gather=True)).memory_gib
    # a LoRA's frozen base runs its forward and input gradient through the cached FP8 weight too
    assert te_weight_cache_bytes(M8, dataclasses.replace(s, lora_rank=16)) == te_weight_cache_bytes(M8, s)


def test_flagperf_fp8_over_bf16_memory_follows_the_cache():
    # FlagPerf's Megatron-LM runs (no --fp8-param-gather) read more in FP8 than in bf16 on nvidia-smi (+3 GiB on
    # one node, +2 on two) although FP8 keeps smaller activations: the cache is the difference
    rows = {r["id"]: r for r in evaluate() if r["id"].startswith("FlagPerf Llama3-8B") and "memory_published" in r}
    for n in (8, 16):
        bf16 = rows[next(k for k in rows if f" {n}xH100 bf16" in k)]
        fp8 = rows[next(k for k in rows if f" {n}xH100 fp8" in k)]
        assert fp8["memory_published"] > bf16["memory_published"]
        assert fp8["memory_predicted"] > bf16["memory_predicted"]


def test_nemo_family_rows_say_they_gather_fp8_params():
    # NeMo's fp8_params and Megatron-Bridge's mixed-precision presets (fp8_param_gather=True): the rows say so
    for r in load_runs():
        if r.get("stack") == "megatron" and r["precision"] not in ("bf16", "fp16", "fp32"):
            nemo = any(k in r["source"] for k in ("Megatron-Bridge", "NVIDIA/NeMo", "dgxc-benchmarking"))
            assert bool(r.get("fp8_all_gather")) == nemo, r["id"]


def test_explain_shows_the_groups_and_the_cache(run):
    cp = run("--model", "llama3-8b", "--gpu", "h100-sxm", "--nodes", "2", "--tp", "2", "--stack", "megatron",
             "--precision", "fp8", "--sharding", "zero1", "--checkpointing", "none", "--micro-batch", "1",
             "--explain", "--json")
    assert cp.returncode == 0, cp.stderr
    lines = json.loads(cp.stdout)["explain"]
    nccl = next(x for x in lines if x.strip().startswith("NCCL buffers"))
    assert "world 16 ranks on 2 nodes" in nccl and "tensor 2 ranks" in nccl
    assert any("TE FP8 weight cache" in x for x in lines)
    fit = next(x for x in lines if "fit rule:" in x)
    assert "NCCL buffers" in fit


def test_explain_itemises_dtensor_gathered_inputs(run):
    args = ("--model", "llama3-8b", "--gpu", "h100-sxm", "--tp", "2", "--precision", "bf16", "--sharding", "fsdp",
            "--checkpointing", "none", "--micro-batch", "1", "--explain", "--json")
    cp = run(*args)
    assert cp.returncode == 0, cp.stderr
    line = next(x for x in json.loads(cp.stdout)["explain"] if "DTensor TP saves" in x)
    m, s = M8, TrainSetup(gpu=H100, tp=2, seq=4096, precision="bf16")
    from overdrive.plan.memory import act_tensors
    from overdrive.plan.engine_memory import gathered_tp_bytes
    assert f"{gathered_tp_bytes(m, s, act_tensors(m, s)):,.0f} B" in line
    cp = run(*args, "--sequence-parallel", "regather")
    assert cp.returncode == 0 and not any("DTensor TP saves" in x for x in json.loads(cp.stdout)["explain"])


@pytest.mark.parametrize("kw, why", [(dict(tp=1), "no tensor parallelism"),
                                     (dict(tp=2, stack="megatron", sharding="zero1"), "regathers already")])
def test_regather_where_it_changes_nothing_says_so(kw, why):
    s = TrainSetup(gpu=H100, sp_regather=True, **kw)
    e = estimate(M8, s)
    assert any("--sequence-parallel regather changes nothing here" in n and why in n for n in e.notes)
    assert e.memory_gib == pytest.approx(estimate(M8, dataclasses.replace(s, sp_regather=None)).memory_gib)


@pytest.mark.parametrize("gpu, extra, says", [
    (H100, {}, "1 B per linear weight x 2 (rowwise + columnwise copy)"),
    (B200, {}, "1 B per linear weight x 1 (no transpose"),
    (B200, dict(precision="nvfp4"), "0.562 B per linear weight x 2"),
    (B200, dict(precision="mxfp8", fp8_all_gather=True), "less the 2 B bf16 weight it replaces"),
])
def test_explain_cache_line_states_the_bytes_and_copies_it_counts(gpu, extra, says):
    from overdrive.plan import explain
    e = estimate(M8, _mega(gpu=gpu, **extra))
    line = next(x for x in explain(e) if "TE FP8 weight cache" in x and "GiB (in buffers)" in x)
    assert says in line
    assert f"{terms(M8, e.setup)['te_weight_cache'] / GIB:.2f} GiB" in line
    other = next(x for x in explain(e) if x.strip().startswith("other"))
    assert "2 bytes per linear weight" not in other      # the per-weight bytes differ by format and GPU


def test_rowwise_fp8_keeps_a_columnwise_copy_on_blackwell_too():
    # per-row scales lie along the reduction dimension: the transpose needs its own, unlike one per-tensor scale
    assert weight_copies(_mega(gpu=B200)) == 1
    # (the megatron stack refuses rowwise, which TE lacks: the count is the format's, on any stack's setup)
    assert weight_copies(TrainSetup(gpu=B200, precision="fp8-rowwise")) == 2
    assert weight_copies(TrainSetup(gpu=H100, precision="fp8-rowwise")) == 2


def test_explain_says_when_float8_tp_gathers_in_one_byte():
    from overdrive.plan import explain
    for precision, float8 in (("fp8", True), ("bf16", False), ("fp8-rowwise", False)):
        s = TrainSetup(gpu=H100, tp=2, seq=8192, sharding="fsdp", precision=precision)
        line = next(x for x in explain(estimate(M8, s)) if "DTensor TP saves" in x)
        assert ("in float8" in line) == float8, (precision, line)


def test_megatron_fp8_param_gather_needs_a_sharded_optimizer():
    # Megatron's validate_args: "--fp8-param-gather only supported with distributed optimizer, torch fsdp2, ..."
    with pytest.raises(ValueError, match="distributed optimizer"):
        _mega(sharding="none", fp8_all_gather=True)
    assert _mega(sharding="zero1", fp8_all_gather=True).fp8_all_gather
    assert TrainSetup(gpu=H100, tp=2, precision="fp8", sharding="none", fp8_all_gather=True)   # torchao: no check
    from overdrive.plan.search import plan
    r = plan(M8, H100, tp=2, stack="megatron", precisions=["fp8"], fp8_all_gather=True, micro_batches=[1],
             checkpointing=["full"])
    searched = {c["sharding"] for c in r["candidates"]}
    assert "zero1" in searched and "none" not in searched          # searched: the DDP candidate is left out


def test_fp8_all_gather_takes_effect_only_where_an_engine_gathers_fp8():
    # torchao's float8 all-gather is for per-tensor scaling under FSDP2; Megatron's fp8_param_gather for all formats
    on = dict(tp=1, sharding="fsdp", fp8_all_gather=True)
    assert TrainSetup(gpu=H100, precision="fp8", **on).gather_bytes == 1
    assert TrainSetup(gpu=H100, precision="fp8-rowwise", **on).gather_bytes == 2
    assert TrainSetup(gpu=B200, precision="mxfp8", **on).gather_bytes == 2
    assert _mega(gpu=B200, precision="mxfp8", fp8_all_gather=True).gathers_fp8
    e = estimate(M8, TrainSetup(gpu=H100, precision="fp8-rowwise", **on))
    assert any("--fp8-all-gather changes nothing" in n for n in e.notes)
    assert not any("--fp8-all-gather" in n for n in estimate(M8, TrainSetup(gpu=H100, precision="fp8", **on)).notes)


def test_megatron_refuses_a_precision_transformer_engine_lacks_and_the_search_skips_it(run):
    # the format registry says Transformer Engine has no rowwise scaling; the megatron stack runs TE
    with pytest.raises(ValueError, match=r"fp8-rowwise with --stack megatron: Transformer Engine has no rowwise"):
        TrainSetup(gpu=H100, stack="megatron", sharding="zero1", precision="fp8-rowwise")
    TrainSetup(gpu=H100, stack="pytorch", precision="fp8-rowwise")   # torchao runs it
    cp = run("--model", "llama3-8b", "--gpu", "h100-sxm", "--stack", "megatron", "--json")
    assert cp.returncode == 0, cp.stderr
    out = json.loads(cp.stdout)
    assert any(n.startswith("fp8-rowwise skipped: Transformer Engine has no rowwise") for n in out["notes"])
    assert all(c["precision"] != "fp8-rowwise" for c in out["candidates"])
    cp = run("--model", "llama3-8b", "--gpu", "h100-sxm", "--stack", "megatron", "--precision", "fp8-rowwise")
    assert cp.returncode == 2 and "use --stack pytorch" in cp.stderr
