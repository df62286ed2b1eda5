"""The bench machinery: FLOPs, statistics, per-process memory, failures, unsafe recipes."""

import dataclasses
import math

import numpy as np
import pytest

from fakes import TORCHAO_EMU, machine
from overdrive.bench import Candidate, Suite, run_bench
from overdrive.bench.analysis import loss_tolerance
from overdrive.data import DataError, TokenData, builtin_tokens, file_tokens
from overdrive.bench.flops import flops_per_token, mfu
from overdrive.measure.stats import speedup_ci, summarize
from overdrive.env import build_report
from overdrive.models import GPT, gpt_config
from overdrive.recipes import Recipe

CPU = build_report(machine(None, torchao=TORCHAO_EMU))


def test_flops_against_hand_count():
    # tiny: d=64, L=2, H=2, V=256, bias, LayerNorm, tied head.
    # per block: qkv 64*192+192 + proj 64*64+64 = 16,640; mlp 64*256+256 + 256*64+64 = 33,088; 2 norms 256
    # → 49,984; 2 blocks 99,968; final norm 128; head 256*64 = 16,384 → 116,480 non-embedding parameters.
    cfg = gpt_config("tiny")
    assert cfg.n_params() == 116_480 == GPT(cfg).num_params()
    # 6N + 12·L·H·Q·T at T=64: 698,880 + 12*2*2*32*64 = 698,880 + 98,304
    assert flops_per_token(116_480, 2, 2, 32, 64) == 797_184
    # MFU: 1e6 tokens/s x 797,184 FLOPs = 0.797 TFLOP/s of a 989 TFLOP/s peak
    assert mfu(1e6, 797_184, 989.0) == pytest.approx(0.797184 / 989.0)
    assert mfu(1e6, 797_184, None) is None


def test_flops_gpt2_124m_matches_published_count():
    # GPT-2 small (untied count as nanoGPT reports it: 124M total, 85M non-embedding blocks).
    cfg = gpt_config("gpt-125m", vocab_size=50257, block_size=1024)
    blocks = cfg.n_params() - cfg.vocab_size * cfg.n_embd
    assert round(blocks / 1e6) == 85
    assert round(cfg.n_params(non_embedding=False) / 1e6) == 124


def test_summary_statistics():
    s = summarize([float(x) for x in range(1, 101)])
    assert s["median"] == 50.5 and s["p10"] == pytest.approx(10.9) and s["p90"] == pytest.approx(90.1)
    assert s["n"] == 100
    assert summarize([])["median"] is None


def test_speedup_ci_covers_the_true_ratio():
    rng = np.random.default_rng(0)
    base = list(100 + rng.normal(0, 5, 40))
    cand = list(50 + rng.normal(0, 2.5, 40))
    r, lo, hi = speedup_ci(base, cand)
    assert lo < 2.0 < hi and r == pytest.approx(2.0, rel=0.05)
    r, lo, hi = speedup_ci(base, base)
    assert r == 1.0 and lo <= 1.0 <= hi
    assert speedup_ci([1.0], [1.0]) is None


def test_builtin_data_is_deterministic_and_learnable():
    a, b = builtin_tokens(5000, seed=3), builtin_tokens(5000, seed=3)
    assert np.array_equal(a, b) and a.max() < 256
    assert len(set(a.tolist())) <= 48  # a small alphabet with strong structure
    batches = TokenData(a, seq_len=16, seed=1)
    x1, y1 = batches.get(5, 2)
    x2, y2 = batches.get(5, 2)
    assert (x1 == x2).all() and (x1[:, 1:] == y1[:, :-1]).all()


