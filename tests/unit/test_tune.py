"""tune: candidates and their dedupe, safety rule, per-layer FP8 filter (faked timings and a faked
FP8 GPU), the winner rule, Recipe save/load, and accelerate(recipe="tuned")."""

import dataclasses
import math

import pytest
import torch
from torch import nn

import overdrive
from fakes import TE_OK, TORCHAO_EMU, machine
from overdrive.env import build_report
from overdrive.errors import UserError
from overdrive.recipes import Recipe, resolve
from overdrive.recipes.tuned import machine_fingerprint, model_signature, save_tuned
from overdrive.tuning.api import _pick
from overdrive.tuning.candidates import (checkpointing_candidates, describe, effective_key, knob_candidates,
                                       named_candidates, preset_candidates)
from overdrive.tuning.fp8_filter import LinearSite, bench_linear, linear_sites, measure_filter
from overdrive.tuning.safety import Tolerance, check_safety
from overdrive.tuning.workload import Workload, check_batch, compute_loss, load_file_fn

CPU = build_report(machine(None, torchao=TORCHAO_EMU))  # AVX2-like: fp32 is best, FP8 only emulated
AO_GPU = dict(TORCHAO_EMU, fp8_ok=True)
H100_AO = build_report(machine("h100", torchao=AO_GPU))
H100_TE = build_report(machine("h100", te=TE_OK, torchao=AO_GPU))


