"""The planner's low-precision cast traffic (`Format.cast_bytes`, throughput._cast_bytes): counted per engine from
what its kernels move, per element of each GEMM operand, forward and backward apart, and where the weights are cast."""

import dataclasses
import os
import subprocess
import sys

import pytest

from overdrive.env import gpu_by_key
from overdrive.formats import FORMATS, get_format, planned_format
from overdrive.plan import TrainSetup, estimate, get_model
from overdrive.plan.runnable import how_to_run
from overdrive.plan.search import DEFAULT_PRECISIONS, plan
from overdrive.plan.throughput import _block_gemms, _cast_bytes, cast_bytes_per_micro_batch, compute_times
from overdrive.recipes import get_recipe

H100 = gpu_by_key("h100-sxm")
M8 = get_model("llama3-8b")


def _by_hand(s, c, megatron, tp_once=False):
    """The count written out for llama3-8b's block, shapes spelled from the model (not from _block_gemms)."""
    M, h, t = s.micro_batch * s.seq, M8.hidden, s.tp
    q, kv, F = M8.n_head * M8.head_dim, M8.n_kv_head * M8.head_dim, M8.ffn
    ins = [(h, q / t), (h, kv / t), (h, kv / t), (q / t, h), (h, F / t), (h, F / t), (F / t, h)]   # (K, N)
    tot, fwd = 0.0, 0.0
    for part in (0, 1):
        if megatron:   # one norm output feeds QKV, one FC1; the projection and FC2 cast their own input
            x = c.norm_input[part] * 2 * M * h + c.input[part] * M * (q / t + F / t)
            w = c.weight[part] / s.grad_accum
        elif tp_once:   # torchtitan's float8 TP: the attention's and the FFN's input cast once, on the shard
            x = c.input[part] * (2 * M / t * h + M * (q / t + F / t))
            w = c.weight[part]
        else:
            x = c.input[part] * M * sum(k for k, _ in ins)
            w = c.weight[part]
        b = x + c.grad[part] * M * sum(n for _, n in ins) + w * sum(k * n for k, n in ins)
        tot += b
        fwd += b if part == 0 else 0.0
    return tot, fwd


@pytest.mark.parametrize("precision, stack, tp", [
    (p, st, tp) for p in ("fp8", "fp8-rowwise", "fp8-delayed", "mxfp8", "nvfp4") for st in ("pytorch", "megatron")
    for tp in (1, 4) if (p, st) != ("fp8-rowwise", "megatron")])
def test_cast_bytes_are_the_engines_count(precision, stack, tp):
    s = TrainSetup(gpu=gpu_by_key("b200"), precision=precision, stack=stack, sharding="zero1", global_batch=64,
                   micro_batch=2, seq=4096, tp=tp, compile=not (precision == "fp8-delayed" and stack == "pytorch"))
    block = _block_gemms(M8, s, s.micro_batch * s.seq)
    got = _cast_bytes(s, planned_format(precision), block)
    f = planned_format(precision)
    assert got == pytest.approx(_by_hand(s, f.cast_bytes(), stack == "megatron", tp > 1 and precision == "fp8"))
    assert f.tp_float8_gather == (precision == "fp8")   # torchtitan's PrepareFloat8ModuleInput: tensorwise only


def test_formats_count_from_the_engines_sources():
    """torchao's roofline (tensorwise 6 per input/gradient, 5 + 3 per weight; rowwise 8, 3 + 7), Transformer
    Engine's delayed scaling (norm output 2 in the backward, cast+transpose 4, weight 4), MXFP8 two scaled casts
    per operand; a format with only plan_bytes (NVFP4) keeps the first count, a third of it forward."""
    tw, rw, dl, mx, nv = (get_format(n).cast_bytes() for n in
                          ("fp8-tensorwise", "fp8-rowwise", "fp8-delayed", "mxfp8", "nvfp4"))
    assert (tw.input, tw.grad, tw.weight) == ((6, 0), (0, 6), (5, 3))
    assert (rw.input, rw.grad, rw.weight) == ((5, 3), (0, 8), (3, 7))
    assert (dl.norm_input, dl.input, dl.grad, dl.weight) == ((0, 2), (4, 0), (0, 4), (4, 0))
    assert sum(mx.input) == pytest.approx(2 * (3 + 1 / 32)) and sum(mx.grad) == pytest.approx(sum(mx.input))
    assert nv.input == pytest.approx((2 * 1.3, 4 * 1.3)) and nv.grad == pytest.approx((0, 3 * 1.3))
    assert all(f.cast_bytes() is not None for f in FORMATS.values() if f.plan_bytes is not None)


def test_a_recompute_repeats_the_forward_casts_only(monkeypatch):
    """Full checkpointing runs the forward again: its casts (inputs, weights), not the gradients'. Moving a format's
    forward bytes into its backward leaves the memory-bound time as it was and takes exactly them out of the
    recompute."""
    from overdrive.formats import CastBytes
    from overdrive.plan.throughput import HBM_EFF

    for name in ("fp8-tensorwise", "fp8-rowwise"):
        f = get_format(name)
        s = TrainSetup(gpu=H100, precision=f.preset, sharding="fsdp", micro_batch=1, seq=8192, global_batch=8,
                       checkpointing="full")
        before = compute_times(M8, s)
        fwd = _cast_bytes(s, f, _block_gemms(M8, s, 8192))[1]
        late = CastBytes(*((0.0, sum(v)) for v in (f.plan_cast.norm_input, f.plan_cast.input, f.plan_cast.grad,
                                                    f.plan_cast.weight)))
        monkeypatch.setitem(FORMATS, name, dataclasses.replace(f, plan_cast=late))
        after = compute_times(M8, s)
        assert after["memory"] == pytest.approx(before["memory"])
        assert before["recompute"] - after["recompute"] == pytest.approx(
            M8.n_layer * fwd / (H100.hbm_tbs * 1e12 * HBM_EFF))
        assert fwd > 0


