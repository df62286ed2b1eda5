"""GPU capacities as nvidia-smi reports them, and names that must not match the wrong entry."""

import pytest

from overdrive.env import gpu_by_key, lookup_gpu


def test_capacities_from_nvidia_smi():
    assert gpu_by_key("h100-sxm").mem_mib == 81_559 and gpu_by_key("h100-sxm").mem_gib == pytest.approx(79.65, abs=0.01)
    assert gpu_by_key("h200").mem_mib == 143_771
    assert gpu_by_key("b200").mem_mib == 183_359
    assert gpu_by_key("b300").mem_gib == pytest.approx(268, abs=0.01)  # converted once, not twice


def test_nvl_and_grace_parts_match_their_own_entries():
    assert lookup_gpu("NVIDIA H100 NVL").key == "h100-nvl"
    assert lookup_gpu("NVIDIA H200 NVL").key == "h200-nvl"
    assert lookup_gpu("NVIDIA H100 NVL").bf16_tflops == pytest.approx(835)
    assert lookup_gpu("NVIDIA H100 80GB HBM3").key == "h100-sxm"
    assert lookup_gpu("NVIDIA H200").key == "h200"
    assert lookup_gpu("NVIDIA GB200").key == "gb200" and lookup_gpu("NVIDIA B200").key == "b200"
    assert lookup_gpu("NVIDIA GB300").key == "gb300" and lookup_gpu("NVIDIA B300 SXM6 AC").key == "b300"
    assert lookup_gpu("NVIDIA H100 96GB HBM2e").key == "h100-96gb"
    assert gpu_by_key("b200").fp4_tflops > gpu_by_key("b200").fp8_tflops
