"""Imported first in the fork server (`launch.worker_context`): keeps the server's imports from
initialising the CUDA driver, which every worker forked from it would inherit broken.

`torch.cuda.is_available()` calls `cudaGetDeviceCount`, and that runs `cuInit` in the calling process
(torch/cuda/__init__.py `is_available`; pytorch#83973). A process forked after `cuInit` fails its first
CUDA call. torchao's float8 import calls `is_available()` at import time (torchao/float8/float8_utils.py:
`IS_ROCM = torch.cuda.is_available() and ...`), so a fork server that preloads it would poison every
worker on a CUDA host. With PYTORCH_NVML_BASED_CUDA_CHECK=1, `is_available()` counts devices through
NVML instead, which does not initialise the driver (pytorch PR #85951). Set here, in the server only:
the user's own process keeps its environment.

`launch.worker_context` uses the fork server only where this holds: on a CUDA build whose NVML cannot
count the devices, `device_count()` falls back to `cudaGetDeviceCount` and the workers are spawned.
"""

import os

NVML_CHECK = "PYTORCH_NVML_BASED_CUDA_CHECK"

os.environ[NVML_CHECK] = "1"
