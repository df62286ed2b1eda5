"""The real probes on a real GPU (scripts/gpu_check.sh runs these)."""

import importlib.util

import pytest
import torch

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def env():
    from overdrive.env import get_env

    return get_env()


def test_gpu_seen_as_it_is(env):
    assert len(env.gpus) == torch.cuda.device_count()
    g = env.gpus[0]
    assert g.cc == torch.cuda.get_device_capability(0)
    assert g.name == torch.cuda.get_device_name(0)
    assert g.spec is not None, f"{g.name} missing from the catalog"
    assert env.best_precision == "bf16"
    assert env.torch["cudnn"] and env.torch["nccl"]


def test_native_engines_ok(env):
    assert env.engine("fused_adamw").status == "ok"
    assert env.engine("sdpa_flash").status == "ok"
    assert env.engine("sdpa_math").status == "ok"
    assert env.engine("torch.compile").status == "ok", env.engine("torch.compile").reason


def test_optional_engines_really_run(env):
    cc = torch.cuda.get_device_capability(0)
    if importlib.util.find_spec("triton"):
        assert env.engine("triton").status == "ok", env.engine("triton").reason
    if importlib.util.find_spec("torchao"):
        want = "ok" if cc >= (8, 9) else "unsupported"
        assert env.engine("torchao").status == want, env.engine("torchao").reason
        assert (env.fp8_backend is not None) == (cc >= (8, 9))
    if importlib.util.find_spec("liger_kernel"):
        assert env.engine("liger_kernel").status == "ok", env.engine("liger_kernel").reason
