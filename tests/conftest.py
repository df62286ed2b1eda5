import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # tests/fakes.py


def pytest_configure(config):
    # One intra-op thread in the test process: on a shared 2-core host under load, a 2-thread GEMM
    # spins waiting for its second thread (a tiny latency test took 54 s wall for 12 s of CPU; with
    # one thread 2.4 s). Tests check behaviour, not speed. OVERDRIVE_TEST_THREADS overrides.
    import torch

    torch.set_num_threads(int(os.environ.get("OVERDRIVE_TEST_THREADS", "1")))


def pytest_collection_modifyitems(config, items):
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run scripts/gpu_check.sh on one)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_runtest_logreport(report):
    """OVERDRIVE_TEST_LOG=FILE: one line per test as it ends (node, outcome, seconds, first line of the
    failure), so a run killed by a time limit (scripts/gpu_check.sh's lease) still says what passed."""
    path = os.environ.get("OVERDRIVE_TEST_LOG")
    if not path or not (report.when == "call" or report.outcome != "passed"):
        return
    why = ""
    if report.outcome != "passed" and report.longrepr is not None:
        text = str(getattr(report.longrepr, "reprcrash", None) or report.longrepr)
        why = " ".join(text.split())[:300]
    with open(path, "a") as f:
        f.write(f"{report.nodeid}\t{report.when}\t{report.outcome}\t{report.duration:.2f}\t{why}\n")
