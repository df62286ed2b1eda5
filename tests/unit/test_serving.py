"""Serving under a request stream: percentile sufficiency, the Triton batcher simulation, the rate
search, the engines' equality gate, the lazy decode caches, and the Triton repository check.
No test here times anything: service times are given, clocks are fakes."""

import json
import weakref

import numpy as np
import pytest

from overdrive.serve.batcher import (BatcherConfig, ServiceTimes, max_rate_under_slo, search_settings,
                                     serve_arrivals, simulate)
from overdrive.measure.percentiles import aa_floor, latency_summary, min_samples, percentile
from overdrive.measure.threads import load_report


# --- percentiles only from enough samples --------------------------------------------------------------------

def test_min_samples_follow_the_order_statistic_bound():
    assert (min_samples(50), min_samples(95), min_samples(99)) == (6, 72, 368)
    # The bound: with n samples the chance that none lies above the p-quantile is p^n; it must be < 2.5%.
    assert 0.99 ** 368 < 0.025 < 0.99 ** 367
    with pytest.raises(ValueError):
        min_samples(100)


def test_p99_is_not_estimable_below_368_samples():
    xs = list(np.random.default_rng(0).exponential(1.0, 367))
    assert percentile(xs, 99)["value"] is None and percentile(xs, 99)["needs"] == 368
    s = latency_summary(xs)
    assert s["p99"] is None and s["p50"] is not None and "p99 needs 368" in s["note"]
    s = latency_summary(xs + [1.0])
    assert s["p99"] is not None and s["note"] is None
    lo, hi = s["p99_ci"]
    assert lo <= s["p99"] <= hi


def test_percentile_interval_covers_the_true_quantile():
    true = -np.log(0.01)  # the p99 of Exp(1)
    covered = 0
    for seed in range(200):
        st = percentile(np.random.default_rng(seed).exponential(1.0, 400), 99)
        covered += st["lo"] <= true <= st["hi"]
    assert covered >= 0.93 * 200  # a 95% interval (order statistics are conservative: usually ~96%)


def test_host_load_and_aa_floor():
    ld = load_report(read=lambda: 5.0, cores=2)
    assert ld["busy"] and ld["per_core"] == 2.5
    assert not load_report(read=lambda: 1.0, cores=2)["busy"]
    assert load_report(read=lambda: None, cores=2)["load1"] is None  # no /proc/loadavg: said, not guessed
    a = [1.0] * 400
    b = [1.1] * 400
    f = aa_floor(a, b)
    assert f["p50_rel"] == pytest.approx(0.1) and f["p99_rel"] == pytest.approx(0.1)
    assert aa_floor(a[:50], b[:50])["p99_rel"] is None  # p99 of 50 samples: not estimable, no floor claimed


# --- the batcher: Triton's rules on hand-made arrivals --------------------------------------------------------

def _const(ms: float, sizes=(1, 2, 4, 8)) -> ServiceTimes:
    return ServiceTimes({b: [ms] for b in sizes})


def test_delay_waits_for_the_oldest_deadline_or_a_full_batch():
    svc = _const(1.0)
    cfg = BatcherConfig(max_batch_size=4, max_queue_delay_us=1000)
    # Three requests: no full batch, so the batch leaves when the oldest has waited 1 ms.
    assert serve_arrivals(cfg, svc, [0.0, 0.1, 0.2]).tolist() == pytest.approx([2.0, 1.9, 1.8])
    # Four: max_batch_size reached at 0.3 ms, sent at once.
    assert serve_arrivals(cfg, svc, [0.0, 0.1, 0.2, 0.3]).tolist() == pytest.approx([1.3, 1.2, 1.1, 1.0])
    # No delay: each request goes alone while the instance is free; the second waits for the first batch.
    cfg0 = BatcherConfig(max_batch_size=4)
    assert serve_arrivals(cfg0, svc, [0.0, 0.1, 0.2]).tolist() == pytest.approx([1.0, 1.9, 1.8])


def test_preferred_size_is_sent_when_it_can_be_formed():
    svc = _const(1.0)
    cfg = BatcherConfig(max_batch_size=4, preferred_batch_size=(2, 4), max_queue_delay_us=1000)
    # At the deadline 3 are queued: the largest preferred size that fits (2) goes, the third waits its turn.
    assert serve_arrivals(cfg, svc, [0.0, 0.1, 0.2]).tolist() == pytest.approx([2.0, 1.9, 2.8])


