"""The bench says what ran and recommends only with evidence; its quality verdict does not move
with the host's load. Load is simulated by injected slow/noisy step times and cut rounds."""

import dataclasses

import pytest

from fakes import TORCHAO_EMU, machine
from overdrive.bench import Candidate, Suite, candidates_from_names, get_suite, run_bench
from overdrive.bench.analysis import recommend
from overdrive.bench.runner import ConfigRun, _plan, _stop_slow
from overdrive.bench.suites import SUITES
from overdrive.bench.workloads.gpt import loss_parity
from overdrive.env import build_report
from overdrive.measure.session import floor_of, slow_stop
from overdrive.recipes import get_recipe

AVX2 = build_report(machine(None))  # no torchao, bf16 ~70x slower than fp32: best precision fp32
AMX = build_report(machine(None, cpu_rates={"fp32": 100.0, "bf16": 300.0}))  # bf16 is the best here
EMU = build_report(machine(None, torchao=TORCHAO_EMU))
TINY = Suite(name="test", teacher="tiny", student="tiny", batch=4, seq=32, warmup=1, rounds=4, steps_per_round=2,
             budget_s=300, parity_steps=8, micro="none", lr=3e-3, data_tokens=1 << 14)
B = Candidate.preset("baseline", baseline=True)


def _too_slow(run, base, twin, suite) -> bool:
    """Bench's early stop: the round driver's rule (`slow_stop`), then bench marks the run stopped."""
    why = slow_stop(base, run, floor_of(base, twin), suite.slow_factor)
    if why:
        _stop_slow(run, why)
    return why is not None


def _by(rows, name):
    return next(r for r in rows if r.cand.name == name)


def test_fallback_is_labelled_with_what_ran_and_measured_once():
    cands = tuple(Candidate.preset(n, baseline=n == "baseline") for n in ("baseline", "amp-bf16", "fp8"))
    runs = _plan(TINY.with_candidates(cands), AMX, {})
    assert [r.cand.name for r in runs] == ["baseline", "amp-bf16"]  # fp8 ran as bf16: one measurement
    bf16 = _by(runs, "amp-bf16")
    assert bf16.label == "amp-bf16"
    assert bf16.also == [{"name": "fp8", "label": "fp8 → bf16 (fallback: no FP8 GPU, torchao missing)"}]


def test_fallback_without_a_twin_keeps_its_label():
    runs = _plan(TINY.with_candidates((B, Candidate.preset("fp8"))), AMX, {})
    assert _by(runs, "fp8").label == "fp8 → bf16 (fallback: no FP8 GPU, torchao missing)"
    runs = _plan(TINY.with_candidates((B, Candidate.preset("fp8"))), EMU, {})
    assert _by(runs, "fp8").label == "fp8 → fp8 emulated (fallback: no FP8 GPU)"


def test_same_recipe_under_two_names_is_one_row_on_avx2():
    cands = tuple(Candidate.preset(n, baseline=n == "baseline") for n in ("baseline", "fp32-fused", "fp32", "fp8"))
    runs = _plan(TINY.with_candidates(cands), AVX2, {})
    assert [r.cand.name for r in runs] == ["baseline", "fp32-fused"]
    assert [a["name"] for a in _by(runs, "fp32-fused").also] == ["fp32", "fp8"]
    assert _by(runs, "fp32-fused").also[1]["label"].startswith("fp8 → fp32 (fallback:")


def test_every_bench_name_is_a_recipe_accelerate_and_train_accept():
    for suite in SUITES.values():
        for c in suite.candidates:
            assert get_recipe(c.name).name == c.name
            assert get_recipe(c.name) == c.recipe


