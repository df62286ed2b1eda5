"""bench on the measurement core: the A/A twin, threads recorded, no verdict on a too-busy host,
results folders locked and ours, workers that end with their parent."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from fakes import machine
from overdrive.bench import Candidate, Suite, run_bench
from overdrive.env import build_report
from overdrive.errors import UserError
from overdrive.measure.lock import MARKER, claim_results_dir

AVX2 = build_report(machine(None))
B = Candidate.preset("baseline", baseline=True)
TINY = Suite(name="test", teacher="tiny", student="tiny", batch=2, seq=16, warmup=1, rounds=4, steps_per_round=2,
             budget_s=60, parity_steps=8, micro="none", candidates=(B, Candidate.preset("fp32-fused")))


def test_the_baseline_twin_gives_the_noise_floor_and_is_not_a_result():
    res = run_bench(TINY, env=AVX2, micro=False, isolate=False, threads=1)
    names = [c["name"] for c in res["configs"]]
    assert names == ["baseline", "fp32-fused"]  # the twin is the control, not a row
    noise = res["schedule"]["noise"]
    assert noise["aa"] is not None and noise["aa"]["rounds"] == 4 and "A/A" in noise["note"]
    t = res["schedule"]["threads"]
    assert t["threads"] == 1 and t["source"] == "user"
    c = res["configs"][1]
    assert c["verdict"] in ("faster", "slower", "same") and c["rounds"] == 4


def test_a_too_busy_host_recommends_nothing_and_says_why():
    # Every step gets ~200 ms of random extra time (exponential), the baseline's twin's too: the A/A
    # interval is wide, and no difference clears it, so nothing is recommended.
    noisy = {"noise_ms": 200.0}
    res = run_bench(TINY, env=AVX2, micro=False, isolate=False, threads=1,
                    inject={"baseline": noisy, "fp32-fused": noisy})
    rec = res["recommendation"]
    assert res["schedule"]["noise"]["too_busy"], res["schedule"]["noise"]
    assert rec["name"] is None and rec.get("too_busy") and "too busy to judge" in rec["text"]
    assert "A/A" in rec["text"]


def test_results_folders_are_locked_and_ours(tmp_path):
    out = tmp_path / "res"
    with claim_results_dir(str(out)):
        assert (out / MARKER).exists()
        with pytest.raises(UserError, match="in use by another overdrive run"):
            claim_results_dir(str(out))
    claim_results_dir(str(out)).release()  # released: ours again, claimable
    foreign = tmp_path / "theirs"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(UserError, match="did not write"):
        claim_results_dir(str(foreign))
    assert (foreign / "notes.txt").read_text() == "mine" and not (foreign / MARKER).exists()


def test_two_benches_on_one_out_the_second_refused_in_one_line(tmp_path):
    out = tmp_path / "res"
    held = claim_results_dir(str(out))
    try:
        env = dict(os.environ, OMP_NUM_THREADS="1")
        p = subprocess.run([sys.executable, "-m", "overdrive", "bench", "--quick", "--out", str(out)],
                           capture_output=True, text=True, env=env, timeout=120)
    finally:
        held.release()
    assert p.returncode == 2 and "in use by another overdrive run" in p.stderr + p.stdout
    assert len((p.stderr + p.stdout).strip().splitlines()) == 1


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_worker_ends_with_its_parent():
    script = textwrap.dedent("""
        import multiprocessing as mp, os, sys, time
        from overdrive.measure.procs import bound_to_parent
        if __name__ == "__main__":
            ctx = mp.get_context("spawn")
            p = ctx.Process(target=bound_to_parent, args=(time.sleep, os.getpid(), 60), daemon=True)
            p.start()
            print(p.pid, flush=True)
            time.sleep(60)
    """)
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    time.sleep(0.5)  # the child sets its guard first thing
    parent.send_signal(signal.SIGKILL)  # no cleanup at all in the parent: the kernel's guard must act
    parent.wait(timeout=10)
    for _ in range(50):
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        os.kill(child, signal.SIGKILL)
        pytest.fail("the worker outlived its parent")


def test_a_too_busy_verdict_says_re_run_not_keep_the_baseline():
    from overdrive.report.advice import next_step

    noisy = {"noise_ms": 200.0}
    res = run_bench(TINY, env=AVX2, micro=False, isolate=False, threads=1,
                    inject={"baseline": noisy, "fp32-fused": noisy})
    assert res["recommendation"].get("too_busy")
    text = next_step(res).text
    assert "too busy" in text and "keep" not in text


def test_on_a_busy_host_only_a_difference_beyond_the_noise_is_called():
    from overdrive.bench.analysis import recommend

    def cfg(name, speedup, ci, verdict, baseline=False):
        return {"name": name, "label": name, "status": "ok", "safe": True, "emulated": False, "baseline": baseline,
                "speedup": speedup, "speedup_ci": ci, "verdict": verdict, "also": [], "options": {},
                "models": {"teacher": {"loss_delta_pct": 0.1}}, "step_ms": {"median": 10.0, "n": 8}, "rounds": 8}

    noise = {"aa": {"ratio": 1.1, "ci": [0.8, 1.4], "rounds": 8, "spread_pct": 40.0}, "too_busy": True,
             "load_1min": 12.0, "cores": 2}
    sched = {"noise": noise, "rounds_run": 8, "rounds_planned": 8}
    base = cfg("baseline", 1.0, [1.0, 1.0], "baseline", baseline=True)
    within = recommend([base, cfg("amp-bf16", 1.3, [1.05, 1.6], "same")], sched)
    assert within["name"] is None and within["too_busy"] and "too busy to judge" in within["text"]
    beyond = recommend([base, cfg("amp-bf16", 2.0, [1.6, 2.4], "faster")], sched)
    assert beyond["name"] == "amp-bf16" and "busy host" in beyond["text"]


def test_a_noisy_host_measures_on_past_the_planned_rounds_and_says_why_it_stopped():
    """Adaptive rounds: where the A/A floor is too wide at the planned rounds (every step gets ~200 ms
    of random extra time), the bench measures on at the fixed looks (4, 8, 12) instead of stopping at
    4 and saying "too busy", within its wall-time cap; the looks, their level and why the rounds
    stopped are in the results."""
    noisy = {"noise_ms": 200.0}
    suite = dataclasses.replace(TINY, max_rounds=12, max_budget_s=300)
    res = run_bench(suite, env=AVX2, micro=False, isolate=False, threads=1,
                    inject={"baseline": noisy, "fp32-fused": noisy})
    sch = res["schedule"]
    assert sch["looks"] == [4, 8, 12] and sch["level"] == pytest.approx(1 - 0.05 / 3)
    assert sch["rounds_run"] > 4 and sch["stop_reason"], sch
    assert res["schedule"]["noise"]["aa"]["looks"] == 3


def test_without_adaptation_the_schedule_is_the_planned_one():
    res = run_bench(TINY, env=AVX2, micro=False, isolate=False, threads=1)
    sch = res["schedule"]
    assert sch["looks"] == [4] and sch["rounds_run"] == 4 and "last look" in sch["stop_reason"]