def test_a_batch_between_measured_sizes_costs_the_interpolated_quantile():
    rng = np.random.default_rng(7)
    s1, s4 = rng.uniform(0.5, 1.5, 50), rng.uniform(2.0, 4.0, 80)
    svc = ServiceTimes({1: s1, 4: s4})
    for u in rng.random(20):
        q1, q4 = np.sort(s1)[int(u * 50)], np.sort(s4)[int(u * 80)]
        assert svc.quantile(1, u) == q1 and svc.quantile(4, u) == q4          # measured: that sample's rank
        assert svc.quantile(3, u) == pytest.approx(q1 + (q4 - q1) * 2 / 3)   # between: the same quantile, interpolated
    assert svc.median(2) == pytest.approx(np.median(s1) + (np.median(s4) - np.median(s1)) / 3)
    assert svc.capacity(2) == pytest.approx(2 / svc.median(2) * 1e3)
    # A uniform u over a measured size is a uniform draw of its samples.
    assert sorted(svc.quantile(4, (k + 0.5) / 80) for k in range(80)) == sorted(s4.tolist())
    # Below the smallest measured size: what that size cost (an upper bound).
    assert ServiceTimes({4: [3.0]}).quantile(2, 0.3) == 3.0
    # Two requests between measured sizes 1 (1 ms) and 4 (3 ms) cost 1 + 2/3 ms.
    cfg = BatcherConfig(max_batch_size=4, max_queue_delay_us=1000)
    svc = ServiceTimes({1: [1.0], 4: [3.0]})
    assert serve_arrivals(cfg, svc, [0.0, 0.1]).tolist() == pytest.approx([1 + 5 / 3, 0.9 + 5 / 3])
    with pytest.raises(ValueError, match="above the largest measured"):
        serve_arrivals(BatcherConfig(max_batch_size=8), svc, [0.0])
    with pytest.raises(ValueError, match="above the largest measured"):
        svc.quantile(5, 0.5)
    with pytest.raises(ValueError, match="preferred_batch_size"):
        BatcherConfig(max_batch_size=4, preferred_batch_size=(8,))


def test_two_instances_serve_in_parallel():
    svc = _const(1.0)
    one = serve_arrivals(BatcherConfig(max_batch_size=1), svc, [0.0, 0.0])
    two = serve_arrivals(BatcherConfig(max_batch_size=1, instances=2), svc, [0.0, 0.0])
    assert one.tolist() == [1.0, 2.0] and two.tolist() == [1.0, 1.0]


def test_simulation_is_deterministic_and_p99_grows_with_rate():
    svc = ServiceTimes({b: list(np.random.default_rng(b).uniform(0.2, 0.4, 50) + 0.01 * b) for b in (1, 2, 4, 8)})
    cfg = BatcherConfig(max_batch_size=8, max_queue_delay_us=200)
    a, b = simulate(cfg, svc, 2000.0, seed=3), simulate(cfg, svc, 2000.0, seed=3)
    assert np.array_equal(a, b) and len(a) == 3600  # 4000 requests, the first 10% dropped
    p99 = [np.percentile(simulate(cfg, svc, r, seed=3), 99) for r in (500.0, 5000.0, 15000.0)]
    assert p99[0] < p99[1] < p99[2]


def test_max_rate_under_slo_sits_at_the_slo():
    svc = _const(1.0, sizes=(1,))  # M/D/1 with 1 ms service: p99 passes 5 ms below 1000 req/s
    cfg = BatcherConfig(max_batch_size=1)
    r = max_rate_under_slo(cfg, svc, 5.0, seed=0)
    assert 300 < r < 1000
    assert np.percentile(simulate(cfg, svc, r, seed=0), 99) <= 5.0
    assert np.percentile(simulate(cfg, svc, r * 1.1, seed=0), 99) > 5.0
    assert max_rate_under_slo(cfg, svc, 0.5) is None  # the service alone exceeds the SLO


def test_meets_slo_is_the_p99_test_with_an_early_answer():
    """The rate search's early stop never changes its answer: on fresh random service times, settings,
    rates (some past capacity) and SLOs, meets_slo == (p99 of simulate <= SLO)."""
    from overdrive.serve.batcher import meets_slo

    rng = np.random.default_rng(11)
    misses = 0
    for t in range(60):
        sizes = (1, 4, 16, 64)
        svc = ServiceTimes({b: (0.2 + 0.02 * b) * rng.lognormal(0, rng.uniform(0.05, 0.8), 200) for b in sizes})
        cfg = BatcherConfig(max_batch_size=int(rng.choice(sizes)), max_queue_delay_us=int(rng.choice([0, 250, 1000])))
        rate = svc.capacity(cfg.max_batch_size) * rng.uniform(0.05, 1.2)
        slo = float(rng.uniform(0.5, 6))
        want = float(np.percentile(simulate(cfg, svc, rate, seed=t), 99)) <= slo
        assert meets_slo(cfg, svc, rate, slo, seed=t) == want, (t, cfg, rate, slo)
        misses += not want
    assert 10 < misses < 50  # both answers were exercised


def test_search_prefers_batching_when_batches_are_cheap():
    # 1 ms for one request, 1.5 ms for eight: batching multiplies capacity.
    svc = ServiceTimes({1: [1.0], 2: [1.1], 4: [1.2], 8: [1.5]})
    res = search_settings(svc, 5.0, requests=1000)
    best = res["best"]
    assert best["config"]["max_batch_size"] == 8 and best["rate"] > 2000
    assert all(t["rate"] is None or t["rate"] <= best["rate"] for t in res["tried"])
    with pytest.raises(ValueError, match="cannot estimate a p99"):
        search_settings(svc, 5.0, requests=100)


# --- the serving summary and the engines' equality gate (fake engines, no timing asserted) --------------------

