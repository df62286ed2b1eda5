"""The host-bound floor of eager micro-batches (plan/host.py): the GPU waits for Python's per-op dispatch when a
micro-batch's GPU work is short; the op counts are the committed measurement's, re-counted here."""

import dataclasses
import json
import random
from pathlib import Path

import pytest

from overdrive.plan import ModelSpec, TrainSetup
from overdrive.plan.estimate import estimate
from overdrive.plan.host import (HOST_US_PER_OP, HOST_US_PER_OP_CPU, OPS_OUTSIDE_BLOCKS, OPS_PER_BLOCK,
                                 ZERO3_OPS_PER_BLOCK, eager_ops, host_time, zero3_ops)

from plan_cli import run  # noqa: F401 (a fixture)
from plan_models import A100

ROOT = Path(__file__).resolve().parents[2]
MEASURED = ROOT / "benchmarks" / "results" / "cpu" / "2026-12-07-host-ops" / "host-ops.json"
ZERO3_MEASURED = ROOT / "benchmarks" / "results" / "cpu" / "2026-12-07-zero3-host" / "zero3-host.json"
QWEN_18B = ModelSpec(name="qwen-1.8b-like", n_layer=24, hidden=2048, n_head=16, n_kv_head=16, ffn=5504,
                     vocab=151936, tied=False)


def _eager(**kw) -> TrainSetup:
    base = dict(gpu=A100, gpus_per_node=1, nodes=1, seq=256, micro_batch=1, global_batch=8, precision="bf16",
                sharding="none", checkpointing="full", compile=False, block_code="hf", lora_rank=64)
    return TrainSetup(**(base | kw))


def test_short_lora_micro_batches_wait_for_the_host():
    e = estimate(QWEN_18B, _eager())
    host = host_time(QWEN_18B, _eager())
    gpu_work = (e.times["gemm"] + e.times["attention"] + e.times["memory_bound"] + e.times["recompute"]) / 8
    assert host > gpu_work                      # 24 blocks x 766 ops x 8.6 us vs ~24 ms of GPU work
    assert e.times["host_exposed"] == pytest.approx(8 * (host - gpu_work), rel=1e-6)
    assert any(n.startswith("host-bound: eager PyTorch dispatches about 18,464 ops") for n in e.notes), e.notes
    # the step is the host's: 8 micro-batches of dispatch plus the optimizer
    assert e.step_s == pytest.approx(8 * host + e.times["optimizer"], rel=1e-6)


def test_no_floor_where_the_code_is_compiled():
    s = _eager(compile=True)   # (--stack megatron has no eager mode: refused with --no-compile)
    assert host_time(QWEN_18B, s) == 0.0
    e = estimate(QWEN_18B, s)
    assert e.times["host_exposed"] == 0.0 and not any("host-bound" in n for n in e.notes)


def test_long_sequences_hide_the_dispatch():
    e = estimate(QWEN_18B, _eager(seq=8192))
    assert e.times["host_exposed"] == 0.0 and host_time(QWEN_18B, _eager(seq=8192)) > 0
    assert not any("host-bound" in n for n in e.notes)


def test_the_ops_follow_the_blocks_checkpointing_lora_and_autocast():
    rng = random.Random(7)
    for _ in range(20):
        L = rng.choice([2, 8, 24, 32, 80])
        m = dataclasses.replace(QWEN_18B, n_layer=L)
        lora = rng.choice([0, 8])
        ckpt = rng.choice(["none", "full"])
        sharding = rng.choice(["none", "zero2", "fsdp"])
        s = _eager(lora_rank=lora, checkpointing=ckpt, sharding=sharding, gpus_per_node=8, global_batch=64)
        per_block = OPS_PER_BLOCK[(lora > 0, ckpt == "full", sharding == "none")]
        assert eager_ops(m, s) == pytest.approx(L * per_block + OPS_OUTSIDE_BLOCKS)
        assert host_time(m, s) == pytest.approx(eager_ops(m, s) * HOST_US_PER_OP * 1e-6)
    # a pipeline stage dispatches its own blocks only; selective checkpointing reruns half of them
    m = dataclasses.replace(QWEN_18B, n_layer=32)
    s1, s2 = _eager(gpus_per_node=8, global_batch=64), _eager(gpus_per_node=8, global_batch=64, pp=2, vpp=1)
    assert eager_ops(m, s2) - OPS_OUTSIDE_BLOCKS == pytest.approx((eager_ops(m, s1) - OPS_OUTSIDE_BLOCKS) / 2)
    sel = eager_ops(m, _eager(checkpointing="selective"))
    assert eager_ops(m, _eager(checkpointing="none")) < sel < eager_ops(m, _eager())
    # pure bf16 (no fp32 masters): no autocast casts
    assert eager_ops(m, _eager(master_weights="none")) < eager_ops(m, _eager())


