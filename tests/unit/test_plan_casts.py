"""The planner's low-precision cast traffic (`Format.cast_bytes`, throughput._cast_bytes): counted per engine from
what its kernels move, per element of each GEMM operand, and where the weights are cast."""

import dataclasses
import os
import subprocess
import sys

import pytest

from overdrive.env import gpu_by_key
from overdrive.formats import FORMATS, get_format, planned_format
from overdrive.plan import TrainSetup, estimate, get_model
from overdrive.plan.search import DEFAULT_PRECISIONS, plan
from overdrive.plan.throughput import _block_gemms, _cast_bytes, cast_bytes_per_micro_batch, compute_times

H100 = gpu_by_key("h100-sxm")
M8 = get_model("llama3-8b")


def _by_hand(s, c, block, megatron):
    """The count written out: inputs, gradients, weights."""
    M = block[0][0]
    q, k, v, o, *mlp, down = block
    if megatron:   # QKV and FC1 read one norm output each; the projection and FC2 their own input
        x = c.norm_input * (M * q[1] + M * mlp[0][1]) + c.input * (M * o[1] + M * down[1])
    else:
        x = c.input * sum(a * kk for a, kk, _ in block)
    grad = c.grad * sum(a * n for a, _, n in block)
    w_elem = sum(kk * n for _, kk, n in block)
    return x, grad, w_elem


@pytest.mark.parametrize("precision, stack", [(p, st) for p in ("fp8", "fp8-rowwise", "fp8-delayed", "mxfp8")
                                               for st in ("pytorch", "megatron") if (p, st) != ("fp8-rowwise", "megatron")])
def test_cast_bytes_are_the_engines_count(precision, stack):
    s = TrainSetup(gpu=gpu_by_key("b200"), precision=precision, stack=stack, sharding="zero1", global_batch=64,
                   micro_batch=2, seq=4096)
    c = planned_format(precision).cast_bytes()
    block = _block_gemms(M8, s, s.micro_batch * s.seq)
    x, grad, w_elem = _by_hand(s, c, block, stack == "megatron")
    per_mb_weight = c.weight / s.grad_accum if stack == "megatron" else c.weight
    assert _cast_bytes(s, c, block) == pytest.approx(x + grad + per_mb_weight * w_elem)


def test_formats_say_where_their_counts_come_from():
    """Current tensorwise scaling pays an amax pass (torchao's roofline: 6 per input, 8 per weight); delayed scaling
    none (Transformer Engine's norm writes FP8: 2, a fused cast+transpose 4); a format with only plan_bytes keeps
    the first count."""
    tw, rw, dl, mx = (get_format(n).cast_bytes() for n in ("fp8-tensorwise", "fp8-rowwise", "fp8-delayed", "mxfp8"))
    assert (tw.input, tw.grad, tw.weight) == (6, 6, 8) and (rw.input, rw.grad, rw.weight) == (6, 6, 6)
    assert (dl.norm_input, dl.input, dl.grad, dl.weight) == (2, 4, 4, 4)
    assert mx.input == pytest.approx(6 * 1.15) and mx.grad == pytest.approx(3 * 1.15)
    assert all(f.cast_bytes() is not None for f in FORMATS.values() if f.plan_bytes is not None)


def test_megatron_casts_weights_once_a_step_pytorch_every_micro_batch():
    """More micro-batches per step: Megatron's per-micro-batch weight casts shrink (Transformer Engine's cache),
    the PyTorch stack's do not; gathered in FP8, the PyTorch stack only copies the transposed layout (2 B)."""
    for stack, shrinks in (("megatron", True), ("pytorch", False)):
        few, many = (cast_bytes_per_micro_batch(M8, TrainSetup(gpu=H100, precision="fp8", stack=stack, sharding="zero1",
                                                               micro_batch=1, global_batch=g, seq=4096))
                     for g in (8, 256))
        assert (many < few) == shrinks, stack
    s = TrainSetup(gpu=H100, precision="fp8", sharding="fsdp", micro_batch=1, global_batch=8, seq=4096)
    block = _block_gemms(M8, s, 4096)
    w_elem = sum(k * n for _, k, n in block)
    gathered = dataclasses.replace(s, fp8_all_gather=True)
    drop = _cast_bytes(s, get_format("fp8").cast_bytes(), block) - _cast_bytes(gathered, get_format("fp8").cast_bytes(), block)
    assert drop == pytest.approx((8 - 2) * w_elem)


def test_delayed_scaling_plans_faster_than_current_on_one_setup():
    """The same Megatron FP8 run: delayed scaling moves fewer cast bytes, so its memory-bound time is lower and
    nothing else changes."""
    kw = dict(gpu=H100, stack="megatron", sharding="zero1", tp=2, global_batch=64, micro_batch=1, seq=8192)
    cur, dl = (compute_times(M8, TrainSetup(precision=p, **kw)) for p in ("fp8", "fp8-delayed"))
    assert dl["memory"] < cur["memory"] and dl["gemm"] == pytest.approx(cur["gemm"])


def test_delayed_scaling_is_planned_when_asked_not_searched_by_default():
    assert "fp8-delayed" not in DEFAULT_PRECISIONS and "fp8" in DEFAULT_PRECISIONS
    out = plan(M8, "h100-sxm", gpus_per_node=8, seq=4096, stack="megatron", precisions=["fp8-delayed"],
               micro_batches=[1], shardings=["zero1"])
    assert out["candidates"] and {c["precision"] for c in out["candidates"]} == {"fp8-delayed"}


def test_cli_explain_names_the_cast_count():
    env = {**os.environ, "PYTHONPATH": os.path.join(os.path.dirname(__file__), "..", "..", "src"), "COLUMNS": "220"}
    cp = subprocess.run([sys.executable, "-m", "overdrive", "plan", "--model", "llama3-8b", "--stack", "megatron",
                         "--sharding", "zero1", "--precision", "fp8-delayed", "--global-batch", "64",
                         "--micro-batch", "1", "--explain"], capture_output=True, text=True, env=env, timeout=120)
    assert cp.returncode == 0, cp.stderr
    line = next(l for l in cp.stdout.splitlines() if l.strip().startswith("casts ("))
    assert "fp8-delayed" in line and "norm-fed input 2" in line and "once a step" in line
