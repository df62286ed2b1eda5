"""Micro-benchmarks: interleaved per group, and a far slower provider does not eat the run."""

import sys
import time
import types

import torch

from fakes import LIGER_OK, fake_liger_norms, machine
from overdrive.bench import micro
from overdrive.env import build_report


def test_a_far_slower_provider_is_sampled_twice_then_stops(monkeypatch):
    monkeypatch.setattr(micro, "PROVIDER_S", 0.06)
    calls = {"fast": 0, "slow": 0}

    def fast():
        calls["fast"] += 1

    def slow():
        calls["slow"] += 1
        time.sleep(0.05)

    rows = micro._group("g", {"fast": (fast, 1.0, "x"), "slow": (slow, 1.0, "x"), "gone": "not here"}, "cpu",
                        rounds=6, reps=3)
    assert calls["fast"] == 1 + 6 * 3  # warm-up, then every round at full reps
    assert calls["slow"] == 1 + 2  # warm-up, then one call a sample, two samples
    by = {r["provider"]: r for r in rows}
    assert by["slow"]["status"] == "ok" and by["slow"]["ms"]["median"] >= 45
    assert by["gone"] == {"group": "g", "provider": "gone", "status": "skipped", "reason": "not here"}


def test_micro_rates_are_printed_in_a_unit_that_shows_them():
    """A CPU's rates are fractions of a TB/s: they printed 0.000 TB/s; three significant digits in a scaled unit."""
    from overdrive.report.tables import rate_text

    assert rate_text(0.000412, "TB/s") == "412 MB/s"
    assert rate_text(0.0412, "TB/s") == "41.2 GB/s"
    assert rate_text(1.83, "TB/s") == "1.83 TB/s"
    assert rate_text(0.0009, "TFLOP/s") == "900 MFLOP/s"
    assert rate_text(None, "TB/s") == "-" and rate_text(3.0, "ops") == "3 ops"


def test_liger_rmsnorm_does_not_overwrite_the_gradient_every_provider_reuses(monkeypatch):
    """LigerRMSNorm(in_place=True), its default, writes dX into dY: the norm micro-benchmark reuses one gy, so
    every call after the first (and every provider after Liger) ran on the previous call's dX."""
    rms, ln = fake_liger_norms()
    mod = types.ModuleType("liger_kernel.transformers")
    mod.LigerRMSNorm, mod.LigerLayerNorm = rms, ln
    monkeypatch.setitem(sys.modules, "liger_kernel", types.ModuleType("liger_kernel"))
    monkeypatch.setitem(sys.modules, "liger_kernel.transformers", mod)
    torch.manual_seed(0)
    groups = micro._norms(build_report(machine("h100", liger=LIGER_OK)), (16, 32), "cpu", torch.float32)
    fn = groups["rmsnorm"]["liger"][0]
    norm = fn.__defaults__[0]
    fn()
    first = norm.weight.grad.clone()
    fn()  # the same gy again: the weight gradient accumulates the same value
    assert torch.allclose(norm.weight.grad, 2 * first)
    torch_fn = groups["rmsnorm"]["torch"][0]
    torch_fn()
    assert torch.allclose(torch_fn.__defaults__[0].weight.grad, first, atol=1e-6)


def test_fp8_gemm_shapes_scaled_mm_refuses_are_skipped_with_the_rule():
    rows = micro._gemm(build_report(machine("h100")), 32, 40, 32, "cpu")
    assert isinstance(rows["fp8"], str) and "divisible by 16" in rows["fp8"]
    assert not isinstance(micro._gemm(build_report(machine("h100")), 24, 32, 32, "cpu")["fp8"], str)  # M is free