class Net(nn.Module):
    def __init__(self, width=32):
        super().__init__()
        self.fc1, self.fc2, self.head = nn.Linear(16, width), nn.Linear(width, width), nn.Linear(width, 8)

    def forward(self, x):
        return self.head(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


# -- candidates -----------------------------------------------------------------------------

def test_presets_that_resolve_alike_are_one_candidate_with_every_name():
    cands = preset_candidates(CPU)
    labels = {c.name: c.names for c in cands}
    assert cands[0].baseline and cands[0].name == "baseline"
    assert labels["fp32"] == ["fp32", "fp32-fused", "auto"]  # auto resolves to fp32 on this CPU: measured once
    assert "fp8-delayed" in labels["fp8"]      # delayed scaling is TE only: tensorwise emulation here
    assert len({effective_key(c.resolved) for c in cands}) == len(cands)
    fp8 = next(c for c in cands if c.name == "fp8")
    assert fp8.emulated and "FALLBACK" in describe(fp8.resolved) and "emulated" in describe(fp8.resolved)


def test_knobs_expand_only_surviving_precisions_and_dedupe_against_existing():
    cands = preset_candidates(CPU)
    fp32 = [c for c in cands if c.name == "fp32"]
    new = knob_candidates(fp32, CPU, cands)
    names = {c.name for c in new}
    assert names == {"fp32+foreach", "fp32+compile"}  # +fused-adamw is fp32 itself, +for-loop the baseline
    assert "fp32+for-loop" in cands[0].names and "fp32+fused-adamw" in fp32[0].names
    assert all(c.resolved.precision == "fp32" for c in new)
    assert next(c for c in new if c.name == "fp32+compile").resolved.compile == "default"


def test_named_candidates_always_start_with_the_baseline():
    cands = named_candidates(["amp-bf16"], CPU)
    assert [c.name for c in cands] == ["baseline", "amp-bf16"]
    with pytest.raises(ValueError, match="unknown recipe"):
        named_candidates(["nope"], CPU)
    c = named_candidates(["fp32+foreach", "amp-bf16+compile"], CPU)
    assert [x.resolved.optimizer for x in c[1:]] == ["foreach", "torch-fused"] and c[2].resolved.compile == "default"
    with pytest.raises(ValueError, match="knob"):
        named_candidates(["fp32+turbo"], CPU)


def test_fp8_gpu_candidates_pick_the_real_engine():
    ao = {c.name: c for c in preset_candidates(H100_AO)}
    assert {"fp8-delayed", "mxfp8", "nvfp4"} <= set(ao["fp8"].names)  # all fall back to tensorwise on an H100
    assert ao["fp8"].resolved.fp8_backend == "torchao" and not ao["fp8"].emulated
    assert ao["fp8-rowwise"].resolved.fp8_scaling == "rowwise"
    te = {c.name: c for c in preset_candidates(H100_TE)}
    assert te["fp8"].resolved.fp8_backend == "transformer_engine"
    assert te["fp8-rowwise"].resolved.fp8_backend == "torchao"  # TE has no rowwise scaling
    knobs = {c.name for c in knob_candidates([ao["fp8"]], H100_AO, list(ao.values()))}
    assert knobs == {"fp8+compile"}  # FP8 is tried compiled, no optimizer variants on top


def test_checkpointing_candidates_when_memory_is_the_limit():
    cands = preset_candidates(H100_AO)
    bf16 = [c for c in cands if "amp-bf16" in c.names]
    new = checkpointing_candidates(bf16, H100_AO, cands)
    assert {c.resolved.activation_checkpointing for c in new} == {"full", "selective"}


def test_memory_limit_detection(tmp_path):
    from overdrive.tuning.measure import Run, Session

    s = Session(Workload(model_fn=Net, batch_fn=_batch), H100_AO, budget_s=10)
    s.runs = [Run(cand=preset_candidates(H100_AO)[0], memory={"peak_mb": 70_000, "total_mb": 80_000})]
    assert "peaked at 70000 of 80000 MB" in s._memory_limited()
    s.runs[0].memory = {"peak_mb": 10_000, "total_mb": 80_000}
    assert s._memory_limited() is None
    s.runs[0].status = "oom"
    assert s._memory_limited() == "a candidate ran out of memory"


def _batch(step):
    return torch.randn(4, 16)


# -- FP8 filter -----------------------------------------------------------------------------

def test_fp8_filter_converts_only_measured_winners():
    sites = [LinearSite(fqn="blocks.0.fc", in_features=1024, out_features=4096, tokens=8192),
             LinearSite(fqn="blocks.0.proj", in_features=4096, out_features=1024, tokens=8192),
             LinearSite(fqn="blocks.0.small", in_features=128, out_features=128, tokens=8192),
             LinearSite(fqn="odd", in_features=100, out_features=128, tokens=8192),
             LinearSite(fqn="lm_head", in_features=1024, out_features=32000, tokens=8192)]
    fake = {(8192, 1024, 4096): (2.0, 1.3), (8192, 4096, 1024): (2.0, 1.95), (8192, 128, 128): (0.1, 0.2)}
    calls = []

    def bench(m, k, n, fp8):
        calls.append((m, k, n, fp8))
        return fake[(m, k, n)][1 if fp8 else 0]

    res = measure_filter(sites, bench=bench, min_gain=1.05)
    by = {d["fqn"]: d for d in res.layers}
    assert res.shapes == "1024x4096"
    assert by["blocks.0.fc"]["convert"] and by["blocks.0.fc"]["speedup"] == pytest.approx(2 / 1.3)
    assert not by["blocks.0.proj"]["convert"]      # 1.03x: under the 1.05x bar
    assert not by["blocks.0.small"]["convert"]     # FP8 slower
    assert "divisible by 16" in by["odd"]["reason"] and by["odd"]["bf16_ms"] is None
    assert "head" in by["lm_head"]["reason"]
    assert len(calls) == 6  # 3 timed shapes x (bf16, fp8); untimed layers cost nothing


def test_fp8_filter_shape_that_loses_anywhere_stays_bf16():
    sites = [LinearSite(fqn="a", in_features=64, out_features=64, tokens=4096),
             LinearSite(fqn="b", in_features=64, out_features=64, tokens=16)]
    res = measure_filter(sites, bench=lambda m, k, n, fp8: (1.0 if fp8 else 2.0) if m == 4096 else
                         (1.0 if fp8 else 0.5))
    assert res.shapes == "" and not any(d["convert"] for d in res.layers)


def test_linear_sites_records_token_counts():
    net = Net()
    x = torch.randn(3, 5, 16)
    sites = {s.fqn: s for s in linear_sites(net, lambda: net(x))}
    assert sites["fc1"].tokens == 15 and sites["head"].shape == "32x8"


@pytest.mark.slow  # torchao import + emulated FP8: ~10 s on a loaded 2-core host
def test_bench_linear_runs_emulated_fp8_on_cpu():
    pytest.importorskip("torchao")
    ms = bench_linear(32, 16, 32, True, backend="emulated", scaling="tensorwise", compile=False, device="cpu", reps=1)
    assert ms > 0


def test_measured_shapes_travel_in_the_recipe_to_accelerate():
    pytest.importorskip("torchao")
    rec = Recipe(name="fp8", precision="fp8", fp8_backend="emulated", fp8_shapes="16x32")
    acc = overdrive.accelerate(Net(), rec, env=CPU, grad_clip=None)
    conv = {d.fqn: d.converted for d in acc.conversions["fp8"]}
    assert conv == {"fc1": True, "fc2": False, "head": False}
    x = torch.randn(4, 16)
    loss = acc.model(x).square().mean()
    acc.backward(loss)
    acc.step()
    assert "measured per-layer filter" in describe(resolve(rec, CPU))


def test_session_applies_a_measured_filter_and_skips_fp8_when_nothing_wins():
    from overdrive.tuning.measure import Session

    s = Session(Workload(model_fn=Net, batch_fn=_batch), H100_AO, budget_s=10)
    fp8 = next(c for c in preset_candidates(H100_AO) if c.name == "fp8")
    s.filters[("torchao", "tensorwise", False)] = {"shapes": "", "layers": [], "summary": "0 of 3 Linears"}
    assert "no Linear is faster in FP8" in s._apply_fp8_filter(fp8)
    s.filters[("torchao", "tensorwise", False)] = {"shapes": "1024x4096", "layers": [], "summary": "1 of 3"}
    assert s._apply_fp8_filter(fp8) is None
    assert fp8.recipe.fp8_shapes == "1024x4096" and fp8.resolved.recipe.fp8_shapes == "1024x4096"


# -- safety ---------------------------------------------------------------------------------

def test_safety_rule_is_benchs_per_precision_judge():
    ref = [2.0, 1.9, 1.8, 1.7, 1.6, 1.5]
    assert check_safety([x * 1.005 for x in ref], ref).safe is True  # fp32: within 1%
    drift = check_safety([x * 1.02 for x in ref], ref)
    assert drift.safe is False and "±1% for fp32" in drift.reason and drift.delta_pct == pytest.approx(2)
    assert check_safety([x * 1.02 for x in ref], ref, precision="bf16").safe is True  # bf16: 3%
    assert check_safety([x * 1.2 for x in ref], ref, tol=Tolerance(pct=25)).safe is True
    assert check_safety(ref[:3] + [math.nan], ref).safe is False
    g = [1.0] * 6
    assert "blew up" in check_safety(ref, ref, gnorm=[1, 1, 50, 1, 1, 1], ref_gnorm=g).reason
    assert check_safety(ref, ref, gnorm=[math.inf, 1, 1, 1, 1, 1], ref_gnorm=g, scaler=True).safe is True
    assert check_safety(ref, ref, gnorm=[math.inf, 1, 1, 1, 1, 1], ref_gnorm=g).safe is False
    assert check_safety([1.0], ref).safe is None
    assert "per precision" in Tolerance().describe() and "fp32 1%" in Tolerance().describe()


def test_a_loss_never_finite_is_never_safe_not_even_the_baselines():
    nan = [math.nan] * 5
    v = check_safety(nan, nan, is_baseline=True)
    assert v.safe is False and "never finite" in v.reason
    assert check_safety(nan, [2.0] * 5).safe is False
    assert check_safety([2.0] * 5, nan).safe is None  # nothing to compare with: not "safe"


# -- the winner rule ------------------------------------------------------------------------

def _rowd(name, speedup, ci, status="ok", safe=True, emulated=False):
    verdict = "faster" if ci and ci[0] > 1 else "same"
    return {"name": name, "names": [name], "status": status, "safe": safe, "emulated": emulated,
            "verdict": verdict, "rounds": 6,
            "speedup": speedup, "speedup_ci": ci, "n": 20, "step_ms": 10.0 / speedup, "ran": "x",
            "loss_delta_pct": 0.1, "loss_delta_nats": 0.001}


def test_winner_needs_the_interval_above_one_and_safety():
    from overdrive.tuning.measure import Run

    cands = named_candidates(["fp32", "amp-bf16"], CPU)
    runs = [Run(cand=c) for c in cands]
    base = _rowd("baseline", 1.0, None)
    rows = [base, _rowd("fp32", 1.08, [0.97, 1.2]), _rowd("amp-bf16", 1.5, [1.3, 1.7], safe=False)]
    best, text, _ = _pick(rows, runs)
    assert best.name == "baseline" and text.startswith("Nothing beat the baseline with confidence")
    assert "fp32" in text and "0.97-1.20" in text
    rows[1]["speedup_ci"], rows[1]["verdict"] = [1.02, 1.2], "faster"
    best, text, confident = _pick(rows, runs)
    assert confident
    assert best.name == "fp32" and "1.08x the baseline" in text and "95% CI 1.02-1.20" in text
    rows[1]["emulated"] = True
    assert _pick(rows, runs)[0].name == "baseline"


# -- Recipe save/load, the tuned cache, accelerate(recipe="tuned") ------------------------------

def test_recipe_save_load_roundtrip_and_errors(tmp_path):
    r = Recipe(name="amp-bf16+compile", precision="bf16", compile="default", fp8_shapes="")
    p = r.save(str(tmp_path / "recipe.json"))
    assert Recipe.load(p) == r
    with pytest.raises(UserError, match="not found"):
        Recipe.load(str(tmp_path / "missing.json"))
    (tmp_path / "bad.json").write_text('{"recipe": {"precision": "bf16", "warp": 9}}')
    with pytest.raises(UserError, match="unknown field"):
        Recipe.load(str(tmp_path / "bad.json"))
    (tmp_path / "bad2.json").write_text('{"precision": "bf17"}')
    with pytest.raises(UserError, match="bf17"):
        Recipe.load(str(tmp_path / "bad2.json"))


def test_signature_and_fingerprint():
    assert model_signature(Net(32)) == model_signature(Net(32))  # weights differ, architecture same
    assert model_signature(Net(32)) != model_signature(Net(64))
    assert machine_fingerprint(CPU) == machine_fingerprint(build_report(machine(None, torchao=TORCHAO_EMU)))
    assert machine_fingerprint(CPU) != machine_fingerprint(H100_AO)


def test_accelerate_tuned_falls_back_to_auto_and_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    acc = overdrive.accelerate(Net(), "tuned", env=CPU)
    d = acc.resolved.decisions[0]
    assert d.fallback and d.requested == "tuned" and d.chosen == "auto" and "no tuned recipe" in d.reason
    assert "FALLBACK recipe: auto" in acc.report()
    win = Recipe(name="fp32+foreach", precision="fp32", optimizer="foreach")
    save_tuned(win, signature=model_signature(Net()), fingerprint=machine_fingerprint(CPU), summary="1.2x")
    acc = overdrive.accelerate(Net(), "tuned", env=CPU)
    assert acc.resolved.recipe == win and acc.resolved.optimizer == "foreach"
    assert not acc.resolved.decisions[0].fallback and "1.2x" in acc.resolved.decisions[0].reason
    other = overdrive.accelerate(Net(64), "tuned", env=CPU)  # another architecture: no match
    assert other.resolved.decisions[0].fallback


def test_an_inconclusive_run_never_replaces_a_confident_winner(tmp_path, monkeypatch):
    import json

    from overdrive.recipes.tuned import tuned_path

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    sig, fp = model_signature(Net()), machine_fingerprint(CPU)
    win = Recipe(name="fp32+foreach", precision="fp32", optimizer="foreach")
    p, written = save_tuned(win, signature=sig, fingerprint=fp, summary="1.2x", threads=2, confident=True)
    assert written and p == tuned_path(sig, fp, 2) and p.endswith("-t2.json")
    p2, written = save_tuned(Recipe(name="baseline"), signature=sig, fingerprint=fp, summary="too busy", threads=2,
                             confident=False)
    assert p2 == p and not written and json.load(open(p))["recipe"]["name"] == "fp32+foreach"
    # Another thread count is another key; a confident winner replaces anything.
    assert save_tuned(Recipe(name="baseline"), signature=sig, fingerprint=fp, summary="-", threads=1,
                      confident=False)[1]
    assert save_tuned(Recipe(name="amp-bf16", precision="bf16"), signature=sig, fingerprint=fp, summary="1.5x",
                      threads=2, confident=True)[1]
    assert json.load(open(p))["recipe"]["name"] == "amp-bf16"


# -- the user's functions ---------------------------------------------------------------------

def test_user_function_errors_are_one_line(tmp_path):
    with pytest.raises(UserError, match="not found"):
        load_file_fn(str(tmp_path / "nope.py") + ":f", "model factory")
    (tmp_path / "m.py").write_text("def g():\n    return 1\n")
    with pytest.raises(UserError, match="has no function 'f' \\(it has g\\)"):
        load_file_fn(str(tmp_path / "m.py") + ":f", "model factory")
    with pytest.raises(UserError, match="FILE.py:FUNCTION"):
        load_file_fn("m.py", "model factory")
    (tmp_path / "broken.py").write_text("def f(:\n")
    with pytest.raises(UserError, match="fails to import: SyntaxError"):
        load_file_fn(str(tmp_path / "broken.py") + ":f", "model factory")
    with pytest.raises(UserError, match="returned int"):
        check_batch(3)
    with pytest.raises(UserError, match="no tensors"):
        check_batch({"a": 1})
    check_batch({"x": torch.zeros(1)})
    with pytest.raises(UserError, match="shape \\(4, 8\\), not a scalar loss: pass --loss"):
        compute_loss(Net(), torch.randn(4, 16), None)
    assert compute_loss(Net(), {"x": torch.randn(4, 16)}, lambda m, b: m(b["x"]).mean()).dim() == 0
    with pytest.raises(UserError, match="cannot travel to a worker process"):
        Workload(model_fn=lambda: Net(), batch_fn=_batch).check_picklable()
    Workload(model_fn=Net, batch_fn=_batch).check_picklable()


def test_tuned_recipe_dataclass_replace_keeps_shapes():
    r = dataclasses.replace(Recipe(precision="fp8"), fp8_shapes="64x64")
    assert r.fp8_shapes == "64x64"


# -- the schedule, with the workers faked ------------------------------------------------------

def test_timed_rounds_halve_the_field_and_keep_to_the_budget(monkeypatch):
    import random
    import time

    from overdrive.tuning.measure import Run, Session

    cands = named_candidates(["fp32", "fp32+foreach", "amp-bf16", "amp-fp16"], CPU)
    speed = {"baseline": 10.0, "fp32": 9.0, "fp32+foreach": 9.5, "amp-bf16": 14.0, "amp-fp16": 15.0}
    rng = random.Random(0)
    s = Session(Workload(model_fn=Net, batch_fn=_batch), CPU, budget_s=1.5)
    s.runs = [Run(cand=c, worker=object(), warmup_ms=[50.0, speed[c.name], speed[c.name]]) for c in cands]

    def fake_call(run, msg, timeout, on_timeout):
        time.sleep(0.002 * msg[1])
        return {"steps": [{"ms": speed[run.cand.name] * rng.uniform(0.97, 1.03), "loss": 1.0, "gnorm": None}
                          for _ in range(msg[1])]}

    def fake_end(run, status, reason, *, collect=False):
        run.status, run.reason, run.worker = status, reason, None

    monkeypatch.setattr(s, "_call", fake_call)
    monkeypatch.setattr(s, "_end", fake_end)
    t0 = time.perf_counter()
    s._timed(s.runs[0], reserve_s=0.1)
    assert time.perf_counter() - t0 < 1.5 and s.rounds >= 8
    by = {r.cand.name: r for r in s.runs}
    assert by["baseline"].status == "pending" and by["fp32"].status == "pending"  # the leader and the reference stay
    for slow in ("amp-bf16", "amp-fp16"):
        # "surely slower" needs 3 paired rounds: the rung at round 3 is the first that can say so.
        assert by[slow].status == "eliminated" and "successive halving after round 3" in by[slow].reason
        assert len(by[slow].ms) < len(by["fp32"].ms)  # the budget went to the contenders


def _fake_session(monkeypatch, speed: dict, *, budget_s: float, noise: dict | None = None, twin: bool = True,
                  sleep: bool = False):
    """A Session whose workers are faked: each run steps at speed[name] ms (x uniform noise, 1% unless
    noise[name]), a twin of the baseline beside them (the A/A control); sleep: each step also takes its
    ms of wall time (the budget is spent as a real run's would be)."""
    import random
    import time

    from overdrive.tuning.measure import Run, Session

    names = [n for n in speed if n != "baseline"]
    cands = named_candidates(names, CPU)
    rng = random.Random(0)
    s = Session(Workload(model_fn=Net, batch_fn=_batch), CPU, budget_s=budget_s)
    s.runs = [Run(cand=c, worker=object(), warmup_ms=[50.0, speed[c.name], speed[c.name]]) for c in cands]
    if twin:
        s.twin = Run(cand=s.runs[0].cand, worker=object(), warmup_ms=[50.0, speed["baseline"]] * 2)
    noise = noise or {}

    def fake_call(run, msg, timeout, on_timeout):
        name = "twin" if run is s.twin else run.cand.name
        x = noise.get(name, 0.01)
        ms = [speed["baseline" if name == "twin" else name] * rng.uniform(1 - x, 1 + x) for _ in range(msg[1])]
        if sleep:
            time.sleep(sum(ms) / 1e3)
        return {"steps": [{"ms": m, "loss": 1.0, "gnorm": None} for m in ms]}

    def fake_end(run, status, reason, *, collect=False):
        run.status, run.reason, run.worker = status, reason, None

    monkeypatch.setattr(s, "_call", fake_call)
    monkeypatch.setattr(s, "_end", fake_end)
    return s


def test_timed_rounds_stop_at_the_first_look_once_every_verdict_is_settled(monkeypatch):
    # A steady A/A twin, a leader 2x faster than the baseline, a rival surely slower than the leader:
    # nothing left to learn at the first look (round 4), far inside a 60 s budget.
    speed = {"baseline": 10.0, "amp-bf16": 5.0, "fp32": 9.8}
    s = _fake_session(monkeypatch, speed, budget_s=60)
    s._timed(s.runs[0], reserve_s=0.1)
    assert s.rounds == 4 and s.stop_reason.startswith("settled after 4 rounds"), s.stop_reason
    assert "leader amp-bf16" in s.stop_reason


def test_timed_rounds_measure_on_while_the_a_a_twin_is_too_noisy_to_judge(monkeypatch):
    # The same field, but the twin (the host's own noise) swings ±40%: no look may stop the rounds early.
    speed = {"baseline": 10.0, "amp-bf16": 5.0, "fp32": 9.8}
    s = _fake_session(monkeypatch, speed, budget_s=60, noise={"twin": 0.4, "baseline": 0.4})
    s._timed(s.runs[0], reserve_s=0.1)
    assert s.rounds == 32 and s.stop_reason == "the last look (32 rounds)", s.stop_reason


def test_a_squeezed_budget_halves_at_round_3_without_proof(monkeypatch):
    # Six rivals 1% apart and an A/A twin too noisy (±20%) for any of them to be surely slower; a budget
    # (0.55 s, ~60 ms a round) that after round 3 fits fewer than 8 more rounds of them: the rung at round 3
    # halves the field on the medians anyway, and says why.
    speed = {"baseline": 1.0, "fp32": 0.90, "fp32+foreach": 0.91, "amp-bf16": 0.92, "amp-fp16": 0.93,
             "fp32+compile": 0.94, "amp-bf16+compile": 0.95}
    noise = {n: 0.002 for n in speed} | {"baseline": 0.2, "twin": 0.2}
    s = _fake_session(monkeypatch, speed, budget_s=0.55, noise=noise, sleep=True)
    s._timed(s.runs[0], reserve_s=0.05)
    at3 = {r.cand.name: r.reason for r in s.runs if r.reason.startswith("successive halving after round 3:")}
    assert set(at3) == {"amp-fp16", "fp32+compile", "amp-bf16+compile"}, [(r.cand.name, r.status, r.reason)
                                                                         for r in s.runs]
    assert all(w.endswith("(too little budget left for this many)") for w in at3.values()), at3
    assert s.runs[1].status == "pending"  # the leader stays (later rungs may halve the rest again)


def test_warm_up_stops_the_far_slower_flags_the_unsafe_and_never_times_emulation(monkeypatch):
    from overdrive.tuning.measure import Run, Session

    cands = {c.name: c for c in named_candidates(["fp32", "amp-bf16", "amp-fp16", "fp8"], CPU)}
    step_ms = {"baseline": 10.0, "fp32": 9.0, "amp-bf16": 700.0, "amp-fp16": 10.0, "fp8": 30.0}
    drift = {"amp-fp16": 1.5}  # its loss runs 50% above the fp32 shadow's
    s = Session(Workload(model_fn=Net, batch_fn=_batch), CPU, budget_s=60)
    runs = {n: Run(cand=c, worker=object()) for n, c in cands.items()}
    s.runs = list(runs.values())

    def fake_call(run, msg, timeout, on_timeout):
        k, name = len(run.loss), run.cand.name
        return {"steps": [{"ms": step_ms[name], "loss": (2.0 - 0.01 * (k + i)) * drift.get(name, 1.0), "gnorm": 1.0}
                          for i in range(msg[1])]}

    def fake_end(run, status, reason, *, collect=False):
        run.status, run.reason, run.worker = status, reason, None

    monkeypatch.setattr(s, "_call", fake_call)
    monkeypatch.setattr(s, "_end", fake_end)
    base = runs["baseline"]
    s._warm(base, None)
    for n in ("fp32", "amp-bf16", "amp-fp16", "fp8"):
        s._warm(runs[n], base)
    assert runs["fp32"].status == "pending" and runs["fp32"].safety.safe
    assert runs["amp-bf16"].status == "stopped" and "70x the baseline's step on its first step" in runs["amp-bf16"].reason
    assert runs["amp-fp16"].status == "unsafe" and "+50.00%" in runs["amp-fp16"].reason
    assert runs["fp8"].status == "emulated" and runs["fp8"].safety.safe and not runs["fp8"].ms
    assert len(runs["fp8"].loss) == 6  # emulation gets extra safety steps, and no timed ones


def test_a_busy_host_keeps_the_baseline_unless_a_difference_clears_its_noise():
    from overdrive.measure.stats import NoiseFloor
    from overdrive.tuning.measure import Run

    cands = named_candidates(["fp32", "amp-bf16"], CPU)
    runs = [Run(cand=c) for c in cands]
    floor = NoiseFloor(ratio=1.2, lo=0.95, hi=1.5, rounds=20, spread_pct=41.0)
    rows = [_rowd("baseline", 1.0, None), _rowd("fp32", 1.3, [1.05, 1.6])]
    rows[1]["verdict"] = "same"  # inside the floor
    best, text, confident = _pick(rows, runs, floor=floor, busy=True, load=[12.0], cores=2)
    assert best.name == "baseline" and "too busy to judge" in text and "load average 12.0" in text and not confident
    rows[1].update(speedup=1.9, speedup_ci=[1.5, 2.4], verdict="faster")
    best, text, confident = _pick(rows, runs, floor=floor, busy=True)
    assert best.name == "fp32" and "busy" in text and not confident  # never cached over a quiet run's winner


def test_tuned_entry_survives_unrelated_installs_and_says_what_changed(tmp_path, monkeypatch):
    """Installing an engine the winner does not use keeps the entry (it used to be 'no tuned recipe' after
    `pip install onnx` or torchao); an engine the winner runs on that changed makes it stale, by name; another
    torch build finds no entry but says an older one exists and what differs."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    bare = build_report(machine(None))  # no torchao here
    sig = model_signature(Net())
    win = Recipe(name="fp32+foreach", precision="fp32", optimizer="foreach")
    save_tuned(win, signature=sig, fingerprint=machine_fingerprint(bare), summary="1.2x", env=bare)
    acc = overdrive.accelerate(Net(), "tuned", env=CPU)  # torchao installed since: the winner does not use it
    assert acc.resolved.recipe == win and not acc.resolved.decisions[0].fallback

    fp8 = Recipe(name="fp8", precision="fp8")
    save_tuned(fp8, signature=model_signature(Net(64)), fingerprint=machine_fingerprint(CPU), summary="1.1x", env=CPU)
    stale = overdrive.accelerate(Net(64), "tuned", env=bare).resolved.decisions[0]
    assert stale.fallback and "stale" in stale.reason and "torchao was '" in stale.reason and "is 'missing' now" in stale.reason

    facts = machine(None, torchao=TORCHAO_EMU)
    facts["torch"]["version"] = "2.99.0"
    newer = overdrive.accelerate(Net(), "tuned", env=build_report(facts)).resolved.decisions[0]
    assert newer.fallback and "an older entry for it exists" in newer.reason
    assert "torch " in newer.reason and "-> 2.99.0" in newer.reason


def test_compile_warm_up_follows_this_models_measured_compile_time(monkeypatch):
    """The first compile may use the warm-up time left (it was a fixed third of the budget: at 120 s a 30 s
    compile under load was dropped); later compiles get 3x the slowest measured one, not a fixed share."""
    from overdrive.tuning.measure import Run, Session

    cands = {c.name: c for c in named_candidates(["amp-bf16+compile", "fp32+compile"], CPU)}
    assert all(c.resolved.compile != "off" for c in cands.values() if c.name != "baseline")
    first_ms = {"baseline": 10.0, "amp-bf16+compile": 10_000.0, "fp32+compile": 9_000.0}
    s = Session(Workload(model_fn=Net, batch_fn=_batch), CPU, budget_s=120)
    runs = {n: Run(cand=c, worker=object()) for n, c in cands.items()}
    s.runs = list(runs.values())
    timeouts = {}

    def fake_call(run, msg, timeout, on_timeout):
        timeouts.setdefault(run.cand.name, timeout)
        ms = first_ms[run.cand.name] if not run.warmup_ms else 10.0
        return {"steps": [{"ms": ms, "loss": 2.0 - 0.01 * (len(run.loss) + i), "gnorm": 1.0} for i in range(msg[1])]}

    monkeypatch.setattr(s, "_call", fake_call)
    monkeypatch.setattr(s, "_end", lambda run, status, reason, collect=False: setattr(run, "status", status))
    base = runs["baseline"]
    s._warm(base, None)
    s._warm(runs["amp-bf16+compile"], base)
    s._warm(runs["fp32+compile"], base)
    assert timeouts["amp-bf16+compile"] > 0.6 * 120  # all the warm-up time left (0.65 of the budget), not 40 s
    assert timeouts["fp32+compile"] == pytest.approx(30.0)  # 3x the 10 s compile measured for this model


def test_a_winner_merged_with_fallback_names_says_what_ran():
    """Where FP8 cannot run, the FP8 presets fall back to another row's recipe: the winner line used to read
    "Winner: amp-bf16 (also named fp8, fp8-rowwise, ... mxfp8)", as if FP8 ran."""
    from overdrive.recipes.labels import same_recipe_text
    from overdrive.tuning.candidates import preset_candidates
    from overdrive.tuning.measure import Run

    nofp8 = build_report(machine(None))  # no torchao: every FP8 preset falls back (to fp32 on this fake CPU)
    cands = preset_candidates(nofp8)
    merged = next(c for c in cands if "fp8" in c.names)
    assert merged.resolved.precision == "fp32" and {"fp8", "mxfp8", "fp32-fused"} <= set(merged.names)
    runs = [Run(cand=c) for c in cands]
    rows = [_rowd(cands[0].name, 1.0, None), _rowd(merged.name, 1.2, [1.1, 1.3])]
    rows[0]["names"], rows[1]["names"] = list(cands[0].names), list(merged.names)
    _, text, _ = _pick(rows, runs)
    assert text.startswith(f"Winner: {merged.name} (the same recipe here as fp32-fused, auto; ")
    assert "fp8, fp8-rowwise, fp8-delayed, mxfp8 asked for fp8, mxfp8 and fell back to this recipe here: fp32 ran" \
        in text and "also named" not in text
    assert same_recipe_text(["fp32-fused"], "fp32") == " (the same recipe here as fp32-fused)"