def test_the_constants_are_the_committed_measurement():
    rec = json.loads(MEASURED.read_text())
    for (lora, ckpt, cast), n in OPS_PER_BLOCK.items():
        key = f"{'lora' if lora else 'full'}-{'ckpt' if ckpt else 'none'}-{'autocast' if cast else 'bf16'}"
        assert rec["ops_per_block"][key] == n, key
    assert HOST_US_PER_OP_CPU == pytest.approx(rec["timing"]["us_per_op_fastest"], abs=0.05)
    outside = [v for k, v in rec["ops_outside_blocks"].items() if not k.startswith("lora-none")]
    assert min(outside) <= OPS_OUTSIDE_BLOCKS <= max(outside)


def test_the_counts_still_hold_for_the_installed_transformers():
    """Re-count the non-LoRA cases (peft is not a test dependency) with the installed transformers: a new
    release that changes its Llama block's dispatch by more than 15% means re-running the script."""
    pytest.importorskip("transformers")
    import importlib.util
    spec = importlib.util.spec_from_file_location("measure_host_ops", ROOT / "scripts" / "measure_host_ops.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    for ckpt in (False, True):
        for cast in (False, True):
            c2, c4 = (mod.count_ops(n, lora=False, ckpt=ckpt, autocast=cast) for n in (2, 4))
            assert (c4 - c2) / 2 == pytest.approx(OPS_PER_BLOCK[(False, ckpt, cast)], rel=0.15), (ckpt, cast)


def test_the_cli_says_when_the_host_is_the_bottleneck(run):
    flags = ["--layers", "24", "--hidden", "2048", "--heads", "16", "--kv-heads", "16", "--ffn", "5504",
             "--vocab", "151936", "--gpu", "a100-80", "--gpus", "1", "--seq", "256", "--micro-batch", "1",
             "--global-batch", "8", "--precision", "bf16", "--checkpointing", "full", "--block-code", "hf",
             "--sharding", "none", "--lora-rank", "64"]
    eager = run(*flags, "--no-compile", "--json")
    assert eager.returncode == 0, eager.stderr
    best = json.loads(eager.stdout)["candidates"][0]
    assert best["times_s"]["host_exposed"] > 0 and any("host-bound" in n for n in best["notes"])
    explained = run(*flags, "--no-compile", "--explain")
    text = " ".join(explained.stdout.split())   # rich wraps the lines
    assert "host_exposed" in text
    assert ("the GPU waiting for the host: (eager PyTorch's dispatch, blocks × ops per block + 80, none when "
            "compiled; + blocks × ZeRO-3's hooks in ops' worth with --sharding zero3, compiled or not) × "
            "µs per op (8.6 unless --host-us)") in text
    assert "at 8.6 µs per op (a B200 host's eager step); it bounds the step: at 17.2 µs" in text
    compiled = json.loads(run(*flags, "--json").stdout)["candidates"][0]
    assert compiled["times_s"]["host_exposed"] == 0
    assert compiled["tokens_per_s_per_gpu"] > best["tokens_per_s_per_gpu"]


def test_fp8_dispatches_at_least_what_bf16_does():
    """torchao's float8 linears cast their inputs and weights in every call: never fewer ops than bf16's."""
    from overdrive.env import gpu_by_key
    h100 = gpu_by_key("h100-sxm")
    for sharding in ("none", "fsdp"):
        bf16 = _eager(gpu=h100, sharding=sharding, gpus_per_node=8, global_batch=64)
        fp8 = dataclasses.replace(bf16, precision="fp8")
        assert eager_ops(QWEN_18B, fp8) >= eager_ops(QWEN_18B, bf16)


def test_the_busiest_pipeline_rank_dispatches_its_own_blocks():
    m = dataclasses.replace(QWEN_18B, n_layer=25)
    s = _eager(gpus_per_node=4, global_batch=32, pp=4, vpp=1)
    busiest = 7   # 25 blocks over 4 ranks: 7, 6, 6, 6
    assert eager_ops(m, s) == pytest.approx(busiest * OPS_PER_BLOCK[(True, True, True)] + OPS_OUTSIDE_BLOCKS)


def test_selective_op_recomputation_dispatches_more_than_none():
    none, sel_op = (eager_ops(QWEN_18B, _eager(checkpointing=c)) for c in ("none", "selective-op"))
    assert none < sel_op < eager_ops(QWEN_18B, _eager())


def test_nccl_takes_no_compute_while_the_gpu_waits_for_the_host():
    """The SMs NCCL holds cost nothing while the GPU idles for the host's dispatch (estimate.nccl_sms)."""
    s = _eager(gpus_per_node=8, global_batch=64, sharding="zero3")
    e = estimate(QWEN_18B, s)
    assert e.times["host_exposed"] > 0
    assert e.times["nccl_sms"] == 0.0   # ~38 ms idle per micro-batch, far more than the SMs' share
    assert e.step_s == pytest.approx(sum(v for k, v in e.times.items() if k not in ("dp_comm", "dp_latency")), rel=1e-6)


def test_the_note_says_where_its_time_per_op_is_from_and_names_fused_kernels():
    e = estimate(QWEN_18B, _eager(fused_kernels=True))
    note = next(n for n in e.notes if n.startswith("host-bound"))
    assert "counted unfused: --fused-kernels dispatch fewer" in note and "at least" in note
    assert f"{HOST_US_PER_OP} µs per op, a B200 host's eager step" in note
    tiny = ModelSpec(name="tiny", n_layer=2, hidden=256, n_head=4, n_kv_head=4, ffn=512, vocab=1024, tied=False)
    note = next(n for n in estimate(tiny, _eager()).notes if n.startswith("host-bound"))
    assert " vs 0 ms" not in note and " ms of GPU work" in note   # one decimal: never "vs 0 ms"


def test_deepspeed_zero3_hooks_every_block_on_top_of_the_dispatch():
    """ZeRO-3's per-module hooks (scripts/measure_zero3_host.py) add to the eager ops on every block, one GPU or
    many, LoRA's adapter modules included; other shardings add nothing."""
    rng = random.Random(3)
    for _ in range(20):
        L, lora, ckpt = rng.choice([2, 24, 80]), rng.choice([0, 64]), rng.choice(["none", "full"])
        m = dataclasses.replace(QWEN_18B, n_layer=L)
        gpus = rng.choice([1, 8])
        z3 = _eager(lora_rank=lora, checkpointing=ckpt, sharding="zero3", gpus_per_node=gpus, global_batch=8 * gpus)
        other = dataclasses.replace(z3, sharding=rng.choice(["zero2", "fsdp"]) if gpus > 1 else "none")
        assert zero3_ops(m, other) == 0.0
        assert zero3_ops(m, z3) == pytest.approx(L * ZERO3_OPS_PER_BLOCK[(lora > 0, ckpt == "full")])
        assert host_time(m, z3) == pytest.approx((eager_ops(m, z3) + zero3_ops(m, z3)) * HOST_US_PER_OP * 1e-6)
    m = QWEN_18B
    assert zero3_ops(m, _eager(sharding="zero3")) > zero3_ops(m, _eager(sharding="zero3", lora_rank=0))


def test_a_compiled_module_keeps_zero3s_hooks_and_the_note_names_them():
    """DeepSpeed runs its hooks eagerly around a compiled module: the floor is theirs alone, and the note does not
    offer torch.compile as the fix."""
    s = _eager(sharding="zero3", lora_rank=0, compile=True)
    assert host_time(QWEN_18B, s) == pytest.approx(zero3_ops(QWEN_18B, s) * HOST_US_PER_OP * 1e-6)
    tiny = ModelSpec(name="tiny", n_layer=4, hidden=256, n_head=4, n_kv_head=4, ffn=512, vocab=1024, tied=False)
    note = next(n for n in estimate(tiny, s).notes if n.startswith("host-bound"))
    assert "DeepSpeed ZeRO-3's module hooks cost about 2,448 ops' worth" in note      # 4 checkpointed blocks x 612
    assert "eager PyTorch" not in note and "torch.compile" not in note and "FSDP hooks a block" in note
    note = next(n for n in estimate(tiny, dataclasses.replace(s, compile=False)).notes if n.startswith("host-bound"))
    assert "eager PyTorch dispatches about" in note and " and DeepSpeed ZeRO-3's module hooks" in note


def test_the_zero3_constants_are_the_committed_measurement():
    rec = json.loads(ZERO3_MEASURED.read_text())
    for (lora, ckpt), n in ZERO3_OPS_PER_BLOCK.items():
        case = rec["cases"][f"{'lora' if lora else 'full'}-{'ckpt' if ckpt else 'none'}"]
        assert case["zero3_ops_worth_per_block"] == pytest.approx(n, abs=0.5)
        assert case["zero3_us_per_block"] > 0 and case["modules_per_block"] == (83 if lora else 13)


def test_selective_op_reruns_every_modules_hooks_under_zero3():
    """Per-op selective checkpointing reruns each block's forward (some ops' outputs kept): every module's ZeRO-3
    hooks fire again, as under full checkpointing."""
    for lora in (0, 64):
        sel, full = (zero3_ops(QWEN_18B, _eager(sharding="zero3", lora_rank=lora, checkpointing=c))
                     for c in ("selective-op", "full"))
        assert sel == full == 24 * ZERO3_OPS_PER_BLOCK[(lora > 0, True)]
