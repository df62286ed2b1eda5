"""Which contenders tune warms up: the doctor's priors prune, successive halving picks the precisions
whose knobs are tried, emulated checks only where they fit. Fake machines, fake workers, no timing."""

import pytest
import torch
from torch import nn

from fakes import TORCHAO_EMU, machine
from overdrive.env import build_report
from overdrive.tuning.candidates import named_candidates, preset_candidates
from overdrive.tuning.field import PRUNE_FACTOR, ROUNDS_KEPT, fit_emulated, fit_knobs, halve, prior, prune
from overdrive.tuning.workload import Workload

AVX2 = build_report(machine(None, torchao=TORCHAO_EMU))  # the doctor measured bf16 1.3 vs fp32 93 GFLOP/s


def _cpu(flags: dict, rates: dict):
    f = machine(None, torchao=TORCHAO_EMU, cpu_rates=rates)
    f["cpu"]["flags"].update(flags)
    return build_report(f)


AMX = _cpu({"avx512f": True, "avx512_bf16": True, "amx_bf16": True, "avx512_fp16": True},
           {"fp32": 188.9, "bf16": 770.3})  # the Xeon of benchmarks/results/cpu/2026-12-01-xeon-amx
EPYC_BF16 = _cpu({"avx512f": True, "avx512_bf16": True}, {"fp32": 99.0, "bf16": 202.0})  # no fp16 units


def _names(cands):
    return sorted(c.name for c in cands)


def test_the_doctors_measured_matmul_rates_prune_bf16_and_fp16_on_an_avx2_cpu():
    kept, pruned = prune(preset_candidates(AVX2), AVX2)
    assert "amp-bf16" in _names(c for c, _ in pruned) and "amp-fp16" in _names(c for c, _ in pruned)
    assert {"baseline", "fp32"} <= set(_names(kept))
    why = dict((c.name, w) for c, w in pruned)
    assert "bf16 matmul 1.3 vs fp32 93 GFLOP/s" in why["amp-bf16"] and "71.5x slower" in why["amp-bf16"]
    assert "no fp16 units (AVX512-FP16, AMX-FP16)" in why["amp-fp16"]
    assert all(w.startswith("not warmed up:") and "--configs" in w for w in why.values())
    assert prior(next(c for c in kept if c.name == "fp32"), AVX2).slower is None  # fp32 has no prior: no claim


@pytest.mark.parametrize("env,gone", [(AMX, set()), (EPYC_BF16, {"amp-fp16"})])
def test_a_cpu_with_bf16_units_keeps_bf16_and_fp16_needs_its_own_units(env, gone):
    kept, pruned = prune(preset_candidates(env), env)
    assert set(_names(c for c, _ in pruned)) == gone
    bf16 = prior(next(c for c in kept if c.name == "amp-bf16"), env)
    assert bf16.slower < 1 and not bf16.prune and "faster" in bf16.evidence


def test_a_measured_fp16_rate_wins_over_the_flags_and_a_gpu_has_no_cpu_prior():
    env = _cpu({}, {"fp32": 90.0, "bf16": 1.0, "fp16": 60.0})
    fp16 = next(c for c in preset_candidates(env) if c.name == "amp-fp16")
    p = prior(fp16, env)
    assert p.slower == pytest.approx(1.5) and not p.prune and "fp16 matmul 60 vs fp32 90" in p.evidence
    assert PRUNE_FACTOR == 3.0
    h100 = build_report(machine("h100"))
    assert prune(preset_candidates(h100), h100)[1] == []


def test_the_baseline_and_the_users_own_names_are_never_pruned():
    cands = named_candidates(["amp-bf16"], AVX2)
    kept, pruned = prune(cands[:1], AVX2)
    assert _names(kept) == ["baseline"] and not pruned
    # measure() prunes only the default field: a name in --configs is measured whatever its prior says
    # (the end-to-end test below runs it).


class _Run:
    def __init__(self, name, ms, *, live=True, baseline=False, emulated=False):
        self.cand = type("C", (), {"name": name, "baseline": baseline, "emulated": emulated})()
        self.live, self._ms = live, ms

    def steady_ms(self):
        return self._ms


