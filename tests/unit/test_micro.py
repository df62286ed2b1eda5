"""Micro-benchmarks: interleaved per group, and a far slower provider does not eat the run."""

import time

from overdrive.bench import micro


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
