"""Run the end-to-end benchmark: every configuration in its own worker process, advanced in
interleaved rounds so machine drift hits all alike, with a time budget and fault isolation."""

from __future__ import annotations

import multiprocessing as mp
import time
from dataclasses import dataclass, field

from overdrive.bench.suites import Candidate, Suite
from overdrive.bench.worker import worker_main
from overdrive.env import EnvReport
from overdrive.recipes import resolve

__all__ = ["ConfigRun", "run_e2e"]


@dataclass
class ConfigRun:
    cand: Candidate
    roles: tuple[str, ...] = ("teacher", "student")
    """What one step trains, timed apart: a teacher and a student (GPT), or one model (recsys)."""
    resolved: dict | None = None
    status: str = "pending"
    """ok | stopped (slower than the budget allows) | failed | oom | crashed | unavailable"""
    reason: str = ""
    setup_s: float | None = None
    first_step_s: float | None = None
    warmup_ms: list[float] = field(default_factory=list)
    ms: dict[str, list[float]] = field(default_factory=dict)
    loss: dict[str, list[float]] = field(default_factory=dict)
    rounds_ms: list[list[float]] = field(default_factory=list)
    """Per round: the combined step times (all roles), for paired comparisons."""
    memory: dict | None = None
    final: dict | None = None
    """What the task reports at the end (e.g. held-out AUC and log-loss for recsys)."""
    conn: object = None
    proc: object = None

    def __post_init__(self) -> None:
        for r in self.roles:
            self.ms.setdefault(r, [])
            self.loss.setdefault(r, [])

    @property
    def live(self) -> bool:
        return self.status == "pending" and self.conn is not None

    def step_ms(self) -> list[float]:
        return [sum(v) for v in zip(*(self.ms[r] for r in self.roles))]


def _record(run: ConfigRun, steps: list[dict], *, timed: bool) -> None:
    for s in steps:
        for r in run.roles:
            run.loss[r].append(s[f"{r}_loss"])
            if timed:
                run.ms[r].append(s[f"{r}_ms"])
        if not timed:
            run.warmup_ms.append(sum(s[f"{r}_ms"] for r in run.roles))


def _call(run: ConfigRun, msg: tuple, timeout: float) -> dict | None:
    """Send a command; on error/crash/timeout mark the run and return None."""
    try:
        run.conn.send(msg)
        if not run.conn.poll(timeout):
            run.status, run.reason = "failed", f"no answer within {timeout:.0f} s (hung)"
            _kill(run)
            return None
        reply = run.conn.recv()
    except (EOFError, BrokenPipeError, ConnectionResetError, OSError):
        code = run.proc.exitcode if run.proc is not None else None
        run.status, run.reason = "crashed", f"worker process died (exit code {code})"
        _kill(run)
        return None
    if "error" in reply:
        run.status = "oom" if reply["kind"] == "oom" else "failed"
        run.reason = reply["error"]
        _kill(run)
        return None
    return reply


def _kill(run: ConfigRun) -> None:
    if run.proc is not None and run.proc.is_alive():
        run.proc.join(timeout=2)
        if run.proc.is_alive():
            run.proc.kill()
    run.conn = None


