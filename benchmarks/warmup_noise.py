"""What a shared host's load can fake between two interleaved warm-ups: the A/A slowdown.

Two identical bench workers (the default CPU suite's baseline, fp32, each in its own process, as
`overdrive bench` starts them) take their first step together, then step one at a time in a seeded
shuffled order (bench's interleaved warm-up), while CPU hogs run beside them:
- steady N: N hogs spinning the whole time (a load of about N);
- bursty N: N hogs that spin and idle together, on and off for 0.2-3 s each (the load swings 0 <-> N);
- against N: N hogs that spin exactly while worker B steps and idle while A steps (a load timed against
  one side: the most a load of N can fake between two steps).
For every window of `--window` consecutive rounds (bench's warm-up: 2 interleaved steps each) it keeps
the rule's statistic in both directions, on the wall time and on the CPU time each step took in its
worker (`cpu_ms`): the fastest step of one worker over the slowest of the other
(`overdrive.measure.session.warmup_stop` stops a contender when both are beyond its factors). Identical
workers: whatever this shows is noise, the factor a load can fake.

    python benchmarks/warmup_noise.py --seconds 45 --out benchmarks/results/cpu/DATE-warmup-noise/results.json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import random
import statistics
import threading
import time

from overdrive.bench.runner import _plan
from overdrive.bench.suites import SUITES
from overdrive.bench.task import PROGRAM
from overdrive.env import get_env
from overdrive.measure.launch import Launcher
from overdrive.measure.rounds import shuffled
from overdrive.measure.threads import host_load, plan_threads


def _hog(on, stop) -> None:
    while not stop.is_set():
        if on.is_set():
            t = time.perf_counter()
            while time.perf_counter() - t < 0.02:
                pass
        else:
            time.sleep(0.005)


def _switch(on, stop, bursty: bool, seed: int) -> None:
    rng = random.Random(seed)
    while not stop.is_set():
        on.set()
        if not bursty:
            stop.wait(0.2)
            continue
        stop.wait(rng.uniform(0.2, 3.0))
        on.clear()
        stop.wait(rng.uniform(0.2, 3.0))


def _against(on, name: str) -> None:
    """The load timed against worker B: on while B steps, off while A steps (the hogs react within ms)."""
    if name == "B":
        on.set()
    else:
        on.clear()
    time.sleep(0.05)


def _window_stat(a: list[float], b: list[float], w: int) -> float:
    """The largest fastest-over-slowest ratio, either way, over windows of `w` consecutive rounds."""
    worst = 0.0
    for i in range(len(a) - w + 1):
        aa, bb = a[i:i + w], b[i:i + w]
        worst = max(worst, min(bb) / max(aa), min(aa) / max(bb))
    return worst


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--suite", default="cpu")
    ap.add_argument("--seconds", type=float, default=45.0, help="per load condition")
    ap.add_argument("--conditions", default="none:0,steady:5,steady:20,bursty:10,bursty:20,against:5,against:20")
    ap.add_argument("--threads", type=int, help="torch threads per worker (default: bench's plan, from the load now)")
    ap.add_argument("--window", type=int, default=2)
    ap.add_argument("--out")
    args = ap.parse_args()
    env = get_env()
    suite = SUITES[args.suite]
    suite = suite.with_candidates(tuple(c for c in suite.candidates if c.baseline))
    run = _plan(suite, env, {})[0]
    plan = plan_threads(active=1, own_running=1, user=args.threads)
    base = dict(task=suite.task, teacher=suite.teacher, student=suite.student, batch=suite.batch, seq=suite.seq,
                data_tokens=suite.data_tokens, data=None, seed=0, lr=suite.lr, threads=plan.threads,
                env_facts=env.facts, options=dict(suite.options), parity_steps=10 ** 9, resolved=run.resolved,
                cand_options={}, inject={})
    launcher = Launcher(PROGRAM, plan=plan)
    workers = {n: launcher.start(("setup", dict(base, name=n))) for n in ("A", "B")}
    try:
        for w in workers.values():
            w.receive(600)
        for w in workers.values():  # the first step together, as bench's warm-up takes it
            w.send(("run", 1))
        for w in workers.values():
            w.receive(600)
        out = {"host": platform.node(), "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
               "threads": plan.threads, "suite": suite.name, "window": args.window, "conditions": []}
        k = 0
        for cond in args.conditions.split(","):
            kind, n = cond.split(":")
            stop, on = mp.Event(), mp.Event()
            hogs = [mp.Process(target=_hog, args=(on, stop), daemon=True) for _ in range(int(n))]
            for h in hogs:
                h.start()
            if kind != "against":
                threading.Thread(target=_switch, args=(on, stop, kind == "bursty", k), daemon=True).start()
            ms: dict[str, list[float]] = {"A": [], "B": []}
            cpu: dict[str, list[float]] = {"A": [], "B": []}
            loads = []
            t0 = time.perf_counter()
            try:
                while time.perf_counter() - t0 < args.seconds or len(ms["A"]) < args.window:
                    for name in shuffled(["A", "B"], k, 0):
                        if kind == "against":
                            _against(on, name)
                        s = workers[name].call(("run", 1), 600)["steps"][0]
                        ms[name].append(s["teacher_ms"] + s["student_ms"])
                        cpu[name].append(s["cpu_ms"])
                    loads.append(host_load())
                    k += 1
            finally:
                stop.set()
                for h in hogs:
                    h.join(5)
            a, b = ms["A"], ms["B"]
            single = [max(x / y, y / x) for x, y in zip(a, b)]
            ca, cb = cpu["A"], cpu["B"]
            row = {"condition": cond, "rounds": len(a), "load": [min(loads), max(loads)],
                   "median_ms": [statistics.median(a), statistics.median(b)],
                   "median_cpu_ms": [statistics.median(ca), statistics.median(cb)],
                   "max_single_step_ratio": max(single),
                   "max_window_ratio": _window_stat(a, b, args.window),
                   "max_window_cpu_ratio": _window_stat(ca, cb, args.window),
                   "a_ms": a, "b_ms": b, "a_cpu_ms": ca, "b_cpu_ms": cb}
            out["conditions"].append(row)
            print(f"{cond:>10}: {len(a):3d} rounds, load {min(loads):.1f}-{max(loads):.1f}, median "
                  f"{row['median_ms'][0]:.0f}/{row['median_ms'][1]:.0f} ms, max single-step A/A ratio "
                  f"{row['max_single_step_ratio']:.2f}x, max {args.window}-round fastest/slowest "
                  f"{row['max_window_ratio']:.2f}x (CPU time: median {row['median_cpu_ms'][0]:.0f}/"
                  f"{row['median_cpu_ms'][1]:.0f} ms, max {args.window}-round {row['max_window_cpu_ratio']:.2f}x)",
                  flush=True)
    finally:
        for w in workers.values():
            w.stop(grace_s=0)
    if args.out:
        os.makedirs(os.path.dirname(args.out), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