def test_successive_halving_keeps_the_faster_half_within_2x_of_the_fastest():
    runs = [_Run("baseline", 10.0, baseline=True), _Run("a", 9.0), _Run("b", 9.5), _Run("c", 12.0), _Run("d", 30.0),
            _Run("e", 1.0, live=False), _Run("fp8", 5.0, emulated=True)]
    assert [r.cand.name for r in halve(runs)] == ["a", "b"]  # of a, b, c, d: the faster half
    assert [r.cand.name for r in halve([runs[1], _Run("z", 19.0)])] == ["a"]
    assert [r.cand.name for r in halve([runs[1], _Run("far", 17.5), _Run("x", 20.0)])] == ["a", "far"]
    assert [r.cand.name for r in halve([runs[1], _Run("y", 19.0), _Run("x", 20.0)])] == ["a"]  # 19 > 2 x 9
    assert halve([runs[0], runs[5]]) == []


def test_knobs_are_warmed_up_only_while_the_budget_keeps_its_timed_rounds():
    knobs = [c for c in named_candidates(["fp32+foreach", "fp32+compile"], AVX2) if not c.baseline]
    assert ROUNDS_KEPT == 8
    # 10 s a warm-up, 1 s steps, 3 contenders in the rounds (baseline, twin, fp32): both knobs leave 100 - 20 = 80 s,
    # over 8 rounds x 5 contenders x 1 s.
    kept, late = fit_knobs(knobs, warm_s=10.0, step_ms=1000.0, live=3, left_s=100.0, turn_s=0.3)
    assert kept == knobs and late == []
    kept, late = fit_knobs(knobs, warm_s=10.0, step_ms=1000.0, live=3, left_s=55.0, turn_s=0.3)
    assert kept == knobs[:1] and [c for c, _ in late] == knobs[1:]  # 35 s < 40 s; 45 s >= 32 s
    assert "less than 8 timed rounds of the field (40 s at 1000 ms a step) in the 55 s left" in late[0][1]
    assert late[0][1].startswith("not set up: its warm-up (~10 s")
    # A 100 ms step takes 3 steps a turn (tune's 0.3 s turns): 8 rounds x 5 contenders x 0.3 s = 12 s of rounds.
    assert fit_knobs(knobs, warm_s=10.0, step_ms=100.0, live=3, left_s=32.5, turn_s=0.3)[0] == knobs
    assert fit_knobs(knobs, warm_s=10.0, step_ms=100.0, live=3, left_s=31.0, turn_s=0.3)[0] == knobs[:1]
    assert fit_knobs(knobs, warm_s=10.0, step_ms=100.0, live=3, left_s=31.0, turn_s=0.0)[0] == knobs  # 1 step a turn
    kept, late = fit_knobs(knobs, warm_s=10.0, step_ms=100.0, live=3, left_s=5.0, turn_s=0.3)
    assert kept == [] and len(late) == 2


def test_emulated_checks_are_set_up_only_when_their_predicted_cost_fits():
    cands = [c for c in preset_candidates(AVX2) if c.emulated]
    assert len(cands) == 4
    kept, late = fit_emulated(cands, base_setup_s=5.0, base_step_ms=100.0, steps=6, left_s=20.0)
    assert kept == cands and late == []  # 5 + 4 x 6 x 4 x 0.1 = 14.6 s
    kept, late = fit_emulated(cands, base_setup_s=5.0, base_step_ms=1000.0, steps=6, left_s=20.0)
    assert kept == [] and len(late) == 4
    assert "101 s predicted for 4 emulated formats x 6 steps" in late[0][1] and "against 20 s left" in late[0][1]


# -- the whole schedule on fake workers ----------------------------------------------------------

class _FakeWorker:
    def __init__(self, log, speed, first, noise=None):
        import random

        self.conn, self.log, self.speed = object(), log, speed
        self.name = first[1]["recipe"]["name"]
        self.noise, self.rng = (noise or {}).get(self.name, 0.0), random.Random(len(log))
        log.append(self.name)
        self.pending = first

    def send(self, msg):
        self.pending = msg

    def receive(self, timeout):
        msg, self.pending = self.pending, None
        if msg[0] == "setup":
            return {"setup_s": 0.01, "conversions": {}, "threads": 1, "signature": "sig"}
        if msg[0] == "finish":
            return {"memory": None}
        ms = [self.speed[self.name] * self.rng.uniform(1 - self.noise, 1 + self.noise) for _ in range(msg[1])]
        return {"steps": [{"ms": m, "loss": 2.0, "gnorm": 1.0} for m in ms], "memory": None}

    def call(self, msg, timeout):
        self.send(msg)
        return self.receive(timeout)

    def stop(self, grace_s=None):
        self.conn = None


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return self.fc(x)


def _batch(step):
    return torch.randn(2, 4, generator=torch.Generator().manual_seed(step))