def run_e2e(suite: Suite, env: EnvReport, *, data: str | None = None, seed: int = 0, threads: int | None = None,
            progress=None, step_timeout: float = 600.0) -> list[ConfigRun]:
    """Set up all configurations, warm them up, then run interleaved timed rounds."""
    ctx = mp.get_context("spawn")  # a fresh interpreter per configuration: no shared allocator or caches
    runs = [ConfigRun(cand=c, roles=suite.roles) for c in suite.candidates]
    base = dict(task=suite.task, teacher=suite.teacher, student=suite.student, batch=suite.batch, seq=suite.seq,
                data_tokens=suite.data_tokens, data=data, seed=seed, lr=suite.lr, threads=threads,
                env_facts=env.facts, options=dict(suite.options))
    for run in runs:
        need = run.cand.options.get("requires_engine")
        if need and not env.engine_ok(need):
            st = env.engine(need)
            run.status, run.reason = "unavailable", f"{need} is {st.status}: {st.reason}" + (
                f" ({st.fix})" if st.fix else "")
            continue
        try:
            run.resolved = resolve(run.cand.recipe, env).to_dict()
        except Exception as e:  # an impossible recipe is a result, not a crash
            run.status, run.reason = "unavailable", str(e)
            continue
        parent, child = ctx.Pipe()
        run.proc = ctx.Process(target=worker_main, args=(child,), daemon=True)
        run.proc.start()
        child.close()  # only the worker holds its end: if it dies, recv() sees EOF at once
        run.conn = parent
        run.conn.send(("setup", dict(base, resolved=run.resolved, lr_scale=run.cand.lr_scale,
                                     fail_at_step=run.cand.fail_at_step, alloc_mb=run.cand.alloc_mb,
                                     cand_options=dict(run.cand.options))))
    total = len(runs) * (2 + suite.rounds)
    task = progress.add_task("bench", total=total) if progress else None

    def tick(desc: str) -> None:
        if progress:
            progress.update(task, advance=1, description=desc)

    for run in runs:  # setups ran concurrently; collect them
        if run.conn is None:
            tick(f"{run.cand.name}: unavailable")
            continue
        try:
            if not run.conn.poll(step_timeout):
                run.status, run.reason = "failed", "setup did not finish"
                _kill(run)
            else:
                reply = run.conn.recv()
                if "error" in reply:
                    run.status, run.reason = ("oom" if reply["kind"] == "oom" else "failed"), reply["error"]
                    _kill(run)
                else:
                    run.setup_s = reply["setup_s"]
        except (EOFError, OSError):
            run.status, run.reason = "crashed", "worker died during setup"
            _kill(run)
        tick(f"set up {run.cand.name}")

    # Warm-up: the first step carries compilation and allocator growth; timed apart.
    base_first = None
    for run in runs:
        if run.live:
            t0 = time.perf_counter()
            reply = _call(run, ("run", 1), step_timeout)
            if reply:
                run.first_step_s = time.perf_counter() - t0
                _record(run, reply["steps"], timed=False)
                if run.cand.baseline:
                    base_first = run.warmup_ms[0]
                elif (base_first and run.cand.recipe.compile == "off"
                      and run.warmup_ms[0] > 5 * suite.slow_factor * base_first):
                    # e.g. bf16 on a CPU without bf16 units (~70x): do not spend minutes warming it up.
                    run.status = "stopped"
                    run.reason = (f"{run.warmup_ms[0] / base_first:.0f}x slower than the baseline on the first "
                                  "step: not measured further")
                    _finish(run)
            if run.live and suite.warmup > 1:
                reply = _call(run, ("run", suite.warmup - 1), step_timeout)
                if reply:
                    _record(run, reply["steps"], timed=False)
        tick(f"warm up {run.cand.name}")

    # Early stop: a recipe far slower than the baseline after warm-up need not run its full measurement.
    baseline = next((r for r in runs if r.cand.baseline), None)
    base_ms = (sum(baseline.warmup_ms[1:]) / max(1, len(baseline.warmup_ms[1:]))) \
        if baseline and baseline.live and len(baseline.warmup_ms) > 1 else None
    if base_ms:
        for run in runs:
            if run.live and not run.cand.baseline and len(run.warmup_ms) > 1:
                ms = sum(run.warmup_ms[1:]) / len(run.warmup_ms[1:])
                if ms > suite.slow_factor * base_ms:
                    run.status = "stopped"
                    run.reason = (f"{ms / base_ms:.1f}x slower than the baseline after {len(run.warmup_ms)} warm-up "
                                  f"steps ({ms:.0f} vs {base_ms:.0f} ms): not measured further")
                    _finish(run)

    # Timed rounds, interleaved; the order rotates each round so no configuration always goes first.
    live = [r for r in runs if r.live]
    est = sum((sum(r.warmup_ms[1:]) / max(1, len(r.warmup_ms[1:]))) if len(r.warmup_ms) > 1 else 0 for r in live)
    rounds = suite.rounds
    if est > 0:
        rounds = max(2, min(rounds, int(suite.budget_s * 1e3 / (est * suite.steps_per_round))))
    for k in range(suite.rounds):
        if k >= rounds:
            tick("budget reached")
            continue
        order = live[k % len(live):] + live[:k % len(live)] if live else []
        for run in order:
            if run.live:
                reply = _call(run, ("run", suite.steps_per_round), step_timeout)
                if reply:
                    _record(run, reply["steps"], timed=True)
                    run.rounds_ms.append([sum(s[f"{r}_ms"] for r in run.roles) for s in reply["steps"]])
        tick(f"round {k + 1}/{rounds}")
    for run in runs:
        if run.live:
            _finish(run)
            if run.status == "pending":
                run.status = "ok"
        tick(f"done {run.cand.name}")
    return runs


def _finish(run: ConfigRun) -> None:
    keep = run.status
    reply = _call(run, ("finish",), 60)
    if reply:
        run.memory = reply["memory"]
        run.final = reply.get("final")
        run.status = keep
    _kill(run)


