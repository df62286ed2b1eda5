"""The one way Overdrive times things: a synchronised clock, warm-up, interleaved rotating rounds;
the statistics over those rounds are in `overdrive.measure.stats`.

Every workload, the micro-benchmarks and `tune` time through this module, so a fix to how we
measure lands once. The rules it encodes (see triton.testing.do_bench and
torch.utils.benchmark for the same ideas):
- on CUDA, time with events recorded on the stream and read after one synchronize; on CPU, the
  monotonic clock (`time.perf_counter`);
- the first calls (compilation, allocator growth, kernel selection) are warm-up: timed apart,
  never mixed into the samples;
- A and B are compared in interleaved rounds whose order rotates, so drift of a shared, noisy
  host hits every contender alike;
- a speedup is the geometric mean of per-round paired ratios with a bootstrap over rounds, and a
  verdict needs the whole interval beyond the A/A noise floor measured in the same run.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Sequence
from typing import TypeVar

from overdrive.measure.stats import speedup_ci, summarize

__all__ = ["Clock", "time_fn", "rotated", "shuffled", "interleaved_rounds", "speedup_ci", "summarize", "verdict"]

K = TypeVar("K", bound=Hashable)


class Clock:
    """Points in time on the device's own timeline: CUDA events on GPU (recorded, not synced), the
    monotonic clock elsewhere. Read pairs with `elapsed_ms` after `sync()`."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda

    def mark(self):
        if self.cuda:
            import torch

            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def sync(self) -> None:
        """Wait for the device; one call per measured step, after all its work (a host sync)."""
        if self.cuda:
            import torch

            torch.cuda.synchronize()

    def elapsed_ms(self, a, b) -> float:
        return a.elapsed_time(b) if self.cuda else (b - a) * 1e3


def time_fn(fn: Callable[[], object], *, cuda: bool, reps: int = 1) -> float:
    """Milliseconds per call of `fn`, over `reps` back-to-back calls, synchronised at both ends."""
    clock = Clock(cuda)
    clock.sync()
    a = clock.mark()
    for _ in range(reps):
        fn()
    b = clock.mark()
    clock.sync()
    return clock.elapsed_ms(a, b) / max(1, reps)


def rotated(items: Sequence[K], k: int) -> list[K]:
    """The order of round `k`: the list rotated by k, so no contender always goes first."""
    items = list(items)
    if not items:
        return []
    k %= len(items)
    return items[k:] + items[:k]


def shuffled(items: Sequence[K], k: int, seed: int) -> list[K]:
    """The order of round `k`: a seeded random permutation. A rotation keeps every contender's
    predecessor fixed (the baseline always ran right after its twin), and what ran just before
    (its cache footprint, the scheduler's view of who slept) biased an A/A pair by ~9% over 61
    rounds on a loaded 2-core host; a fresh permutation per round gives everyone every neighbour."""
    import random

    out = list(items)
    random.Random(seed * 1_000_003 + k).shuffle(out)
    return out


def interleaved_rounds(keys: Sequence[K], run_one: Callable[[K, int], bool], *, rounds: int,
                       budget_s: float | None = None, min_rounds: int = 1,
                       on_round: Callable[[int, int], None] | None = None, charge_dropped: bool = True,
                       clock: Callable[[], float] = time.perf_counter, shuffle_seed: int | None = None,
                       until: Callable[[int], bool] | None = None) -> int:
    """Run `rounds` rounds; in round k call `run_one(key, k)` for every live key in rotated order.

    `run_one` returns False to drop its key (it failed, or was stopped). After `min_rounds`, a
    round is not started when the time spent says the next would overrun `budget_s`. With
    `charge_dropped=False` the budget counts only the keys still live: a configuration dropped
    for being far slower (bf16 on a CPU without bf16 units, 30x the baseline) does not use up the
    rounds of the ones still measured; the wall time then exceeds the budget by what the dropped
    keys took. Returns the number of rounds run. What is measured per round is the caller's
    business: this is only the schedule, the one schedule every benchmark here uses.
    """
    live = list(keys)
    spent: dict[int, float] = {}
    t0 = clock()
    done = 0
    for k in range(rounds):
        if not live:
            break
        if budget_s is not None and done >= min_rounds:
            elapsed = clock() - t0 if charge_dropped else sum(spent.get(id(key), 0.0) for key in live)
            per_round = elapsed / max(1, done)
            if elapsed + per_round > budget_s:
                break
        for key in (shuffled(live, k, shuffle_seed) if shuffle_seed is not None else rotated(live, k)):
            t = clock()
            keep = run_one(key, k)
            spent[id(key)] = spent.get(id(key), 0.0) + clock() - t  # keys need not be hashable
            if not keep:
                live.remove(key)
        done += 1
        if on_round:
            on_round(done, rounds)
        if until is not None and until(done):
            break
    return done


def verdict(ci: tuple[float, float, float] | None) -> str:
    """'faster' / 'slower' only when the whole interval is on one side of 1.0; else 'same'
    (within noise) or 'unknown' (too few samples for an interval)."""
    if ci is None:
        return "unknown"
    _, lo, hi = ci
    if lo > 1.0:
        return "faster"
    if hi < 1.0:
        return "slower"
    return "same"