def test_megatron_casts_weights_once_a_step_pytorch_every_micro_batch():
    """More micro-batches per step: Megatron's per-micro-batch weight casts shrink (Transformer Engine's cache),
    the PyTorch stack's do not; gathered in FP8, the PyTorch stack only copies the transposed layout (2 B), and
    Megatron's FP8 parameters only their transpose once a step."""
    for stack, shrinks in (("megatron", True), ("pytorch", False)):
        few, many = (cast_bytes_per_micro_batch(M8, TrainSetup(gpu=H100, precision="fp8", stack=stack, sharding="zero1",
                                                               micro_batch=1, global_batch=g, seq=4096))
                     for g in (8, 256))
        assert (many < few) == shrinks, stack
    for stack, sharding, w_drop in (("pytorch", "fsdp", 8 - 2), ("megatron", "zero1", (4 - 2) / 8)):
        s = TrainSetup(gpu=H100, precision="fp8" if stack == "pytorch" else "fp8-delayed", stack=stack,
                       sharding=sharding, micro_batch=1, global_batch=64, seq=4096)
        c = planned_format(s.precision).cast_bytes()
        block = _block_gemms(M8, s, 4096)
        kn = sum(k * n for _, k, n in block)
        f = planned_format(s.precision)
        drop = _cast_bytes(s, f, block)[0] - _cast_bytes(dataclasses.replace(s, fp8_all_gather=True), f, block)[0]
        assert drop == pytest.approx(w_drop * kn), stack


def test_delayed_scaling_plans_faster_than_current_on_one_setup():
    """The same Megatron FP8 run: delayed scaling moves fewer cast bytes (no amax pass, norms write FP8), so its
    memory-bound time is lower and its GEMMs are the same."""
    kw = dict(gpu=H100, stack="megatron", sharding="zero1", tp=2, global_batch=64, micro_batch=1, seq=8192)
    cur, dl = (compute_times(M8, TrainSetup(precision=p, **kw)) for p in ("fp8", "fp8-delayed"))
    assert dl["memory"] < cur["memory"] and dl["gemm"] == pytest.approx(cur["gemm"])


def test_delayed_scaling_is_planned_when_asked_and_eager_on_the_pytorch_stack():
    """Not searched by default; asked for on Megatron it plans; on the PyTorch stack it needs --no-compile (TE's
    DelayedScaling does not run under torch.compile: Overdrive's own resolve falls back to current scaling), and
    the recipe the plan prints resolves to that same scaling."""
    assert "fp8-delayed" not in DEFAULT_PRECISIONS and "fp8" in DEFAULT_PRECISIONS
    out = plan(M8, "h100-sxm", gpus_per_node=8, seq=4096, stack="megatron", precisions=["fp8-delayed"],
               micro_batches=[1], shardings=["zero1"])
    assert out["candidates"] and {c["precision"] for c in out["candidates"]} == {"fp8-delayed"}
    with pytest.raises(ValueError, match="does not run under torch.compile: add --no-compile"):
        estimate(M8, TrainSetup(gpu=H100, precision="fp8-delayed"))
    e = estimate(M8, TrainSetup(gpu=H100, precision="fp8-delayed", compile=False, fused_kernels=True))
    run = how_to_run({"precision": "fp8-delayed", "compile": False, "stack": "pytorch", "checkpointing": "none"})
    r = get_recipe(run["recipe"])
    assert r.compile == "off" and r.fp8_scaling == get_format("fp8-delayed").scaling and e.tokens_per_s_per_gpu > 0


@pytest.mark.parametrize("spelled, want", [("fp8_delayed", "fp8-delayed"), ("FP8-Delayed", "fp8-delayed"),
                                           ("delayed", "fp8-delayed"), ("fp8-delayed-scaling", "fp8-delayed"),
                                           ("float8", "fp8"), ("rowwise", "fp8-rowwise")])
def test_a_format_spelled_any_registered_way_plans_as_its_preset(spelled, want):
    s = TrainSetup(gpu=H100, precision=spelled, stack="pytorch", compile=want != "fp8-delayed",
                   fused_kernels=want == "fp8-delayed")
    assert s.precision == want


def test_a_misspelled_precision_gets_the_nearest_name():
    with pytest.raises(ValueError, match="did you mean --precision fp8-delayed"):
        TrainSetup(gpu=H100, precision="fp8-delayd", stack="megatron")


def test_cli_explain_names_the_cast_count():
    env = {**os.environ, "PYTHONPATH": os.path.join(os.path.dirname(__file__), "..", "..", "src"), "COLUMNS": "220"}
    cp = subprocess.run([sys.executable, "-m", "overdrive", "plan", "--model", "llama3-8b", "--stack", "megatron",
                         "--sharding", "zero1", "--precision", "fp8-delayed", "--global-batch", "64",
                         "--micro-batch", "1", "--explain"], capture_output=True, text=True, env=env, timeout=120)
    assert cp.returncode == 0, cp.stderr
    line = next(l for l in cp.stdout.splitlines() if l.strip().startswith("casts ("))
    assert "fp8-delayed" in line and "norm-fed input 2" in line and "once a step" in line
