"""`overdrive bench`: baseline PyTorch vs the recipes that run here, teacher and student side by side."""

from __future__ import annotations

import datetime as _dt
import time

from overdrive.bench.analysis import analyze
from overdrive.bench.micro import run_micro
from overdrive.bench.results import RESULTS_SCHEMA, git_commit, load_results, save_results, versions
from overdrive.bench.runner import run_e2e
from overdrive.bench.suites import SUITES, Candidate, Suite, default_suite_name, get_suite
from overdrive.env import EnvReport, get_env

__all__ = ["run_bench", "Suite", "Candidate", "SUITES", "get_suite", "default_suite_name", "RESULTS_SCHEMA",
           "load_results", "save_results"]


def run_bench(suite: Suite, *, env: EnvReport | None = None, data: str | None = None, seed: int = 0,
              micro: bool = True, progress=None, threads: int | None = None) -> dict:
    """Run the suite and return the results dict (schema overdrive.bench/1)."""
    env = env or get_env()
    t0 = time.perf_counter()
    runs = run_e2e(suite, env, data=data, seed=seed, threads=threads, progress=progress)
    analysis = analyze(runs, suite, env)
    micro_rows = run_micro(env, suite.micro, progress=progress) if micro else []
    return {
        "schema": RESULTS_SCHEMA,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "git_commit": git_commit(), "versions": versions(), "env": env.to_dict(),
        "device": env.gpus[0].name if env.gpus else f"CPU ({env.platform['cpu'].get('model')})",
        "suite": {k: v for k, v in suite.__dict__.items() if k != "candidates"},
        "data": data or "built-in", "seed": seed,
        "configs": analysis["configs"], "recommendation": analysis["recommendation"], "micro": micro_rows,
        "wall_s": time.perf_counter() - t0,
    }