def test_configs_take_any_registered_recipe_name():
    cands = candidates_from_names(get_suite("cpu-quick"), ["fp8-rowwise", "bf16", "fp32-fused"])
    assert [c.name for c in cands] == ["baseline", "fp8-rowwise", "amp-bf16", "fp32-fused"]
    with pytest.raises(ValueError, match="unknown recipe 'fp9'"):
        candidates_from_names(get_suite("cpu-quick"), ["fp9"])
    with pytest.raises(ValueError, match="choose from"):
        candidates_from_names(get_suite("recsys-quick"), ["fp8"])


def _run(samples: list[float], name="x", per_round: int = 2) -> ConfigRun:
    run = ConfigRun(cand=Candidate.preset("fp32-fused") if name != "baseline" else B, roles=("m",))
    run.ms["m"] = list(samples)
    run.rounds_ms = [list(samples[k:k + per_round]) for k in range(0, len(samples), per_round)]
    run.status = "pending"
    return run


def test_early_stop_needs_three_rounds_of_evidence():
    base = _run([10.0] * 8, "baseline")
    # 20x slower in two rounds (two moments): no stop, however clear.
    assert not _too_slow(_run([200.0] * 4), base, None, TINY)
    # Clearly and consistently slower over 3 rounds: stopped, with the interval in the reason.
    slow = _run([200.0, 210.0, 190.0, 205.0, 195.0, 200.0])
    assert _too_slow(slow, base, None, TINY) and slow.status == "stopped" and "interval" in slow.reason
    assert "3 paired rounds" in slow.reason
    # One slow round among fast ones: the interval reaches above 1/3, never stopped.
    noisy = _run([200.0, 210.0, 9.0, 11.0, 195.0, 190.0, 10.0, 10.0])
    assert not _too_slow(noisy, base, None, TINY) and noisy.status == "pending"


def test_a_stopped_configuration_reports_the_interval_it_was_stopped_on():
    """The reason's interval lies wholly below 1/slow_factor, so it never includes 1.0."""
    import re

    base = _run([10.0] * 8, "baseline")
    slow = _run([40.0, 45.0, 35.0, 60.0, 38.0, 42.0])
    assert _too_slow(slow, base, None, TINY)
    lo, hi = map(float, re.search(r"interval \[([0-9.]+)–([0-9.]+)\]", slow.reason).groups())
    assert hi < 1 / TINY.slow_factor and lo <= hi < 1.0


def test_a_skipped_fp16_step_is_aligned_not_a_loss_gap():
    # A falling curve; the candidate skipped its step 3 (GradScaler), so it lags one update behind.
    base = [5.0 - 0.3 * i for i in range(16)]
    cand = base[:4] + [base[3]] + base[4:15]
    skipped = [False] * 16
    skipped[3] = True
    naive = loss_parity(cand, [False] * 16, base, [False] * 16, steps=16, precision="fp16")
    aligned = loss_parity(cand, skipped, base, [False] * 16, steps=16, precision="fp16")
    assert naive["unsafe_reason"]  # lagging one step on a falling curve looks like +15%
    assert aligned["unsafe_reason"] is None and abs(aligned["loss_delta_pct"]) < 1e-9
    assert aligned["skipped_steps"] == 1


def test_parity_uses_the_tail_not_one_point_and_needs_all_steps():
    base = [3.0] * 12
    spike = [3.0] * 11 + [3.3]  # one noisy last point: +10% alone, +2.5% over the 3-point tail... of 12/4
    r = loss_parity(spike, [False] * 12, base, [False] * 12, steps=12, precision="bf16")
    assert r["tail_steps"] == 3 and r["loss_delta_pct"] == pytest.approx(10 / 3)
    short = loss_parity(base[:5], [False] * 5, base, [False] * 12, steps=12, precision="bf16")
    assert not short["assessed"] and short["loss_delta_pct"] is None


def _cfg(name, speedup, ci, *, safe=True, status="ok", baseline=False):
    return {"name": name, "label": name, "also": [], "baseline": baseline, "status": status, "safe": safe,
            "emulated": False, "speedup": speedup, "speedup_ci": ci, "options": {},
            "step_ms": {"median": 10.0, "p10": 6.0, "p90": 16.0, "n": 6},
            "models": {"teacher": {"loss_delta_pct": 0.1}}}


