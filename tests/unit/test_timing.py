"""The shared clock and scheduler: behaviour, never the host's speed."""

import time

import pytest

from overdrive.measure.rounds import Clock, interleaved_rounds, rotated, speedup_ci, time_fn, verdict


def test_rotated_order_changes_every_round():
    assert rotated(["a", "b", "c"], 0) == ["a", "b", "c"]
    assert rotated(["a", "b", "c"], 1) == ["b", "c", "a"]
    assert rotated(["a", "b", "c"], 5) == ["c", "a", "b"]
    assert rotated([], 3) == []


def test_interleaved_rounds_rotates_and_drops():
    calls = []

    def run(key, k):
        calls.append((k, key))
        return not (key == "b" and k == 1)  # b fails in round 1

    n = interleaved_rounds(["a", "b", "c"], run, rounds=3)
    assert n == 3
    assert [c for c in calls if c[0] == 0] == [(0, "a"), (0, "b"), (0, "c")]
    assert [c for c in calls if c[0] == 1] == [(1, "b"), (1, "c"), (1, "a")]
    assert [key for k, key in calls if k == 2] == ["a", "c"]  # b dropped; rotation over the live ones


def test_interleaved_rounds_budget_keeps_min_rounds():
    def run(key, k):
        time.sleep(0.02)
        return True

    n = interleaved_rounds(["a", "b"], run, rounds=50, budget_s=0.0, min_rounds=2)
    assert n == 2  # the budget cannot cut below min_rounds, and stops right after


def test_a_dropped_slow_key_does_not_use_up_the_budget_of_the_live_ones():
    # "slow" costs 60 s in round 0, then is dropped (stopped early); the others cost 1 s a round.
    now = [0.0]

    def run(key, k):
        now[0] += 60.0 if key == "slow" else 1.0
        return key != "slow"

    def rounds(charge):
        now[0] = 0.0
        return interleaved_rounds(["base", "slow", "fast"], run, rounds=8, budget_s=20.0, min_rounds=2,
                                  charge_dropped=charge, clock=lambda: now[0])

    assert rounds(True) == 2  # wall clock: the slow key's minute ends the timing after min_rounds
    assert rounds(False) == 8  # the live keys' 2 s a round fit the 20 s budget: all rounds run


def test_time_fn_measures_the_call():
    ms = time_fn(lambda: time.sleep(0.01), cuda=False, reps=2)
    assert ms >= 9.0  # a lower bound only: a busy host makes it longer, never shorter


def test_clock_cpu_pairs():
    c = Clock(False)
    a = c.mark()
    b = c.mark()
    c.sync()
    assert c.elapsed_ms(a, b) >= 0


@pytest.mark.parametrize("base,cand,want", [
    ([10.0, 10.1, 9.9, 10.0, 10.2, 9.8], [5.0, 5.1, 4.9, 5.0, 5.05, 4.95], "faster"),
    ([5.0, 5.1, 4.9, 5.0, 5.05, 4.95], [10.0, 10.1, 9.9, 10.0, 10.2, 9.8], "slower"),
    ([10.0, 3.0, 30.0, 10.0, 12.0, 4.0], [10.0, 30.0, 3.0, 11.0, 5.0, 12.0], "same"),
])
def test_verdict_needs_the_whole_interval(base, cand, want):
    assert verdict(speedup_ci(base, cand)) == want


def test_verdict_unknown_without_samples():
    assert verdict(speedup_ci([1.0], [1.0])) == "unknown"
