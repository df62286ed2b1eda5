"""`overdrive bench`: baseline PyTorch vs the recipes that run here, per workload.

Importing this package is light (no torch): the CLI reads the workloads registry and suite names
while parsing; the runner, analysis and micro-benchmarks load when a run starts.
"""

from __future__ import annotations

import time

from overdrive.bench.suites import SUITES, Candidate, Suite, candidates_from_names
from overdrive.bench.workloads import WORKLOADS, default_suite_name, get_suite
from overdrive.results import BENCH_SCHEMA as RESULTS_SCHEMA
from overdrive.results import load_results, save_results

__all__ = ["run_bench", "Suite", "Candidate", "SUITES", "WORKLOADS", "get_suite", "default_suite_name", "candidates_from_names",
           "RESULTS_SCHEMA", "load_results", "save_results"]


def run_bench(suite: Suite, *, env=None, data: str | None = None, seed: int = 0, micro: bool = True, progress=None,
              threads: int | None = None, inject: dict | None = None, isolate: bool = True,
              on_partial=None) -> dict:
    """Run the suite and return the results dict (schema overdrive.bench/1). `on_partial(results)`, when
    given, gets the results so far at every look of the timed rounds (marked `partial`), so a bench that
    is killed later still leaves what it measured. `inject` and `isolate=False` are for tests (see
    `runner.run_e2e`)."""
    from overdrive.bench.analysis import analyze
    from overdrive.bench.micro import run_micro
    from overdrive.bench.provenance import header
    from overdrive.bench.runner import run_e2e
    from overdrive.env import get_env

    env = env or get_env()
    t0 = time.perf_counter()

    def results(analysis: dict, micro_rows: list) -> dict:
        return {
            **header(RESULTS_SCHEMA, env),
            "suite": {k: v for k, v in suite.__dict__.items() if k != "candidates"},
            "data": data or "built-in", "seed": seed, "schedule": analysis["schedule"],
            "configs": analysis["configs"], "recommendation": analysis["recommendation"], "micro": micro_rows,
            "wall_s": time.perf_counter() - t0,
        }

    def at_look(runs, sched, done: int) -> None:
        doc = results(analyze([r for r in runs if not r.twin], suite, env, sched), [])
        doc["partial"] = {"rounds": done, "note": f"written after {done} timed rounds while the bench ran: "
                                                  "no configuration's quality was judged yet; the finished "
                                                  "bench replaces this file"}
        doc["recommendation"] = {"name": None, "label": None, "speedup": None, "speedup_ci": None, "apply": None,
                                 "evidence": False, "text": f"partial results after {done} timed rounds: no "
                                                            "verdict until the bench finishes"}
        on_partial(doc)

    runs, sched = run_e2e(suite, env, data=data, seed=seed, threads=threads, progress=progress, inject=inject,
                          isolate=isolate, on_look=at_look if on_partial else None)
    analysis = analyze(runs, suite, env, sched)
    micro_rows = run_micro(env, suite.micro, progress=progress) if micro else []
    return results(analysis, micro_rows)
