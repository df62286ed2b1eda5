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