def test_recommendation_needs_the_whole_interval_above_one():
    base = _cfg("baseline", 1.0, [1.0, 1.0], baseline=True)
    sched = {"rounds_planned": 4, "rounds_run": 2, "cut_by_budget": True}
    rec = recommend([base, _cfg("fp32-fused", 9.93, [0.35, 12.45])], sched)
    assert rec["name"] is None and rec["evidence"] is False
    assert "no recipe was measurably faster" in rec["text"] and "budget cut the timed rounds to 2 of 4" in rec["text"]
    assert "noisy host" in rec["text"]
    rec = recommend([base, _cfg("fp32-fused", 1.3, [1.1, 1.5]), _cfg("amp-bf16", 2.0, [0.9, 3.0])], sched)
    assert rec["name"] == "fp32-fused" and rec["evidence"]
    assert 'accelerate(model, recipe="fp32-fused")' in rec["text"] and 'train.recipe = "fp32-fused"' in rec["text"]
    # Not assessed (e.g. stopped) or unsafe: never recommended, however fast.
    rec = recommend([base, _cfg("amp-bf16", 3.0, [2.0, 4.0], safe=None)], sched)
    assert rec["name"] is None


def test_quality_verdict_does_not_move_with_load():
    cands = (B, Candidate.preset("fp32-fused"),
             dataclasses.replace(Candidate.preset("fp32-fused"), name="diverging"))
    suite = dataclasses.replace(TINY, batch=2, seq=16, rounds=4, parity_steps=8).with_candidates(cands)
    quiet = run_bench(suite, env=EMU, micro=False, isolate=False, threads=1, inject={"diverging": {"lr_scale": 300.0}})
    # A busy host: every step reported 5x slower plus exponential noise, and a budget that lets only
    # the minimum rounds run.
    load = {"slow": 5.0, "noise_ms": 50.0}
    busy = run_bench(dataclasses.replace(suite, budget_s=0.0), env=EMU, micro=False, isolate=False, threads=1,
                     inject={"baseline": load, "fp32-fused": load, "diverging": dict(load, lr_scale=300.0)})
    assert busy["schedule"]["rounds_run"] < quiet["schedule"]["rounds_run"]
    for q, b in zip(quiet["configs"], busy["configs"]):
        assert q["name"] == b["name"] and q["label"] == b["label"]
        assert (q["safe"], q["unsafe_reason"]) == (b["safe"], b["unsafe_reason"])
        assert q["loss_delta_pct"] == b["loss_delta_pct"]
    by = {c["name"]: c for c in busy["configs"]}
    assert by["fp32-fused"]["safe"] is True and by["diverging"]["safe"] is False
    rec = busy["recommendation"]
    assert rec["name"] is None or next(c for c in busy["configs"] if c["name"] == rec["name"])["speedup_ci"][0] > 1.0


def test_a_stopped_candidate_is_never_called_safe():
    cands = (B, Candidate.preset("fp32-fused"))
    suite = dataclasses.replace(TINY, rounds=3, slow_factor=1.5)
    res = run_bench(suite.with_candidates(cands), env=AVX2, micro=False, isolate=False, threads=1,
                    inject={"fp32-fused": {"slow": 50.0}})
    c = next(c for c in res["configs"] if c["name"] == "fp32-fused")
    assert c["status"] == "stopped" and "interval" in c["reason"]
    assert c["safe"] is None and c["loss_delta_pct"] is None
    assert all(m["loss_delta_pct"] is None for m in c["models"].values())


