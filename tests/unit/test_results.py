"""The results files: one writer and one reader per kind (bench, latency, tune), each checking the
same schema, so a writer's bug fails where it is written and a tampered file where it is read."""

import copy
import csv
import json

import pytest

from overdrive.results import kind_of, load_latency, load_results, load_tune, save_results, save_tune


def _latency_doc() -> dict:
    mode = {"status": "ok", "batches": {"1": {"p50": 0.5, "p95": 0.8, "p99": 0.9, "n": 400, "throughput": 2000.0,
                                              "slo": "meets"},
                                        "16": {"status": "skipped: batch 1 already took over 200 ms"}},
            "slo_batch": 1, "slo_throughput": 2000.0}
    return {"schema": "overdrive.latency/1", "device": "CPU", "created": "2026-12-01", "slo_ms": 10.0,
            "workloads": {"recsys": {"model": "DLRM", "unit": "examples/s",
                                     "modes": {"fp32": mode, "compile": {"status": "unavailable", "reason": "no",
                                                                         "batches": {}}},
                                     "best": {"text": "fp32 at batch 1", "mode": "fp32", "batch": 1}}},
            "serving": {"engines": {"onnxruntime": {"label": "ORT", "status": "ok", "best": {
                "rate": 900.0, "config": {"max_batch_size": 32}}}}}}


def test_inference_results_go_through_the_schemad_writer_with_a_csv(tmp_path):
    save_results(_latency_doc(), str(tmp_path))
    assert kind_of(str(tmp_path)) == "latency" and load_latency(str(tmp_path))["slo_ms"] == 10.0
    rows = list(csv.DictReader(open(tmp_path / "results.csv")))
    got = [(r["table"], r["mode"], r["batch"], r["status"], r["p99_ms"]) for r in rows]
    assert got == [("recsys", "fp32", "1", "ok", "0.9"), ("recsys", "fp32", "16", "skipped: batch 1 already took "
                                                          "over 200 ms", ""), ("recsys", "compile", "", "unavailable", ""),
                   ("serving", "onnxruntime", "32", "ok", "")]
    assert rows[-1]["throughput"] == "900.0" and rows[-1]["unit"] == "req/s"


@pytest.mark.parametrize("edit,says", [
    (lambda d: d["workloads"]["recsys"].pop("unit"), "'unit' is a required property"),
    (lambda d: d["workloads"]["recsys"]["modes"]["fp32"]["batches"]["1"].update(p99=float("nan")),
     "batches/1/p99: nan is not a finite number"),
])
def test_the_writer_refuses_what_the_reader_would_and_writes_nothing(tmp_path, edit, says):
    d = _latency_doc()
    edit(d)
    with pytest.raises(ValueError, match="about to be written") as e:
        save_results(d, str(tmp_path))
    assert says in str(e.value) and not (tmp_path / "results.json").exists()


def _tune_doc() -> dict:
    row = {"name": "baseline", "label": "baseline", "baseline": True, "status": "ok", "reason": "", "ran": "fp32",
           "step_ms": 10.0, "speedup": 1.0, "speedup_ci": [1.0, 1.0], "warmup_first_step_ms": 30.0,
           "loss_delta_pct": 0.0, "loss_delta_nats": 0.0, "safe": True, "safety": "reference", "losses": [2.0, 1.9]}
    return {"schema": "overdrive.tune/1", "best": "baseline", "summary": "Baseline stays", "candidates": [row],
            "workload": "m.py:f", "budget_s": 60.0, "elapsed_s": 50.0, "rounds": 4, "tolerance": "fp32 1%",
            "created": "now", "baseline": "baseline"}


def test_tune_results_are_checked_when_written_and_when_read(tmp_path):
    save_tune(_tune_doc(), str(tmp_path))
    assert kind_of(str(tmp_path)) == "tune" and load_tune(str(tmp_path))["best"] == "baseline"
    bad = copy.deepcopy(_tune_doc())
    bad["candidates"][0]["speedup"] = float("inf")
    with pytest.raises(ValueError, match="candidates/0/speedup: inf is not a finite number"):
        save_tune(bad, str(tmp_path / "bad"))
    assert not (tmp_path / "bad" / "results.json").exists()
    with pytest.raises(ValueError, match="not a valid overdrive tune result"):  # a bench result is no tune result
        (tmp_path / "b").mkdir()
        (tmp_path / "b" / "results.json").write_text(json.dumps(_latency_doc()))
        load_tune(str(tmp_path / "b"))


def test_the_reader_refuses_a_device_or_an_oversized_file_without_reading_it(tmp_path):
    with pytest.raises(ValueError, match="not a regular file"):
        load_results("/dev/zero")
    big = tmp_path / "results.json"
    with open(big, "wb") as f:
        f.truncate(300 << 20)  # sparse: no disk used
    with pytest.raises(ValueError, match="too large"):
        load_results(str(tmp_path))
    assert kind_of(str(tmp_path / "nope")) is None


def test_a_device_is_no_kind_and_is_never_read(tmp_path):
    assert kind_of("/dev/zero") is None  # not read to the end (it has none)
