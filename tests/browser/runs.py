"""The real small runs the browser tests render, built once and cached under the temp folder.

Each run is the CLI a user types, made as small as it can be while still real (two rounds, few
configurations, no micro-benchmarks): these tests are about what the page looks like, the bench's
own tests are about its numbers. The cache key is the source that writes results (everything but
report/, which each session re-renders), so a change to the bench re-runs them.

Run as a script for the one workload without a small enough CLI suite:
    python tests/browser/runs.py inference OUT_DIR
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SRC = os.path.join(ROOT, "src", "overdrive")

_QUICK = ["bench", "--quick", "--no-micro", "--rounds", "2"]
# name -> the command after `python -m overdrive` (or a script), always followed by --out DIR.
RUNS: dict[str, list[str]] = {
    # fp32 only: a reduced precision on an AVX2-only CPU costs minutes (the bench still judges its
    # quality over its steps); the compare and emulated-FP8 rows are covered by tests/unit/test_report.py.
    "bench": [*_QUICK, "--configs", "fp32-fused"],
    "bench_b": [*_QUICK, "--configs", "fp32-fused", "--seed", "1"],
    "recsys": ["bench", "--workload", "recsys", *_QUICK[1:], "--configs", "bag+sparse-adam"],
    "inference": ["@script", "inference"],
    "plan": ["plan", "--model", "llama3-1b", "--gpu", "h100-sxm", "--gpus", "8", "--seq", "4096"],
}


def _key() -> str:
    h = hashlib.sha1()
    for dirpath, dirnames, files in os.walk(SRC):  # top-down, so pruning dirnames skips report/
        dirnames[:] = sorted(d for d in dirnames if d not in ("report", "__pycache__"))
        for f in sorted(files):
            if f.endswith((".py", ".json")):
                p = os.path.join(dirpath, f)
                h.update(p[len(SRC):].encode())
                with open(p, "rb") as fh:
                    h.update(fh.read())
    return h.hexdigest()[:16]


def _dir_name(name: str) -> str:
    """A changed command is a different run: the folder name carries a hash of it."""
    return f"{name}-{hashlib.sha1(repr(RUNS[name]).encode()).hexdigest()[:8]}"


def _argv(name: str, out: str) -> list[str]:
    cmd = RUNS[name]
    if cmd[0] == "@script":
        return [sys.executable, os.path.abspath(__file__), *cmd[1:], out]
    return [sys.executable, "-m", "overdrive", *cmd, "--out", out]


def build(names: list[str], timeout: float = 1800) -> dict[str, str]:
    """name -> a folder holding that run's output; runs missing from the cache start together."""
    cache = os.path.join(tempfile.gettempdir(), "overdrive-browser-runs", _key())
    os.makedirs(cache, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "src"), os.environ.get("PYTHONPATH", "")]))
    procs = {}
    for n in names:
        final = os.path.join(cache, _dir_name(n))
        if not os.path.exists(final):
            tmp = tempfile.mkdtemp(prefix=f"{n}.", dir=cache)
            log = open(os.path.join(tmp, "run.log"), "w")
            # Its own process group, so that a timeout can stop the bench's worker processes too.
            procs[n] = (subprocess.Popen(_argv(n, os.path.join(tmp, "out")), stdout=log, stderr=subprocess.STDOUT,
                                         env=env, start_new_session=True), tmp, final, log)
    try:
        for n, (p, tmp, final, log) in procs.items():
            rc = p.wait(timeout=timeout)
            log.close()
            if rc != 0:
                with open(os.path.join(tmp, "run.log")) as f:
                    raise RuntimeError(f"run {n} ({' '.join(RUNS[n])}) failed with {rc}:\n{f.read()[-3000:]}")
            try:
                os.replace(os.path.join(tmp, "out"), final)  # atomic: a concurrent session may have won the race
            except OSError:
                pass
            shutil.rmtree(tmp, ignore_errors=True)
    finally:  # a failure or a timeout leaves no run behind
        for p, *_ in procs.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    return {n: os.path.join(cache, _dir_name(n)) for n in names}


def _inference(out: str) -> None:
    """`bench --workload inference --quick --out OUT` with fewer batch sizes and repetitions."""
    import dataclasses
    import json

    from overdrive.env import get_env
    from overdrive.io import write_atomic
    from overdrive.report.latency_view import write_latency_report
    from overdrive.bench.workloads.inference import LATENCY_SUITES, run_latency

    suite = dataclasses.replace(LATENCY_SUITES["inference-quick"], recsys_batches=(1, 64), prefill_batches=(1,),
                                decode_batches=(1, 8), rounds=2, reps=3)
    r = run_latency(suite, get_env(), slo_ms=10.0, seed=0)
    write_atomic(os.path.join(out, "results.json"), json.dumps(r, indent=1) + "\n")
    write_latency_report(r, out)


if __name__ == "__main__":
    if sys.argv[1] == "inference":
        _inference(sys.argv[2])
    else:
        raise SystemExit(f"unknown run {sys.argv[1]}")