def _fake_launcher(monkeypatch, speed, noise=None) -> list[str]:
    import overdrive.tuning.measure as tm

    started: list[str] = []

    class FakeLauncher:
        def __init__(self, *a, **kw):
            pass

        def start(self, first=None):
            return _FakeWorker(started, speed, first, noise)

    monkeypatch.setattr(tm, "Launcher", FakeLauncher)
    return started


def _measure(monkeypatch, speed, names=None, env=AVX2):
    import overdrive.tuning.measure as tm

    started = _fake_launcher(monkeypatch, speed)
    s = tm.measure(Workload(model_fn=Net, batch_fn=_batch), env, budget_s=120, names=names)
    return s, started, {r.cand.name: r for r in s.runs}


def test_pruned_contenders_are_never_set_up_and_knobs_grow_only_on_the_faster_half(monkeypatch):
    speed = {"baseline": 100.0, "fp32": 80.0, "fp32+foreach": 85.0, "fp32+compile": 70.0,
             **{n: 400.0 for n in ("fp8", "fp8-rowwise", "mxfp8", "nvfp4")}}
    s, started, by = _measure(monkeypatch, speed)
    assert "amp-bf16" not in started and "amp-fp16" not in started  # not even a set-up
    assert by["amp-bf16"].status == by["amp-fp16"].status == "pruned"
    assert "GFLOP/s" in by["amp-bf16"].reason
    assert set(started) == {"baseline", "fp32", "fp32+foreach", "fp32+compile", "fp8", "fp8-rowwise", "mxfp8",
                            "nvfp4"}
    assert by["fp32+compile"].status == "ok" and len(by["fp32+compile"].rounds_ms) == s.rounds >= 4
    assert all(by[n].status == "emulated" for n in ("fp8", "mxfp8"))


def test_knobs_are_tried_only_on_the_faster_half_of_the_precisions(monkeypatch):
    # A CPU with bf16 units (nothing pruned): of fp32, amp-bf16 and amp-fp16, the faster half by their
    # warm-ups (amp-bf16, fp32) get the optimizer and compile knobs; amp-fp16 gets none.
    speed = {"baseline": 100.0, "fp32": 90.0, "amp-bf16": 50.0, "amp-fp16": 95.0,
             **{f"{p}+{k}": 60.0 for p in ("fp32", "amp-bf16", "amp-fp16") for k in ("foreach", "for-loop", "compile")},
             **{n: 400.0 for n in ("fp8", "fp8-rowwise", "mxfp8", "nvfp4")}}
    s, started, by = _measure(monkeypatch, speed, env=AMX)
    assert {"amp-bf16", "amp-fp16", "fp32"} <= set(started)
    assert {"amp-bf16+foreach", "amp-bf16+compile", "fp32+foreach", "fp32+compile"} <= set(started)
    assert not [n for n in started if n.startswith("amp-fp16+")]


def test_the_users_own_names_are_measured_whatever_the_prior(monkeypatch):
    speed = {"baseline": 100.0, "amp-bf16": 90.0}
    s, started, by = _measure(monkeypatch, speed, names=["amp-bf16"])
    assert started.count("amp-bf16") == 1 and by["amp-bf16"].status == "ok" and by["amp-bf16"].rounds_ms


@pytest.mark.parametrize("busy", [False, True])
def test_tune_names_what_it_kept_and_whether_it_is_a_recommendation(monkeypatch, busy):
    import overdrive

    # fp32 (fused AdamW) 8% faster than the for-loop baseline; on the busy host the baseline and its
    # twin swing ±60% (their workers are seeded: the same figures every run).
    speed = {"baseline": 100.0, "fp32": 92.0, "fp32+foreach": 94.0, "fp32+compile": 93.0,
             **{n: 400.0 for n in ("fp8", "fp8-rowwise", "mxfp8", "nvfp4")}}
    _fake_launcher(monkeypatch, speed, {"baseline": 0.6} if busy else None)
    res = overdrive.tune(Net, _batch, budget_s=120, env=AVX2, cache=False)
    assert res.meta["noise"]["too_busy"] is busy and res.meta["kept"] == res.best.name
    assert {r["name"]: r["status"] for r in res.rows}["amp-bf16"] == "pruned"
    if not busy:
        assert res.best.name == "fp32" and res.meta["recommended"] and res.summary.startswith("Winner: fp32")
    else:  # no recommendation, but the slowest loop is not kept blindly: the summary says what and why
        assert not res.meta["recommended"] and not res.meta["confident"]
        assert "No recommendation" in res.summary and res.best.name != "baseline", res.summary
        assert f"Kept, not recommended: {res.best.name}" in res.summary and "the best evidenced" in res.summary
