"""The real-server bench's pure parts: the open-loop client's arrival process and bounds, Triton's
statistics between two readings, the rate search, and the setting taken from the simulation."""

import numpy as np
import pytest

from overdrive.serve.triton_bench import meets, next_rate, ort_setting
from overdrive.serve.triton_client import MAX_REQUESTS, poisson_arrivals, requests_for, stats_delta


def test_poisson_arrivals_have_exponential_gaps_at_the_rate():
    t = poisson_arrivals(2000.0, 20000, seed=3)
    gaps = np.diff(np.concatenate([[0.0], t]))
    assert np.all(gaps > 0) and np.all(np.diff(t) > 0)
    assert abs(gaps.mean() * 2000 - 1) < 0.03  # mean gap 1/rate (20k samples: sd of the mean 0.7%)
    assert abs(gaps.std() / gaps.mean() - 1) < 0.05  # exponential: coefficient of variation 1 (a fixed pace has 0)
    assert abs(np.mean(gaps > 2 / 2000) - np.exp(-2)) < 0.01  # P(gap > 2/rate) = e^-2
    assert np.array_equal(t, poisson_arrivals(2000.0, 20000, seed=3))  # seeded: the same stream twice
    with pytest.raises(ValueError):
        poisson_arrivals(0.0, 10)


def test_requests_per_rate_are_bounded_and_enough_for_a_p99():
    assert requests_for(10.0) == 460  # a slow rate still sends enough for a p99 (368 + margin)
    assert requests_for(1000.0) == 4000 and requests_for(1e6) == MAX_REQUESTS
    assert requests_for(50.0, seconds=100.0) == 1000  # never more than MAX_SECONDS (20 s) of the stream


def _stats(success, queue_ns, infer_ns, execs, batches):
    return {"execution_count": execs, "inference_stats": {
        "success": {"count": success, "ns": 0}, "fail": {"count": 0, "ns": 0}, "queue": {"count": success, "ns": queue_ns},
        "compute_infer": {"count": success, "ns": infer_ns}},
        "batch_stats": [{"batch_size": b, "compute_infer": {"count": n, "ns": 0}} for b, n in batches.items()]}


def test_stats_delta_is_what_triton_did_between_two_readings():
    a = _stats(100, 50_000_000, 80_000_000, 60, {1: 40, 2: 20})
    b = _stats(400, 350_000_000, 200_000_000, 160, {1: 60, 2: 40, 8: 20, 4: 20})
    d = stats_delta(a, b)
    assert d["requests"] == 300 and d["executions"] == 100
    assert d["queue_ms"] == pytest.approx(1.0) and d["compute_infer_ms"] == pytest.approx(0.4)
    assert d["batch_sizes"] == {1: 20, 2: 20, 4: 20, 8: 20} and d["mean_batch"] == pytest.approx(3.75)
    assert stats_delta({}, {})["queue_ms"] is None  # nothing answered: no invented mean


def _pt(rate, p99, answered=500, scheduled=500, failed=None, answered_rate=None):
    return {"rate": rate, "latency_ms": {"p99": p99}, "answered": answered, "scheduled": scheduled,
            "failed": failed or {}, "not_sent": 0, "answered_rate": answered_rate}


def test_a_rate_is_met_only_with_every_request_answered_and_an_estimable_p99():
    assert meets(_pt(100, 4.0), 5.0) and not meets(_pt(100, 6.0), 5.0)
    assert not meets(_pt(100, None), 5.0)  # p99 not estimable: not met
    assert not meets(_pt(100, 1.0, answered=499), 5.0)
    assert not meets(_pt(100, 1.0, failed={"TimeoutError": 1}), 5.0)


def test_rate_search_goes_down_then_bisects_then_stops():
    pts = [_pt(20000, 80.0, answered_rate=1500)]
    assert next_rate(pts, 5.0) == pytest.approx(1200)  # straight to 80% of what the server answered
    pts.append(_pt(1200, 3.0))
    assert next_rate(pts, 5.0) == pytest.approx((1200 * 20000) ** 0.5)
    pts += [_pt(4899, 9.0), _pt(2425, 6.0), _pt(1706, 4.0), _pt(2034, 5.5)]
    r = next_rate(pts, 5.0)  # between 1706 (met) and 2034 (missed): 19% apart, one more
    assert 1706 < r < 2034
    pts.append(_pt(r, 4.5))
    assert next_rate(pts, 5.0) is None  # within 15%: done
    assert next_rate([_pt(100, 1.0)], 5.0) == 200  # the simulated rate met: go up


def test_the_setting_served_is_onnx_runtime_s_simulated_best():
    serving = {"engines": {"eager": {"best": {"rate": 9e5, "config": {"max_batch_size": 8}}},
                           "onnxruntime": {"best": {"rate": 5e4, "config": {"max_batch_size": 64, "instances": 1}}}}}
    assert ort_setting(serving) == ("onnxruntime", {"max_batch_size": 64, "instances": 1}, 5e4)
    assert ort_setting({"engines": {"eager": {"best": None}}}) is None


def test_rate_search_stops_where_a_p99_would_outlast_the_time_bound():
    from overdrive.serve.triton_client import MIN_RATE

    assert next_rate([_pt(40, 80.0, answered_rate=30)], 5.0) == pytest.approx(MIN_RATE)  # 29 req/s, not 20
    assert poisson_arrivals(MIN_RATE, 460, seed=5)[-1] < 20  # its stream fits the time bound
    assert next_rate([_pt(40, 80.0), _pt(MIN_RATE, 50.0)], 5.0) is None  # the SLO met at no measurable rate


def test_the_report_names_failures_the_competing_client_and_a_withheld_simulation():
    from overdrive.report.triton_view import triton_lines

    pt = {**_pt(300, None, answered=450, scheduled=460, failed={"TimeoutError": 10}), "sent": 460, "met": False,
          "latency_ms": {"p50": None, "p99": None, "note": "not estimable from 450 samples: p99 needs 368"},
          "client_cpu_cores": 0.6, "server_cpu_cores": 0.5, "triton_stats": None}
    t = {"status": "ok", "server": "tritonserver", "setting": {}, "slo_ms": 5.0, "measured_rate": None,
         "missed_above": 300, "simulated_rate": 1000.0, "ratio": None, "simulated_verdict": "too busy to judge",
         "requests": {"sent": 460, "answered": 450, "failed": 10, "not_sent": 0}, "points": [pt], "aa": None,
         "load": {"before": {"load1": 3.0, "cores": 2}, "after": {"load1": 3.5, "cores": 2}},
         "client_cpu_cores_max": 0.6, "server_cpu_cores_max": 0.5, "client_competes": True,
         "leftover_processes": False, "note": "n"}
    text = "\n".join(triton_lines(t))
    assert "measured none" in text and "measured/simulated none (no rate tried met the SLO)" in text
    assert "failed: 10 x TimeoutError" in text and "an estimate: the simulation withheld its verdict" in text
    assert "it competed with the server, so the measured rate is a lower bound" in text
    assert "no server process left" in text and "load 3.0 -> 3.5 on 2 cores" in text