def test_data_file_errors(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        file_tokens(tmp_path / "nope.txt")
    (tmp_path / "small.txt").write_text("hi")
    with pytest.raises(DataError, match="at least 1024"):
        file_tokens(tmp_path / "small.txt")
    with pytest.raises(DataError, match="directory"):
        file_tokens(tmp_path)


TINY = Suite(name="test", teacher="tiny", student="tiny", batch=4, seq=32, warmup=2, rounds=3, steps_per_round=2,
             budget_s=300, parity_steps=10, micro="none", lr=3e-3, data_tokens=1 << 14)
BASELINE, FUSED = Candidate.preset("baseline", baseline=True), Candidate.preset("fp32-fused")
# In-process workers and one thread: the runner's logic without process start-up (seconds, not minutes).
FAST = dict(micro=False, isolate=False, threads=1)


@pytest.fixture(scope="module")
def faulty_run():
    broken = dataclasses.replace(FUSED, name="broken", description="fails")
    diverging = dataclasses.replace(FUSED, name="diverging", description="lr x 300")
    inject = {"broken": {"fail_at_step": 3}, "diverging": {"lr_scale": 300.0}}
    return run_bench(TINY.with_candidates((BASELINE, FUSED, broken, diverging)), env=CPU, inject=inject, **FAST)


def _cfg(results, name):
    return next(c for c in results["configs"] if c["name"] == name)


def test_failing_configuration_is_recorded_and_the_run_goes_on(faulty_run):
    broken = _cfg(faulty_run, "broken")
    assert broken["status"] == "failed" and "injected backend failure" in broken["reason"]
    assert broken["safe"] is False
    assert _cfg(faulty_run, "baseline")["status"] == "ok"
    assert _cfg(faulty_run, "fp32-fused")["status"] == "ok"


def test_timed_samples_follow_the_rounds_the_scheduler_ran(faulty_run):
    # The budget may cut rounds (a busy host): assert what the schedule says it did, not a count.
    sch = faulty_run["schedule"]
    assert TINY.min_rounds <= sch["rounds_run"] <= TINY.rounds
    base = _cfg(faulty_run, "baseline")
    assert len(base["raw"]["teacher_ms"]) == sch["rounds_run"] * TINY.steps_per_round
    # ... while quality always comes from the same number of steps.
    assert len(base["raw"]["teacher_loss"]) >= TINY.parity_steps


def test_diverging_recipe_is_unsafe_and_never_recommended(faulty_run):
    div = _cfg(faulty_run, "diverging")
    assert div["status"] == "ok" and div["safe"] is False
    assert "tolerance" in div["unsafe_reason"] or "NaN" in div["unsafe_reason"]
    assert faulty_run["recommendation"]["name"] in (None, "fp32-fused")
    assert "diverging" in faulty_run["recommendation"]["text"]  # named as not recommended


def test_fp32_variants_match_the_baseline_loss(faulty_run):
    fused = _cfg(faulty_run, "fp32-fused")
    assert fused["safe"] is True and abs(fused["loss_delta_pct"]) < 100 * loss_tolerance("fp32")
    base = _cfg(faulty_run, "baseline")
    assert all(math.isfinite(v) for v in base["raw"]["student_loss"])
    assert base["raw"]["teacher_loss"][-1] < base["raw"]["teacher_loss"][0]


@pytest.mark.slow
def test_each_process_reports_its_own_peak_memory():
    suite = dataclasses.replace(TINY, rounds=2, parity_steps=4).with_candidates((BASELINE, FUSED))
    res = run_bench(suite, env=CPU, micro=False, inject={"fp32-fused": {"alloc_mb": 800}})
    base, fused = _cfg(res, "baseline"), _cfg(res, "fp32-fused")
    assert base["memory"]["kind"] == "cpu_peak_rss"
    # 800 MB allocated and freed in the fp32-fused worker only: its peak shows it, the baseline's does not
    # (the two train the same models, so without the blob their peaks would be alike).
    assert fused["peak_mb"] - base["peak_mb"] > 400
    assert base["peak_mb"] < 800


def test_emulated_fp8_is_never_a_speedup():
    fp8 = Candidate.preset("fp8")
    suite = dataclasses.replace(TINY, rounds=2).with_candidates((BASELINE, fp8))
    res = run_bench(suite, env=CPU, **FAST)
    c = _cfg(res, "fp8")
    assert c["emulated"] and c["speedup"] is None
    assert c["label"] == "fp8 → fp8 emulated (fallback: no FP8 GPU)"
    assert all(m["speedup"] is None and m["mfu_bf16_peak"] is None for m in c["models"].values())
    assert res["recommendation"]["name"] != "fp8"


def test_gpu_suite_resolves_on_a_simulated_h100():
    from fakes import TORCHAO_EMU as AO
    from overdrive.bench import get_suite
    from overdrive.recipes import resolve

    h100 = build_report(machine("h100", torchao=dict(AO, fp8_ok=True)))
    suite = get_suite("gpu")
    res = {c.name: resolve(c.recipe, h100) for c in suite.candidates}
    assert res["baseline"].optimizer == "for-loop" and res["baseline"].precision == "fp32"
    assert res["fp8+compile"].fp8_backend == "torchao" and res["fp8+compile"].compile == "default"
    assert res["amp-bf16"].autocast_dtype == "bfloat16"
    assert not any(r.fallbacks for r in res.values())


def test_bench_on_a_users_text_file(tmp_path):
    text = tmp_path / "corpus.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 400)
    suite = dataclasses.replace(TINY, rounds=2).with_candidates((BASELINE,))
    res = run_bench(suite, env=CPU, data=str(text), **FAST)
    base = _cfg(res, "baseline")
    assert res["data"] == str(text) and base["status"] == "ok"
    # a 27-symbol repetitive text is learned fast: the loss falls well below ln(256) = 5.5
    assert base["raw"]["teacher_loss"][-1] < base["raw"]["teacher_loss"][0] - 1.0


def test_results_round_trip_through_the_schema_with_labels(faulty_run, tmp_path):
    from overdrive.bench import load_results, save_results

    save_results(faulty_run, str(tmp_path))
    back = load_results(str(tmp_path))  # validated against results.schema.json
    assert [c["label"] for c in back["configs"]] == [c["label"] for c in faulty_run["configs"]]
    assert back["env_fingerprint"] == faulty_run["env_fingerprint"] and back["git_commit"] == faulty_run["git_commit"]
    assert "label" in (tmp_path / "results.csv").read_text().splitlines()[0]


def test_a_worker_peak_does_not_inherit_the_parents_rss():
    # ru_maxrss survives exec on Linux: a spawned worker used to report its parent's RSS at fork as its
    # own floor (a long test session's 800 MB made the baseline look like an 800 MB allocator).
    import multiprocessing as mp

    from overdrive.measure.worker import _peak_rss_mb

    blob = bytearray(600 << 20)  # the parent: 600 MB resident
    blob[:: 4096] = b"x" * len(blob[:: 4096])
    with mp.get_context("spawn").Pool(1) as pool:
        child_peak = pool.apply(_peak_rss_mb)
    del blob
    assert child_peak < 400, f"a fresh interpreter's peak RSS was {child_peak:.0f} MB"


def test_the_worker_reports_what_the_applier_ran_per_model():
    """A recipe asking FP8 on models below fp8_min_dim: the setup reply says each ran its base precision."""
    from overdrive.bench.task import PROGRAM
    from overdrive.measure.worker import LocalConn
    from overdrive.recipes import get_recipe, resolve

    from fakes import TORCHAO_B200

    # Decided as on an FP8 GPU (real torchao, so the size rule applies), set up on this CPU.
    res = dataclasses.replace(resolve(get_recipe("fp8", fp8_min_dim=4096), build_report(machine("h100",
                              torchao=TORCHAO_B200))), device="cpu")
    assert res.precision == "fp8" and res.fp8_backend == "torchao"
    spec = dict(task="gpt", teacher="tiny", student="tiny", batch=2, seq=16, data_tokens=1 << 12, data=None, seed=0,
                lr=1e-3, threads=1, env_facts=CPU.facts, options={}, parity_steps=2, resolved=res.to_dict(),
                cand_options={}, inject={})
    conn = LocalConn(PROGRAM)
    conn.send(("setup", spec))
    reply = conn.recv()
    assert "error" not in reply, reply
    assert {r: a["precision"] for r, a in reply["applied"].items()} == {"teacher": "bf16", "student": "bf16"}


def test_results_are_written_at_every_look_and_warm_ups_overlap(tmp_path, monkeypatch):
    """A bench killed by a time limit still leaves what it measured: at each look the results so far
    (marked partial, no verdict) go to results.json, schema-valid. Every worker's warm-up is sent before
    any is collected (their compiles overlap), as their setups are."""
    import json

    from overdrive.bench import load_results, runner, save_results

    batches = []
    real = runner.call_all
    monkeypatch.setattr(runner, "call_all", lambda ws, msgs, t: batches.append(msgs) or real(ws, msgs, t))

    seen = []

    def partial(doc):
        save_results(doc, str(tmp_path))
        seen.append(load_results(str(tmp_path)))

    suite = dataclasses.replace(TINY, rounds=2, min_rounds=2, max_rounds=4)
    final = run_bench(suite.with_candidates((BASELINE, FUSED)), env=CPU, on_partial=partial, **FAST)
    assert seen, "no results written before the end"
    first = seen[0]
    assert first["partial"]["rounds"] == first["schedule"]["rounds_run"] >= 2
    assert first["recommendation"]["name"] is None and "partial" in first["recommendation"]["text"]
    base = next(c for c in first["configs"] if c["baseline"])
    assert len(base["raw"]["rounds_ms"]) == first["partial"]["rounds"] and base["first_step_s"] > 0
    assert all(c["safe"] is None for c in first["configs"])  # quality is never judged mid-run
    assert "partial" not in final and all(c["first_step_s"] > 0 for c in final["configs"])
    assert json.loads(json.dumps(final))["schedule"]["rounds_run"] >= first["partial"]["rounds"]
    warm = [m for m in batches if m and m[0] == ("run", 1)]
    assert warm and len(warm[0]) == 3  # baseline, fp32-fused and the A/A twin at once
