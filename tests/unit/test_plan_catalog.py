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


def test_export_parts_are_their_base_gpu_with_a_slower_nvlink():
    """H800 / A800: the H100 SXM's and the A100 80GB's compute and memory, NVLink 400 GB/s both ways."""
    from overdrive.plan import TrainSetup, estimate, get_model

    for cut, base, name in (("h800", "h100-sxm", "NVIDIA H800"), ("a800", "a100-80", "NVIDIA A800-SXM4-80GB")):
        c, b = gpu_by_key(cut), gpu_by_key(base)
        assert lookup_gpu(name).key == cut and lookup_gpu(b.name).key == base
        assert (c.bf16_tflops, c.mem_mib, c.sm) == (b.bf16_tflops, b.mem_mib, b.sm) and c.nvlink_gbs < b.nvlink_gbs
        m = get_model("llama3-8b")
        plans = [estimate(m, TrainSetup(gpu=g, tp=2, sharding="zero1", seq=4096)) for g in (c, b)]
        # same GEMM rate, slower TP and data-parallel collectives: never faster, and the memory is the same
        assert plans[0].tokens_per_s_per_gpu < plans[1].tokens_per_s_per_gpu
        assert plans[0].memory_gib == pytest.approx(plans[1].memory_gib)