class FakeHost:
    """A fake clock with contention: every 20 ms of fake time the host is busy with probability `busy_p`
    (calls then take `busy_x` times as long), each call has 5% exponential jitter and, with probability
    `spike_p`, a preemption of 2-6 ms. Engines' costs in ms: costs[name](batch). No real time passes."""

    def __init__(self, seed: int, costs: dict, *, busy_p: float = 0.1, busy_x: float = 1.5, spike_p: float = 0.0,
                 sigma: float = 0.03) -> None:
        self.rng = np.random.default_rng(seed)
        self.costs, self.busy_p, self.busy_x, self.spike_p, self.sigma = costs, busy_p, busy_x, spike_p, sigma
        self.t, self.slot, self.mult, self.last = 0.0, -1, 1.0, None

    def engine(self, name: str):
        from overdrive.serve.engines import Engine

        def run(b):
            self.last = (name, b)
            return np.zeros((b, 1))

        return Engine(name, name, run)

    def timer(self, fn) -> float:
        fn()
        if int(self.t // 20) != self.slot:  # a new 20 ms slot: busy or not, and its drift
            self.slot = int(self.t // 20)
            self.mult = np.exp(self.rng.normal(0, self.sigma)) * (self.busy_x if self.rng.random() < self.busy_p else 1)
        name, b = self.last
        ms = self.costs[name](b) * self.mult * (1 + self.rng.exponential(0.05))
        if self.rng.random() < self.spike_p:
            ms += self.rng.uniform(2, 6)
        self.t += ms
        return ms


def _fake_run(seed: int, costs: dict, batches=(1, 4, 16), slo_ms: float = 5.0, **host) -> dict:
    from overdrive.serve.engines import measure_service
    from overdrive.serve.serving import summarize_serving

    h = FakeHost(seed, costs, **host)
    engines = [h.engine(n) for n in costs]
    m = measure_service(engines, list(batches), rounds=10, reps=40, timer=h.timer, seed=seed)
    return summarize_serving(m, engines, slo_ms, requests=1000, resamples=20, seed=0, curve=False, delays_us=(0, 500))


def test_summarize_serving_reports_rates_intervals_settings_load_and_floor():
    from overdrive.serve.engines import Engine
    from overdrive.serve.serving import summarize_serving

    rng = np.random.default_rng(0)

    def rounds(base, per):
        return {b: [list((base + per * b) * (1 + rng.exponential(0.05, 40))) for _ in range(10)] for b in (1, 4)}

    engines = [Engine("eager", "eager", lambda b: None), Engine("onnxruntime", "ORT", lambda b: None),
               Engine("compiled", "torch.compile", None, "unavailable", "no compiler")]
    busy = {"load1": 9.0, "cores": 2, "per_core": 4.5, "busy": True}
    twin = rounds(1.0, 0.0)[1]
    m = {"samples": {"eager": rounds(0.5, 0.1), "onnxruntime": rounds(0.2, 0.02)},
         "aa": [{"of": "eager at batch 1", "batch": 1, "a": twin, "b": [[x * 1.01 for x in r] for r in twin],
                 "rate_check": True}]}
    out = summarize_serving(m, engines, 5.0, loads=(busy, busy), requests=1000, resamples=10)
    ort, eager = out["engines"]["onnxruntime"], out["engines"]["eager"]
    assert out["verdict"] == "given" and ort["verdict"] == "given" and eager["verdict"] == "given"
    assert out["winner"] == "onnxruntime" and ort["best"]["ci"][0] > eager["best"]["ci"][1]
    lo, hi = ort["best"]["ci"]
    assert lo < ort["best"]["rate"] < hi and ort["best"]["stability"] >= 0.9
    assert out["engines"]["compiled"]["status"] == "unavailable" and not out["engines"]["compiled"]["best"]
    pair = out["noise_floor"]["pairs"][0]
    assert pair["p50_rel"] == pytest.approx(0.01, abs=1e-3) and pair["round_floor"]["rounds"] == 10
    assert pair["rate_ratio"] == pytest.approx(1.01, abs=0.03)
    assert "host busy" in out["text"] and "req/s [" in out["text"]
    pts = ort["curve"]["points"]
    assert [p["rate"] for p in pts] == sorted(p["rate"] for p in pts)
    json.dumps(out, allow_nan=False)  # results.json must hold it, as strict JSON (no Infinity)


def _ort_only(svc, a, b, ld):
    """summarize_serving for one ORT engine and one A/A pair at batch 1 (a and b: the twins' rounds)."""
    from overdrive.serve.engines import Engine
    from overdrive.serve.serving import summarize_serving

    return summarize_serving({"samples": {"onnxruntime": svc}, "aa": [{"of": "eager at batch 1", "batch": 1, "a": a,
                                                                        "b": b}]},
                             [Engine("onnxruntime", "ORT", lambda b: None)], 5.0, loads=(ld, ld), requests=1000,
                             resamples=5, curve=False)


def test_a_host_whose_aa_control_is_too_wide_gives_no_verdict():
    rng = np.random.default_rng(1)
    svc = {b: [list((0.2 + 0.02 * b) * (1 + rng.exponential(0.05, 40))) for _ in range(10)] for b in (1, 4)}
    # The twin's rounds swing by up to 2x against the baseline's: noise alone moves timings beyond ±15%.
    a = [[1.0] * 40 for _ in range(10)]
    b = [[1.0 * (2.0 if k % 2 else 0.6)] * 40 for k in range(10)]
    ld = {"load1": 5.2, "cores": 2, "per_core": 2.6, "busy": True}
    out = _ort_only(svc, a, b, ld)
    row = out["engines"]["onnxruntime"]
    assert out["verdict"] == "withheld" and row["verdict"] == "withheld" and row["best"] is None
    assert out["withheld"].startswith("too busy to judge") and "load 5.2 -> 5.2 on 2 cores" in out["withheld"]
    assert "A/A spread ±" in out["withheld"] and out["text"].startswith("no verdict: too busy")
    assert row["estimate"]["rate"] > 0  # the figures are kept, as figures, not as a recommendation
    json.dumps(out, allow_nan=False)


# Two engines: ORT's service times 1.6x eager's speed. Costs in ms per batch size.
_EAGER = lambda b: 0.2 + 0.05 * b  # noqa: E731
_ORT = lambda b: (0.2 + 0.05 * b) / 1.6  # noqa: E731


@pytest.mark.slow  # 2 x 200 fake runs x (rate search + 20 bootstrap resamples): ~20 s and ~90 s on 2 cores
@pytest.mark.parametrize("host", [dict(busy_p=0.1, busy_x=1.5), dict(busy_p=0.2, busy_x=2.0, spike_p=0.002)],
                         ids=["some-contended-slots", "busy-with-preemptions"])
def test_two_runs_under_per_round_contention_never_contradict(host):
    from overdrive.serve.serving import agree

    given = withheld = 0
    for s in range(200):
        a, b = _fake_run(2 * s, {"eager": _EAGER}, **host), _fake_run(2 * s + 1, {"eager": _EAGER}, **host)
        res = agree(a, b)
        assert res["contradictions"] == 0, (s, res)
        st = res["engines"]["eager"]["status"]
        assert st in ("agree", "withheld")
        given += st == "agree"
        withheld += st == "withheld"
    # Not a test that passes by always withholding: under some contention most pairs give a verdict.
    if host.get("spike_p", 0) == 0:
        assert given >= 50


def test_two_runs_agree_and_a_real_difference_is_found():
    from overdrive.serve.serving import agree

    found = 0
    for s in range(6):
        a = _fake_run(2 * s, {"eager": _EAGER, "onnxruntime": _ORT}, busy_p=0.05)
        b = _fake_run(2 * s + 1, {"eager": _EAGER, "onnxruntime": _ORT}, busy_p=0.05)
        assert agree(a, b)["contradictions"] == 0
        for r in (a, b):
            if r["winner"]:
                assert r["winner"] == "onnxruntime"  # never the slower engine
                found += 1
    assert found >= 10  # of 12 runs, the 1.6x difference is called in (nearly) all


def test_agree_calls_different_settings_or_disjoint_intervals_a_contradiction():
    from overdrive.serve.serving import agree

    cfg = {"max_batch_size": 16, "preferred_batch_size": [], "max_queue_delay_us": 0, "instances": 1}

    def res(rate, ci, c=cfg, withheld=None):
        return {"engines": {"ort": {"status": "ok", "withheld": withheld,
                                    "best": None if withheld else {"rate": rate, "ci": ci, "config": c}}}}

    assert agree(res(100, [90, 110]), res(105, [100, 112]))["engines"]["ort"]["status"] == "agree"
    r = agree(res(100, [90, 110]), res(130, [120, 140]))
    assert r["contradictions"] == 1 and "intervals" in r["engines"]["ort"]["why"]
    other = {**cfg, "max_queue_delay_us": 500}
    r = agree(res(100, [90, 110]), res(100, [90, 110], c=other))
    assert r["contradictions"] == 1 and "settings" in r["engines"]["ort"]["why"]
    # ... unless each run's evidence accepts the other's setting: its rate there reaches the interval's lower end
    a, b = res(100, [90, 110]), res(100, [90, 110], c=other)
    a["engines"]["ort"]["best"]["settings"] = [{"config": cfg, "rate": 100}, {"config": other, "rate": 95}]
    b["engines"]["ort"]["best"]["settings"] = [{"config": other, "rate": 100}, {"config": cfg, "rate": 92}]
    r = agree(a, b)
    assert r["contradictions"] == 0 and r["engines"]["ort"]["status"] == "agree"
    assert "accepted by the other run" in r["engines"]["ort"]["why"]
    b["engines"]["ort"]["best"]["settings"][1]["rate"] = 80  # run b measured a's setting below its interval
    assert agree(a, b)["contradictions"] == 1
    assert agree(res(100, [90, 110]), res(0, None, withheld="too busy"))["engines"]["ort"]["status"] == "withheld"
    # The same engines at the same batches 25% slower in the second run: the host moved, not the method.
    slow_a, slow_b = res(100, [90, 110]), res(70, [65, 75])
    slow_a["engines"]["ort"]["service"] = {"1": {"p50": 0.40}, "64": {"p50": 1.00}, "256": {"p50": 2.0}}
    slow_b["engines"]["ort"]["service"] = {"1": {"p50": 0.51}, "64": {"p50": 1.24}, "256": {"p50": 2.5}}
    r = agree(slow_a, slow_b)
    assert r["contradictions"] == 0 and r["engines"]["ort"]["status"] == "host-changed"
    assert r["host_shift"]["pct"] == pytest.approx(25.0, abs=1.0) and "25% slower" in r["engines"]["ort"]["why"]
    slow_b["engines"]["ort"]["service"] = {"1": {"p50": 0.41}, "64": {"p50": 1.03}, "256": {"p50": 2.1}}
    assert agree(slow_a, slow_b)["contradictions"] == 1  # 3% apart: judged, and the intervals are disjoint


def test_a_busy_round_is_set_aside_not_pooled():
    from overdrive.serve.verdict import _levels, _trim

    rounds = {1: [[1.0] * 5] * 9 + [[3.0] * 5], 4: [[2.0] * 5] * 9 + [[6.0] * 5]}
    lv = _levels(rounds)
    kept = _trim(np.arange(10), lv)
    assert 9 not in kept and len(kept) == 6  # the 2 slowest and 2 fastest of 10 set aside


def test_an_engine_that_differs_is_never_timed():
    from overdrive.serve.engines import Engine, check_engines, measure_service

    calls = {"bad": 0}
    ref = {1: np.array([[0.5]]), 4: np.full((4, 1), 0.25)}

    def bad(b):
        calls["bad"] += 1
        return ref[b] + 1e-3

    engines = [Engine("eager", "eager", lambda b: ref[b]), Engine("onnxruntime", "ORT", lambda b: ref[b] + 1e-7),
               Engine("compiled", "compiled", bad)]
    check_engines(engines, [1, 4])
    assert engines[1].status == "ok" and engines[2].status == "failed" and "max abs error" in engines[2].reason
    seen = calls["bad"]
    m = measure_service(engines, [1, 4], rounds=2, reps=3, min_round_ms=0)
    assert calls["bad"] == seen  # not called again: no timing of a wrong engine
    assert set(m["samples"]) == {"eager", "onnxruntime"}
    assert all(len(rs) == 2 and all(len(r) == 3 for r in rs) for e in m["samples"].values() for rs in e.values())
    # twins of eager at the smallest and largest batch, and of every other engine at the smallest (its own control)
    assert [p["of"] for p in m["aa"]] == ["eager at batch 1", "eager at batch 4", "onnxruntime at batch 1"]
    assert all(len(p["a"]) == 2 and len(p["b"][0]) == 3 for p in m["aa"])


def test_short_calls_get_more_calls_per_round_and_twins_as_many_as_their_key():
    from overdrive.serve.engines import MAX_REP_FACTOR, Engine, measure_service

    cost = {("eager", 1): 0.05, ("eager", 4): 2.0, ("onnxruntime", 1): 0.5, ("onnxruntime", 4): 1e-4}
    now = {}

    def engine(name):
        return Engine(name, name, lambda b: now.update(key=(name, b)))

    def timer(fn):
        fn()
        return cost[now["key"]]

    m = measure_service([engine("eager"), engine("onnxruntime")], [1, 4], rounds=2, reps=30, timer=timer,
                        min_round_ms=20)
    # 20 ms of calls per round: 400 of 0.05 ms, 40 of 0.5 ms; never fewer than reps, never more than 20 x reps.
    assert m["reps_per_key"] == {"eager@1": 400, "eager@4": 30, "onnxruntime@1": 40,
                                 "onnxruntime@4": 30 * MAX_REP_FACTOR, "eager#A@1": 400, "eager#B@1": 400, "eager#A@4": 30,
                                 "eager#B@4": 30, "onnxruntime#A@1": 40, "onnxruntime#B@1": 40}
    assert [len(r) for r in m["samples"]["eager"][1]] == [400, 400]
    assert [(len(p["a"][0]), len(p["b"][0])) for p in m["aa"]] == [(400, 400), (30, 30), (40, 40)]


# --- decode caches: built per batch, bounded by memory, freed between batches ----------------------------------

class _Accountant:
    """Counts the bytes of live fake KV caches (freed when the last reference goes)."""

    def __init__(self, free: int) -> None:
        self.free, self.live, self.peak = free, 0, 0

    def alloc(self, n: int):
        class Cache:
            pass

        c = Cache()
        self.live += n
        self.peak = max(self.peak, self.live)
        weakref.finalize(c, self._free, n)
        return c

    def _free(self, n: int) -> None:
        self.live -= n


def test_decode_caches_are_built_per_batch_and_freed():
    from overdrive.bench.workloads.inference import decode_per_batch

    per = lambda m, b: b * 1000  # noqa: E731 — bytes of one mode's caches at batch b
    acc = _Accountant(free=300_000)
    live_during, live_before = [], []

    def build(mode, b):
        if mode == "fp32":
            live_before.append(acc.live)  # the previous batch's caches are gone before this one's are built
        cache = acc.alloc(per(mode, b))
        return (lambda c=cache: None), cache

    def measure(calls):
        live_during.append(acc.live)
        return {k: {"p50": 1.0} for k in calls}

    out = decode_per_batch(["fp32", "bf16"], (1, 8, 64, 256), build=build, cache_bytes=per,
                           free_bytes=lambda: acc.free - acc.live, measure=measure, release=lambda: None)
    # Only one batch's caches (both modes) were ever alive; batch 256 (256 kB > 80% of 300 kB) was not built.
    assert live_during == [2 * 1000, 2 * 8000, 2 * 64000] and live_before == [0, 0, 0]
    assert acc.peak == 2 * 64000 and acc.live == 0
    assert out[("fp32", 256)].startswith("skipped: KV caches of batch 256 need")
    assert out[("bf16", 64)] == {"p50": 1.0}


def test_decode_modes_that_do_not_fit_together_are_measured_one_group_after_another():
    from overdrive.bench.workloads.inference import decode_per_batch

    per = lambda m, b: b * 1000  # noqa: E731
    acc = _Accountant(free=300_000)
    groups = []

    def build(mode, b):
        cache = acc.alloc(per(mode, b))
        return (lambda c=cache: None), cache

    def measure(calls):
        groups.append((sorted(m for m, _ in calls), acc.live))
        return {k: {"p50": 1.0} for k in calls}

    out = decode_per_batch(["a", "b"], (64, 256), build=build, cache_bytes=per, free_bytes=lambda: acc.free - acc.live,
                           measure=measure, release=lambda: None)
    # Batch 64: both fit (128 kB <= 240 kB), interleaved. Batch 256: one mode (256 kB) > 240 kB: skipped, said.
    assert groups == [(["a", "b"], 128_000)] and out[("a", 256)].startswith("skipped")
    acc2 = _Accountant(free=400_000)
    groups.clear()
    out = decode_per_batch(["a", "b"], (256,), build=build, cache_bytes=per, free_bytes=lambda: acc2.free,
                           measure=measure, release=lambda: None)
    # 256 kB each, 320 kB budget: one mode at a time, each measured alone and freed before the next.
    assert [g for g, _ in groups] == [["a"], ["b"]] and all(live == 256_000 for _, live in groups)
    assert out[("b", 256)] == {"p50": 1.0}


def test_decode_mode_that_fails_to_build_is_a_result():
    from overdrive.bench.workloads.inference import decode_per_batch

    def build(mode, b):
        if mode == "bf16":
            raise RuntimeError("out of memory")
        return (lambda: None), object()

    out = decode_per_batch(["fp32", "bf16"], (1,), build=build, cache_bytes=lambda m, b: 1, free_bytes=lambda: 10**9,
                           measure=lambda calls: {k: {"p50": 1.0} for k in calls}, release=lambda: None)
    assert out[("bf16", 1)].startswith("failed: RuntimeError") and out[("fp32", 1)] == {"p50": 1.0}


def test_slo_verdict_needs_an_estimable_p99():
    from overdrive.bench.workloads.inference import _slo_verdict, _summarize

    assert _slo_verdict({"p50": 1.0, "p95": 2.0, "p99": 3.0}, 5.0) == "meets"
    assert _slo_verdict({"p50": 1.0, "p95": 2.0, "p99": None}, 5.0) == "unknown"
    assert _slo_verdict({"p50": 6.0, "p95": 7.0, "p99": None}, 5.0) == "misses"  # p99 >= p50 > SLO
    stats = {("m", 1): {"p50": 1.0, "p95": 2.0, "p99": 3.0, "n": 400},
             ("m", 8): {"p50": 1.5, "p95": 2.0, "p99": None, "n": 40}}
    out = _summarize(stats, {"m": None}, (1, 8), 5.0, "examples/s")
    assert out["modes"]["m"]["slo_batch"] == 1 and out["modes"]["m"]["batches"]["8"]["slo"] == "unknown"


def test_report_page_plots_latency_against_rate_with_the_slo(tmp_path):
    from rich.console import Console

    from overdrive.report.latency_view import render_latency, write_latency_report
    from overdrive.serve.engines import Engine
    from overdrive.serve.serving import summarize_serving

    svc = {b: [[0.2 + 0.02 * b] * 40] * 10 for b in (1, 4)}
    ld = {"load1": 0.5, "cores": 2, "per_core": 0.25, "busy": False}
    sv = summarize_serving({"samples": {"onnxruntime": svc}, "aa": [{"of": "eager at batch 1", "batch": 1,
                                                                     "a": [[1.0] * 10] * 5, "b": [[1.0] * 10] * 5}]},
                           [Engine("onnxruntime", "ONNX Runtime (CPU EP)", lambda b: None)], 5.0, loads=(ld, ld),
                           requests=1000, resamples=5)
    r = {"schema": "overdrive.latency/1", "device": "CPU (test)", "created": "now", "git_commit": "abc", "slo_ms": 5.0,
         "workloads": {}, "serving": sv, "recommendation": {"text": sv["text"]}}
    files = write_latency_report(r, str(tmp_path))
    assert [f.rsplit("/", 1)[1] for f in files] == ["latency_vs_rate.png", "report.html"]
    page = (tmp_path / "report.html").read_text()
    assert "Click model under a request stream" in page and "max_batch_size" in page
    assert "host load (1 min) 0.5 before" in page and "±0.0% per round over 5 rounds" in page
    assert "overdrive export --model recsys --slo-from" in page
    con = Console(record=True, width=220)
    render_latency(r, con)
    text = con.export_text()
    assert "highest rate" in text and "onnxruntime" in text


def test_serving_threads_follow_the_load():
    from overdrive.serve.serving import serving_threads

    assert serving_threads({"busy": False, "load1": 0.3, "cores": 16}, 16)[0] == 8  # half: headroom for the p99
    assert serving_threads({"busy": False, "load1": 0.2, "cores": 2}, 2)[0] == 1  # idle 2 cores: 2 threads, 8 ms p99
    n, why = serving_threads({"busy": True, "load1": 18.0, "cores": 2}, 2)
    assert n == 1 and "load 18.0 on 2 cores" in why
    assert serving_threads({"busy": True, "load1": 3.0, "cores": 2}, 2)[0] == 1  # two hogs and this process


def test_a_finding_that_rests_on_tail_samples_is_withheld():
    from overdrive.serve.serving import engine_verdict

    rng = np.random.default_rng(3)
    # 1 ms for one request; about 1 call in 100 preempted for 6 ms, unevenly over the rounds: the p99 sits on them.
    rounds = {1: [list(np.where(rng.random(40) < 0.01 * (k % 3), 6.0, 1.0)) for k in range(10)]}
    v = engine_verdict(rounds, 5.0, requests=1000, resamples=20)
    assert v["fragile"] and v["fragile"].startswith("fragile")
    steady = {1: [[1.0] * 40 for _ in range(10)]}
    assert engine_verdict(steady, 5.0, requests=1000, resamples=5)["fragile"] is None


def test_the_setting_that_holds_is_chosen_and_an_edge_of_the_slo_is_no_verdict():
    """Batch 4 is the fastest on the pooled rounds (2,847 req/s), but 4 of 20 rounds hold two 8 ms calls:
    a resample that draws them often misses the SLO far lower (batch 4 holds ~2,200 in 90% of
    resamples). Batch 1 never misses. With batch 1 within 5% of batch 4, batch 1 is recommended (it
    holds); with batch 1 16% slower, no verdict (the fastest rests on a few slow calls: a repeated run
    could recommend either)."""
    from overdrive.serve.serving import engine_verdict

    def rounds(ms1):
        rng = np.random.default_rng(5)
        r4 = [list(1.1 * (1 + rng.exponential(0.03, 30))) for _ in range(20)]
        for k in (3, 8, 13, 18):
            r4[k][:2] = [8.0, 8.0]
        return {1: [list(ms1 * (1 + rng.exponential(0.03, 30))) for _ in range(20)], 4: r4}

    far = engine_verdict(rounds(0.33), 5.0, requests=1000, resamples=20, delays_us=(0,))
    assert far["config"]["max_batch_size"] == 1 and far["fragile"], far
    assert far["fragile"].startswith("fragile: 4/[]/0µs (2,847 req/s on the pooled samples, holds")
    assert "beyond its interval" in far["fragile"]
    near = engine_verdict(rounds(0.285), 5.0, requests=1000, resamples=20, delays_us=(0,))
    assert near["config"]["max_batch_size"] == 1 and near["fragile"] is None, near
    assert [e["max_batch_size"] for e in near["equivalent"]] == [1]  # batch 4 holds far less: not the same answer
    assert near["held"] <= near["rate"] and near["ci"][0] < near["rate"] < near["ci"][1]


def test_a_quiet_host_whose_every_answer_is_fragile_is_no_verdict_either():
    """The run's own verdict follows its engines': a steady A/A but only fragile answers is "withheld" with
    its reason, never "given" (export --slo-from reads it)."""
    rng = np.random.default_rng(2)
    # every other round is preempted past the SLO: whether a setting holds depends on which rounds are drawn
    svc = {b: [list((0.2 + 0.02 * b) * (1 + rng.exponential(0.05, 40)) + (8.0 if k % 2 else 0.0)) for k in range(10)]
           for b in (1, 4)}
    a = [list(1.0 + rng.exponential(0.01, 40)) for _ in range(10)]
    b = [list(1.0 + rng.exponential(0.01, 40)) for _ in range(10)]
    ld = {"load1": 0.3, "cores": 2, "per_core": 0.15, "busy": False}
    out = _ort_only(svc, a, b, ld)
    row = out["engines"]["onnxruntime"]
    assert not out["noise_floor"]["busy"] and row["verdict"] == "withheld" and row["best"] is None
    assert out["verdict"] == "withheld" and "no engine's answer held" in out["withheld"]


def test_each_engine_is_judged_against_its_own_control():
    """One eager batch-1 twin pair split by a few slow calls withholds eager's verdict only, with that reason;
    ONNX Runtime, whose own twins agree, keeps its verdict (it used to withhold every engine, quoting a
    per-round spread that was inside the limit)."""
    from overdrive.serve.engines import Engine
    from overdrive.serve.serving import summarize_serving

    rng = np.random.default_rng(3)

    def rounds(base, per, n=40):
        return {b: [list((base + per * b) * (1 + rng.exponential(0.05, n))) for _ in range(10)] for b in (1, 4)}

    calm = [list(1.0 * (1 + rng.exponential(0.03, 40))) for _ in range(10)]
    spiky = [[x if (k * 40 + i) % 25 else 6.0 for i, x in enumerate(r)] for k, r in enumerate(calm)]  # 4% at 6 ms
    ort = rounds(0.2, 0.02)[1]
    m = {"samples": {"eager": rounds(0.5, 0.1), "onnxruntime": rounds(0.2, 0.02)},
         "aa": [{"of": "eager at batch 1", "engine": "eager", "batch": 1, "a": calm, "b": spiky, "rate_check": True},
                {"of": "onnxruntime at batch 1", "engine": "onnxruntime", "batch": 1, "a": ort,
                 "b": [[x * 1.01 for x in r] for r in ort], "rate_check": True}]}
    ld = {"load1": 3.0, "cores": 2, "per_core": 1.5, "busy": True}
    engines = [Engine("eager", "eager", lambda b: None), Engine("onnxruntime", "ORT", lambda b: None)]
    out = summarize_serving(m, engines, 5.0, loads=(ld, ld), requests=1000, resamples=10, curve=False)
    eager, onnx = out["engines"]["eager"], out["engines"]["onnxruntime"]
    assert onnx["verdict"] == "given" and onnx["best"]["rate"] > 0 and onnx["control"] == "onnxruntime"
    assert eager["verdict"] == "withheld" and eager["best"] is None
    assert eager["withheld"].startswith("too busy to judge: eager at batch 1: one twin met the SLO")
    assert out["verdict"] == "given" and not out["withheld"]
    assert out["winner"] is None  # eager was not judged: ORT cannot be called the winner over it
    assert "onnxruntime: " in out["text"] and "req/s [" in out["text"] and "eager: no verdict: too busy" in out["text"]


def test_a_withheld_page_is_not_green_names_the_users_model_and_wraps_its_reasons(tmp_path):
    """No verdict: the first line is not drawn as a result; the next step exports the model the bench measured
    (not `--model recsys`); the reason cells wrap instead of pushing the table past a 1280 px page."""
    from overdrive.report.latency_view import write_latency_report
    from overdrive.serve.engines import Engine
    from overdrive.serve.serving import summarize_serving

    svc = {b: [[0.2 + 0.02 * b] * 40] * 10 for b in (1, 4)}
    a = [[1.0] * 40 for _ in range(10)]
    b = [[1.0 * (2.0 if k % 2 else 0.6)] * 40 for k in range(10)]
    ld = {"load1": 5.2, "cores": 2, "per_core": 2.6, "busy": True}
    sv = summarize_serving({"samples": {"onnxruntime": svc}, "aa": [{"of": "onnxruntime at batch 1", "batch": 1,
                                                                     "engine": "onnxruntime", "a": a, "b": b}]},
                           [Engine("onnxruntime", "ONNX Runtime (CPU EP)", lambda b: None)], 5.0, loads=(ld, ld),
                           requests=1000, resamples=5, curve=False)
    assert sv["verdict"] == "withheld" and "onnxruntime at batch 1: the twins' per-round interval" in sv["withheld"]
    sv["model_identity"] = {"given": {"factory": "ranker.py:make", "inputs": "ranker.py:example", "dynamic": ["ids:1"]}}
    r = {"schema": "overdrive.latency/1", "device": "CPU (test)", "created": "now", "git_commit": "abc", "slo_ms": 5.0,
         "workloads": {}, "serving": sv, "recommendation": {"text": sv["text"]}}
    write_latency_report(r, str(tmp_path))
    page = (tmp_path / "report.html").read_text()
    assert "<p class='rec none'>" in page and "<p class='rec'>" not in page
    assert "overdrive export --model ranker.py:make --inputs ranker.py:example --dynamic ids:1 --max-batch N" in page
    assert "--model recsys" not in page
    assert "<td class='w'>no verdict: too busy" in page and "td.w{white-space:normal" in page


def test_a_rate_that_some_resamples_lose_says_so_not_zero_to_infinity():
    """The ONNX Runtime row of a user's bench read "the rate is known only to [0, inf] req/s": the real reason is
    that some resamples of the rounds met the SLO at no rate."""
    from overdrive.serve.serving import engine_verdict

    rng = np.random.default_rng(1)
    rounds = {1: [list(np.where(rng.random(40) < 0.004 * (k % 3), 6.0, 1.0)) for k in range(10)]}
    v = engine_verdict(rounds, 5.0, requests=1000, resamples=20)
    assert v["ci"][0] == 0.0 and "[0, inf]" not in v["fragile"]
    assert v["fragile"].startswith("fragile: in 1 of 20 resamples of the 10 rounds the recommended setting")


def test_the_runs_no_verdict_names_each_engines_own_reason():
    from overdrive.serve.engines import Engine
    from overdrive.serve.serving import summarize_serving

    rng = np.random.default_rng(1)
    svc = {1: [list(np.where(rng.random(40) < 0.004 * (k % 3), 6.0, 1.0)) for k in range(10)]}
    calm = [[1.0] * 40 for _ in range(10)]
    swing = [[1.0 * (2.0 if k % 2 else 0.6)] * 40 for k in range(10)]
    ld = {"load1": 5.0, "cores": 2, "per_core": 2.5, "busy": True}
    m = {"samples": {"eager": {1: calm}, "onnxruntime": svc},
         "aa": [{"of": "eager at batch 1", "engine": "eager", "batch": 1, "a": calm, "b": swing},
                {"of": "onnxruntime at batch 1", "engine": "onnxruntime", "batch": 1, "a": calm, "b": calm}]}
    out = summarize_serving(m, [Engine("eager", "eager", None), Engine("onnxruntime", "ORT", None)], 5.0,
                            loads=(ld, ld), requests=1000, resamples=20, curve=False)
    why = out["withheld"]
    assert out["verdict"] == "withheld" and why.startswith("no engine's answer held: eager: too busy to judge: eager at")
    assert "; onnxruntime: fragile: in " in why and "met the SLO at no rate" in why
    assert why.count("load 5.0 -> 5.0 on 2 cores") == 1  # the figures once, at the end