def test_doctor_matmul_rate_is_the_best_warm_sample_not_a_loaded_median():
    from overdrive.env.probing import _best_rates

    # A fake clock: each call costs 1 ms quiet, but most calls land on a loaded host (40x slower).
    now = [0.0]
    loaded = iter([True, True, False, True, True, True, False] * 40)

    def clock():
        return now[0]

    def call():
        now[0] += 1e-3 * (40 if next(loaded) else 1)

    rates = _best_rates({"fp32": call}, 2e6, rounds=5, min_s=1e-3, clock=clock)
    assert rates["fp32"] == 2.0  # 2 MFLOP per quiet 1 ms call: the quiet rate, though most samples were slow


def test_compare_never_puts_two_different_fallbacks_in_one_row():
    from rich.console import Console

    from overdrive.report.tables import render_compare

    def res(label):
        m = {"step_ms": {"median": 10.0, "p10": 9.0, "p90": 11.0}, "final_loss": 2.0}
        return {"device": "CPU", "created": "now", "recommendation": {"text": "-"},
                "configs": [{"name": "fp8", "label": label, "models": {"teacher": m}}]}

    con = Console(record=True, width=200)
    render_compare(res("fp8 → bf16 (fallback: no FP8 GPU, torchao missing)"),
                   res("fp8 → fp8 emulated (fallback: no FP8 GPU)"), con)
    out = con.export_text()
    assert "absent" in out and "fp8 → bf16" in out


def test_a_far_slower_candidate_is_not_topped_up_and_says_why():
    # Too few timed rounds for the early stop (2 < 3), but its median is 10x the baseline's: its
    # parity steps would cost 10x the baseline's (bf16 on an AVX2 CPU took 25 minutes this way), so it
    # is not topped up, and its quality is "not assessed" with the reason, never judged from 3 steps.
    cands = (B, Candidate.preset("fp32-fused"))
    suite = dataclasses.replace(TINY, rounds=2, steps_per_round=1, parity_steps=8)
    res = run_bench(suite.with_candidates(cands), env=AVX2, micro=False, isolate=False, threads=1,
                    inject={"fp32-fused": {"slow": 10.0}})
    c = next(c for c in res["configs"] if c["name"] == "fp32-fused")
    assert c["status"] == "ok" and c["safe"] is None and c["loss_delta_pct"] is None
    assert "slower than the baseline here" in c["not_assessed_reason"]
    base = next(c for c in res["configs"] if c["name"] == "baseline")
    assert base["status"] == "ok"


def test_an_emulated_format_is_judged_on_quality_however_slow():
    # Emulated FP8/MXFP8/NVFP4 exist for their quality column: slowness neither stops them early nor
    # skips their parity steps (nvfp4 emulated was 3.1x slower on a CPU and lost its quality column).
    cands = (B, Candidate.preset("nvfp4"))
    suite = dataclasses.replace(TINY, rounds=3, steps_per_round=2, parity_steps=8, slow_factor=1.5)
    res = run_bench(suite.with_candidates(cands), env=EMU, micro=False, isolate=False, threads=1,
                    inject={"nvfp4": {"slow": 10.0}})
    c = next(c for c in res["configs"] if c["name"] == "nvfp4")
    assert c["emulated"] and c["status"] == "ok" and not c.get("not_assessed_reason")
    assert c["loss_delta_pct"] is not None and c["safe"] is not None and c["speedup"] is None
    emu = _run([200.0] * 8)
    emu.resolved = {"emulated": True}
    assert not _too_slow(emu, _run([10.0] * 8, "baseline"), None, TINY) and emu.status == "pending"


@pytest.mark.parametrize("fmt", ["mxfp8", "nvfp4"])
def test_an_emulated_block_format_is_labelled_with_its_own_name(fmt):
    from overdrive.report.tables import emulated_note

    run = _by(_plan(TINY.with_candidates((B, Candidate.preset(fmt))), EMU, {}), fmt)
    assert run.label == f"{fmt} → {fmt} emulated (fallback: no SM 10.x GPU)"
    note = emulated_note({"name": fmt, "resolved": run.resolved})
    assert f"{fmt.upper()} is emulated here" in note and "SM 10.x" in note
