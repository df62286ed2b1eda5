"""Run the end-to-end benchmark: every distinct configuration in its own worker process, timed in
the interleaved rounds of the one round driver (`measure.session`, bench's configuration of it) so
machine drift hits all alike.

Two things are kept apart, so the host's load can change the timing but never the verdict on quality:
- timing: every worker set up and warmed up first (no timed step while any worker compiles or warms
  up), then timed rounds that a wall-clock budget may cut (never below `min_rounds`). The round count
  adapts to the measured noise: at the fixed looks of `measure.stats.look_rounds` (`rounds`, twice
  that, ... up to `max_rounds`) the rounds stop when the evidence is in (the A/A floor narrow enough
  to judge and every configuration's verdict against the baseline settled), else go on past `rounds`
  and `budget_s` up to the wall-time cap `max_budget_s`, ending at a look; why they stopped is
  recorded (`Schedule.stop_reason`). A twin of the baseline runs in the same rounds (the A/A
  control); a configuration 5x slower than the baseline in every interleaved warm-up step (wall and CPU
  time) is stopped before the rounds (`measure.session.warmup_stop`), one far slower is stopped at the
  end of a round; an emulated format takes no timed turn (its speed is no result). Threads per worker
  come from the cores, the workers stepping at once and the load (`overdrive.measure.threads`), and
  are recorded;
- quality: every configuration still running trains exactly `parity_steps` steps (untimed top-up
  after the rounds if needed), and is judged on those.
Candidates that resolve to the same effective recipe here are measured once, under both names.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from overdrive.bench.config_run import ConfigRun, Schedule
from overdrive.bench.suites import Suite
from overdrive.bench.task import PROGRAM
from overdrive.env import EnvReport
from overdrive.measure.launch import Failure, Launcher, call_all
from overdrive.measure.rounds import shuffled
from overdrive.measure.session import RoundsConfig, RoundSession, twin_name, warmup_slowdown, warmup_stop
from overdrive.measure.stats import look_rounds
from overdrive.measure.threads import host_load, plan_threads
from overdrive.recipes import ResolvedRecipe, resolve
from overdrive.recipes.labels import effective_key

__all__ = ["ConfigRun", "Schedule", "run_e2e"]


def _record(run: ConfigRun, steps: list[dict], *, kind: str) -> None:
    """kind: warmup (timed apart), timed (samples; the round driver keeps `rounds_ms`), parity (untimed
    top-up: losses only)."""
    for s in steps:
        for r in run.roles:
            run.loss[r].append(s[f"{r}_loss"])
            run.skipped[r].append(bool(s.get(f"{r}_skipped", False)))
            if kind == "timed":
                run.ms[r].append(s[f"{r}_ms"])
        if kind == "warmup":
            run.warmup_ms.append(sum(s[f"{r}_ms"] for r in run.roles))
            run.warmup_cpu_ms.append(s.get("cpu_ms"))


def _failed(run: ConfigRun, f: Failure, *, timeout: str | None = None, crashed: str | None = None) -> None:
    """Mark a run from a call that got no answer: its worker is already stopped."""
    if f.kind == "crashed":
        run.status, run.reason = "crashed", crashed or f.reason
    elif f.kind == "timeout":
        run.status, run.reason = "failed", timeout or f.reason
    else:  # the worker's own report: user | oom | backend
        run.status, run.reason = ("oom" if f.kind == "oom" else "failed"), f.reason
    _kill(run)


def _call(run: ConfigRun, msg: tuple, timeout: float) -> dict | None:
    """Send a command; on error/crash/timeout mark the run and return None."""
    return _call_all([run], lambda r: msg, timeout)[0]


def _call_all(runs: list[ConfigRun], msg_of, timeout: float) -> list[dict | None]:
    """`_call` on several workers at once: send every command first, then collect the replies."""
    out = []
    for run, reply in zip(runs, call_all([r.worker for r in runs], [msg_of(r) for r in runs], timeout)):
        if isinstance(reply, Failure):
            _failed(run, reply)
            reply = None
        out.append(reply)
    return out


def _slowdown(run: ConfigRun, baseline: ConfigRun | None) -> float | None:
    """median step time / the baseline's, over the timed rounds (None without both)."""
    if baseline is None or run is baseline:
        return None
    b, c = baseline.step_ms(), run.step_ms()
    if not b or not c:
        return None
    b, c = sorted(b), sorted(c)
    return c[len(c) // 2] / max(1e-9, b[len(b) // 2])


def _kill(run: ConfigRun) -> None:
    if run.worker is not None:
        run.worker.stop()


def _plan(suite: Suite, env: EnvReport, inject: dict) -> list[ConfigRun]:
    """Resolve every candidate; merge those that run the same thing here (the one without a
    fallback, or the baseline, gives the row its name)."""
    groups: dict[str, list[tuple[ConfigRun, ResolvedRecipe | None]]] = {}
    order: list[str] = []
    for c in suite.candidates:
        run = ConfigRun(cand=c, roles=suite.roles)
        need = c.options.get("requires_engine")
        res = None
        if need and not env.engine_ok(need):
            st = env.engine(need)
            run.status, run.reason = "unavailable", f"{need} is {st.status}: {st.reason}" + (
                f" ({st.fix})" if st.fix else "")
        else:
            try:
                res = resolve(c.recipe, env)
            except Exception as e:  # an impossible recipe is a result, not a crash
                run.status, run.reason = "unavailable", str(e)
        if res is not None:
            run.cand = dataclasses.replace(c, resolved=res)  # resolved once, here in the parent
            run.resolved = res.to_dict()
            run.label = run.cand.ran(env)
            key = effective_key(res, c.options, inject.get(c.name))
        else:
            key = f"unavailable:{c.name}"
        if key not in groups:
            order.append(key)
        groups.setdefault(key, []).append((run, res))
    runs = []
    for key in order:
        members = groups[key]
        head = next((m for m in members if m[0].cand.baseline), None) or \
            next((m for m in members if m[1] is not None and not m[1].fallbacks), members[0])
        run = head[0]
        run.also = [{"name": m[0].cand.name, "label": m[0].label} for m in members if m is not head]
        runs.append(run)
    return runs


def run_e2e(suite: Suite, env: EnvReport, *, data: str | None = None, seed: int = 0, threads: int | None = None,
            progress=None, step_timeout: float = 600.0, inject: dict | None = None,
            isolate: bool = True, on_look=None) -> tuple[list[ConfigRun], Schedule]:
    """Set up all distinct configurations, warm them up, run the timed rounds, top up to the parity
    step. `on_look(runs, schedule, rounds)` is called at every look (the runs so far, the A/A twin
    among them). `inject` (tests only): candidate name -> faults/settings its worker applies
    (fail_at_step, lr_scale, alloc_mb, slow, noise_ms). `isolate=False` runs the workers in this
    process, one after the other (tests; no per-process memory)."""
    runs: list[ConfigRun] = []
    try:
        return _run_e2e(runs, suite, env, data=data, seed=seed, threads=threads, progress=progress,
                        step_timeout=step_timeout, inject=inject or {}, isolate=isolate, on_look=on_look)
    finally:  # SIGTERM (SystemExit), Ctrl-C or a crash here: no worker outlives the bench
        for run in runs:  # every worker still alive here is killed at once, then reaped
            if run.worker is not None:
                run.worker.stop(grace_s=0)


def _twin_of(baseline: ConfigRun | None) -> ConfigRun | None:
    if baseline is None or baseline.status != "pending":
        return None
    cand = dataclasses.replace(baseline.cand, name=twin_name(baseline.cand.name), baseline=False)
    return ConfigRun(cand=cand, roles=baseline.roles, resolved=baseline.resolved, label=cand.name, twin=True)


def _run_e2e(runs: list[ConfigRun], suite: Suite, env: EnvReport, *, data, seed, threads, progress, step_timeout,
             inject, isolate, on_look) -> tuple[list[ConfigRun], Schedule]:
    runs.extend(_plan(suite, env, inject))
    sched = Schedule(rounds_planned=suite.rounds, budget_s=suite.budget_s, parity_steps=suite.parity_steps)
    baseline = next((r for r in runs if r.cand.baseline), None)
    twin = sched.twin = _twin_of(baseline)
    # Timed rounds step one worker at a time; the load counts the other tenants (and our parent).
    plan = sched.threads = plan_threads(active=1, user=threads, own_running=1)
    base = dict(task=suite.task, teacher=suite.teacher, student=suite.student, batch=suite.batch, seq=suite.seq,
                data_tokens=suite.data_tokens, data=data, seed=seed, lr=suite.lr, threads=plan.threads,
                env_facts=env.facts, options=dict(suite.options), parity_steps=suite.parity_steps)
    # Spawned: a fresh interpreter per configuration, no shared allocator or caches.
    launcher = Launcher(PROGRAM, plan=plan, isolate=isolate)
    for run in runs + ([twin] if twin else []):
        if run.status == "pending":
            name = baseline.cand.name if run.twin else run.cand.name
            run.worker = launcher.start(("setup", dict(base, name=run.cand.name, resolved=run.resolved,
                                                       cand_options=dict(run.cand.options),
                                                       inject=dict(inject.get(name) or {}))))
    if twin:
        runs.append(twin)  # in the schedule like any other; taken out again before the results
    tick = _ticker(progress, len(runs) * 3 + suite.rounds)
    _collect_setups(runs, step_timeout, tick)
    _warm_up(runs, baseline, suite, step_timeout, tick, seed=seed)
    _timed(runs, baseline, twin, suite, sched, seed=seed, step_timeout=step_timeout, tick=tick, on_look=on_look)
    if twin is not None:  # the A/A control has done its work: no parity top-up, not a result
        runs.remove(twin)
        if twin.live:
            _finish(twin)
            twin.status = "ok" if twin.status == "pending" else twin.status
    _parity(runs, baseline, suite, step_timeout, tick)
    for run in runs:
        if run.live:
            _finish(run)
            if run.status == "pending":
                run.status = "ok"
        if not isolate:
            run.memory = None  # one shared process: its peak is nobody's own
    return runs, sched


def _ticker(progress, total: int) -> Callable[[str], None]:
    task = progress.add_task("bench", total=total) if progress else None

    def tick(desc: str) -> None:
        if progress:
            progress.update(task, advance=1, description=desc)
    return tick


def _collect_setups(runs: list[ConfigRun], step_timeout: float, tick) -> None:
    """The setups ran concurrently; collect them."""
    for run in runs:
        if run.worker is not None:
            reply = run.worker.receive(step_timeout)
            if isinstance(reply, Failure):
                _failed(run, reply, timeout="setup did not finish", crashed="worker died during setup")
            else:
                run.setup_s = reply["setup_s"]
                run.applied = reply.get("applied")
        tick(f"set up {run.cand.name}")


def _warm_up(runs: list[ConfigRun], baseline: ConfigRun | None, suite: Suite, step_timeout: float, tick, *,
             seed: int) -> None:
    """The first step carries compilation and allocator growth: timed apart, never judged. Every worker
    takes it at once (their compiles overlap, as their setups did: one after another, two cold compiles
    of a GPT cost minutes). The other warm-up steps are taken one worker at a time, in interleaved
    rounds of one step each (seeded shuffled order, as the timed rounds), so a contender's warm-up steps
    sit beside the baseline's: one `warmup_stop` finds far slower (`measure.session`) is stopped here,
    before any timed round. No timed round starts until all are done."""
    live = [r for r in runs if r.live]
    for run, reply in zip(live, _call_all(live, lambda r: ("run", 1), step_timeout)):
        if reply:
            run.first_step_s = sum(reply["steps"][0][f"{r}_ms"] for r in run.roles) / 1e3
            _record(run, reply["steps"], kind="warmup")
    for k in range(suite.warmup - 1):
        for run in shuffled([r for r in runs if r.live], k, seed):
            reply = _call(run, ("run", 1), step_timeout)
            if reply:
                _record(run, reply["steps"], kind="warmup")
    if baseline is not None and baseline.live:
        refs = [r for r in runs if r is baseline or r.twin]
        ref, ref_cpu = [x for r in refs for x in r.warmup_ms[1:]], [x for r in refs for x in r.warmup_cpu_ms[1:]]
        name = f"the baseline ({(baseline.resolved or {}).get('precision', baseline.label)})"
        for run in runs:
            why = None if (run is baseline or run.twin or run.emulated or not run.live) else \
                warmup_stop(ref, run.warmup_ms[1:], base_cpu_ms=ref_cpu, run_cpu_ms=run.warmup_cpu_ms[1:],
                            base_name=name)
            if why:
                run.stopped_at = "warm-up"
                run.warmup_slowdown = warmup_slowdown(ref, run.warmup_ms[1:])
                _stop_slow(run, why)
    for run in runs:
        tick(f"warm up {run.cand.name}")


def _timed(runs: list[ConfigRun], baseline: ConfigRun | None, twin: ConfigRun | None, suite: Suite,
           sched: Schedule, *, seed: int, step_timeout: float, tick, on_look) -> None:
    """The timed rounds: bench's configuration of the one round driver (`measure.session`). The first
    look at the planned rounds (a quiet host runs what it always did; a noisy one measures on), every
    configuration judged against the baseline, the rounds ending at a look within the wall-time cap."""
    last = sched.rounds_planned = max(suite.rounds, suite.max_rounds or 0)
    sched.looks = look_rounds(max(suite.min_rounds, suite.rounds), last)
    cap = sched.wall_cap_s = max(suite.budget_s, suite.max_budget_s or 0.0)
    cfg = RoundsConfig(looks=tuple(sched.looks), max_rounds=last, max_s=cap, min_rounds=suite.min_rounds,
                       stop_at_look=True, slow_factor=suite.slow_factor, settle="each", seed=seed,
                       bound_text=f"the wall-time cap ({cap:g} s)")
    t_rounds = time.perf_counter()

    def turn(run: ConfigRun, k: int) -> list[float] | None:
        t = time.perf_counter() - t_rounds
        reply = _call(run, ("run", suite.steps_per_round), step_timeout)
        if not reply:
            return None
        _record(run, reply["steps"], kind="timed")
        run.round_t.append(t)
        return [sum(s[f"{r}_ms"] for r in run.roles) for s in reply["steps"]]

    def look(done: int) -> None:
        if on_look is not None:
            sched.rounds_run = done
            on_look(runs, sched, done)

    sched.load.append(host_load())
    session = RoundSession(baseline=baseline, twin=twin, contenders=runs, turn=turn, stop=_stop_slow, config=cfg,
                           on_round=lambda done: tick(f"round {done}/{last}"), on_look=look)
    sched.rounds_run = session.run()
    sched.stop_reason = session.stop_reason
    sched.cut_by_budget = sched.rounds_run < suite.rounds and any(r.live for r in runs)
    sched.load.append(host_load())


def _parity(runs: list[ConfigRun], baseline: ConfigRun | None, suite: Suite, step_timeout: float, tick) -> None:
    """Quality: every configuration still running completes the same number of steps, all at once
    (untimed, so they may share the cores). One far slower than the baseline over the timed rounds
    (median ratio above slow_factor, e.g. bf16 on a CPU without bf16 units) is not topped up: its
    quality is "not assessed" with the reason, never judged from fewer steps. An emulated format
    (FP8/MXFP8/NVFP4 without its hardware) took no timed turn: it runs all its parity steps here, for
    its quality alone."""
    need = [r for r in runs if r.live and r.steps < suite.parity_steps]
    for run in need:
        ratio = _slowdown(run, baseline)
        if ratio is not None and ratio > suite.slow_factor and not run.emulated:
            run.parity_skipped = (f"quality not assessed: {ratio:.1f}x slower than the baseline here, so its "
                                  f"{suite.parity_steps - run.steps} remaining parity steps were not run")
    topped = [r for r in need if not r.parity_skipped]
    for run, reply in zip(topped, _call_all(topped, lambda r: ("run", suite.parity_steps - r.steps),
                                            step_timeout * 4)):
        if reply:
            _record(run, reply["steps"], kind="parity")
    for run in runs:
        tick(f"parity {run.cand.name}")


def _stop_slow(run: ConfigRun, why: str) -> None:
    """Stopped for slowness (`measure.session.slow_stop` after a round, `warmup_stop` after the warm-up):
    not measured further, quality not assessed."""
    run.stopped_at = run.stopped_at or "rounds"
    run.status, run.reason = "stopped", f"{why}; quality not assessed"
    if run.worker is not None:
        _finish(run)


def _finish(run: ConfigRun) -> None:
    keep = run.status
    reply = _call(run, ("finish",), 60)
    if reply:
        run.memory = reply["memory"]
        run.final = reply.get("final")
        run.status = keep
    _kill(run)
