"""scripts/gpu_check.sh's plan fits a lease: run on a fake clock (GPU_CHECK_FAKE: each step "takes" the
seconds a file gives it, no command runs), its budgets must add up to under 8 minutes whatever the steps
take, each step bounded by its own limit, correctness before the bench, optional steps only with time left."""

import random
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"
LEASE_S = 8 * 60
ORDER = ["setup", "doctor", "gpu_tests", "bench", "tune", "inference", "host_us", "zero_sliced"]
pytestmark = pytest.mark.skipif(shutil.which("bash") is None or shutil.which("awk") is None, reason="needs bash")


def _run(tmp_path: Path, took: dict[str, int]) -> dict[str, dict]:
    fake = tmp_path / "times"
    fake.write_text("".join(f"{k} {v}\n" for k, v in took.items()))
    out = tmp_path / "out"
    shutil.rmtree(out, ignore_errors=True)
    env = {"PATH": "/usr/bin:/bin", "OUT": str(out), "GPU_CHECK_FAKE": str(fake), "GPU_CHECK_RES": str(tmp_path / "res")}
    r = subprocess.run(["bash", str(SCRIPT)], env=env,
                       capture_output=True, text=True, timeout=60)
    rows = {}
    for line in (out / "steps.tsv").read_text().splitlines()[1:]:
        name, limit, secs, rc, status = line.split("\t")
        rows[name] = {"limit": int(limit), "secs": int(secs), "rc": rc, "status": status}
    assert (out / "log.txt").exists() and "would run:" in (out / "log.txt").read_text()
    rows["_rc"] = r.returncode
    return rows


def _check_bounds(rows: dict) -> None:
    assert list(k for k in rows if not k.startswith("_") and k != "total") == ORDER  # every step reported, in order
    assert rows["total"]["secs"] <= rows["total"]["limit"] < LEASE_S - 15
    for name in ORDER:
        assert rows[name]["secs"] <= rows[name]["limit"], name
    assert sum(rows[n]["secs"] for n in ORDER) == rows["total"]["secs"]


def test_every_step_killed_at_its_limit_still_fits(tmp_path):
    rows = _run(tmp_path, {n: 10_000 for n in ORDER})
    _check_bounds(rows)
    assert all(rows[n]["status"] == "timed out" for n in ("setup", "doctor", "gpu_tests", "bench"))
    assert all(rows[n]["status"].startswith("skipped") for n in ("host_us", "zero_sliced", "tune", "inference"))
    assert rows["_rc"] == 1  # required steps failed: the check fails


def test_typical_timings_run_everything(tmp_path):
    rows = _run(tmp_path, {"setup": 15, "doctor": 35, "gpu_tests": 110, "bench": 130, "tune": 70, "inference": 40,
                              "host_us": 15, "zero_sliced": 12})
    _check_bounds(rows)
    assert all(rows[n]["status"] == "ok" for n in ORDER) and rows["_rc"] == 0
    assert rows["total"]["secs"] == 427


def test_a_slow_bench_squeezes_out_the_optional_steps(tmp_path):
    rows = _run(tmp_path, {"setup": 20, "doctor": 55, "gpu_tests": 150, "bench": 175, "tune": 80, "inference": 50})
    _check_bounds(rows)
    assert rows["bench"]["status"] == "ok" and rows["tune"]["status"].startswith("skipped")
    assert rows["host_us"]["status"] == "ok" and rows["host_us"]["limit"] <= 25   # the short one still fits
    assert rows["_rc"] == 0  # optional steps skipped: not a failure


def test_random_timings_never_break_the_budget(tmp_path):
    rng = random.Random(0)
    for i in range(12):
        took = {n: rng.choice([1, 30, 90, 200, 10_000]) for n in ORDER}
        (tmp_path / str(i)).mkdir()
        _check_bounds(_run(tmp_path / str(i), took))


def test_the_script_limits_and_writes_each_step_as_it_goes():
    text = SCRIPT.read_text()
    # each real step under its own timeout, its output in its own log (packed after every step) and log.txt
    assert 'timeout --kill-after=5 "$limit" "$@" 2>&1 | tee "$RES/logs/$name.log" >> "$LOG"' in text
    assert "rc=${PIPESTATUS[0]}" in text  # the step's status, not tee's
    assert 'OVERDRIVE_TEST_LOG="$OUT/gpu_tests.tsv"' in text  # each GPU test's outcome as it ends
    assert text.index("step gpu_tests") < text.index("step bench") < text.index("step tune")
    assert "--no-micro" in text and "pytest -v -m gpu tests/gpu" in text
    assert text.count("\nstep ") == len(ORDER)


def test_a_real_run_records_each_steps_own_status_and_log(tmp_path):
    """Not faked: every step really runs (PYTHON=false: each fails at once) through the tee into its own
    log; the status recorded is the step's (rc 1), never tee's 0, and the packed results hold the logs."""
    import tarfile

    out, res = tmp_path / "out", tmp_path / "res"
    env = {"PATH": "/usr/bin:/bin", "OUT": str(out), "PYTHON": "false", "GPU_CHECK_RES": str(res), "BUDGET": "400"}
    r = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=120)
    rows = [line.split("\t") for line in (out / "steps.tsv").read_text().splitlines()[1:]]
    by = {row[0]: row for row in rows}
    for name in ("doctor", "gpu_tests", "bench", "host_us", "zero_sliced", "tune", "inference"):
        assert by[name][3] == "1" and by[name][4] == "failed", by[name]
    assert r.returncode == 1
    with tarfile.open(out / "results.tar.gz") as tar:
        names = tar.getnames()
    assert {f"./logs/{n}.log" for n in ORDER} <= set(names), names
