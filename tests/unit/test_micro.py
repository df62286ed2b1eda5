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
