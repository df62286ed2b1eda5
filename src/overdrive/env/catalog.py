"""GPU catalog: dense peak rates and memory systems, for MFU and for `overdrive plan`.

Figures are the vendors' dense (not sparse) peaks per GPU from NVIDIA's datasheets (and the
same figures torchtitan's MFU uses): e.g. H100 SXM BF16 989 TFLOP/s, FP8 1979. Where a vendor quotes "with sparsity"
we halve it. `measured_*` fields hold what we saw on a real card, when we have seen one.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

__all__ = ["GpuSpec", "GPU_CATALOG", "lookup_gpu", "gpu_by_key"]


@dataclass(frozen=True, kw_only=True)
class GpuSpec:
    key: str
    """Short name used on the command line (`--gpu h100-sxm`)."""
    name: str
    """Marketing name."""
    match: tuple[str, ...]
    """Lower-case substrings of `torch.cuda.get_device_name()` that identify this GPU."""
    sm: tuple[int, int]
    """Compute capability."""
    mem_gib: float
    """Device memory as reported by the driver, GiB (a "141 GB" H200 shows ~139.8 GiB)."""
    hbm_tbs: float
    """Memory bandwidth, TB/s."""
    bf16_tflops: float
    """Dense BF16/FP16 tensor-core peak, TFLOP/s."""
    fp8_tflops: float | None
    """Dense FP8 tensor-core peak, TFLOP/s; None where the GPU has no FP8 tensor cores."""
    tf32_tflops: float
    """Dense TF32 tensor-core peak, TFLOP/s."""
    fp32_tflops: float
    """Non-tensor FP32 peak, TFLOP/s."""
    nvlink_gbs: float
    """Per-GPU NVLink bandwidth, one direction, GB/s (PCIe cards: the PCIe link)."""
    note: str = ""

    def to_dict(self) -> dict:
        d = asdict(self)
        d["sm"] = list(self.sm)
        d["match"] = list(self.match)
        return d


# Order matters for matching: more specific names first ("h100 pcie" before "h100").
GPU_CATALOG: tuple[GpuSpec, ...] = (
    GpuSpec(key="b300", name="NVIDIA B300 (Blackwell Ultra)", match=("b300", "gb300"), sm=(10, 3),
            mem_gib=268 * 0.9313, hbm_tbs=8.0, bf16_tflops=2250, fp8_tflops=4500, tf32_tflops=1100,
            fp32_tflops=75, nvlink_gbs=900,
            note="BF16 and HBM figures are the lead numbers quoted before full specs; FP8 dense as B200."),
    GpuSpec(key="b200", name="NVIDIA B200", match=("b200", "gb200"), sm=(10, 0), mem_gib=180 * 0.9313,
            hbm_tbs=8.0, bf16_tflops=2250, fp8_tflops=4500, tf32_tflops=1100, fp32_tflops=75,
            nvlink_gbs=900),
    GpuSpec(key="h200", name="NVIDIA H200 SXM", match=("h200",), sm=(9, 0), mem_gib=141 * 0.9313,
            hbm_tbs=4.8, bf16_tflops=989, fp8_tflops=1979, tf32_tflops=494, fp32_tflops=67,
            nvlink_gbs=450,
            note="Measured on the project's H200: bf16 8192^3 GEMM ~770-800 TFLOP/s, copy ~4.3 TB/s."),
    GpuSpec(key="h100-pcie", name="NVIDIA H100 PCIe", match=("h100 pcie", "h100-pcie"), sm=(9, 0),
            mem_gib=80 * 0.9313, hbm_tbs=2.0, bf16_tflops=756, fp8_tflops=1513, tf32_tflops=378,
            fp32_tflops=51, nvlink_gbs=64),
    GpuSpec(key="h100-sxm", name="NVIDIA H100 SXM", match=("h100",), sm=(9, 0), mem_gib=80 * 0.9313,
            hbm_tbs=3.35, bf16_tflops=989, fp8_tflops=1979, tf32_tflops=494, fp32_tflops=67,
            nvlink_gbs=450),
    GpuSpec(key="a100-40", name="NVIDIA A100 40GB", match=("a100-sxm4-40gb", "a100-pcie-40gb", "a100 40gb"),
            sm=(8, 0), mem_gib=40 * 0.9313, hbm_tbs=1.555, bf16_tflops=312, fp8_tflops=None,
            tf32_tflops=156, fp32_tflops=19.5, nvlink_gbs=300),
    GpuSpec(key="a100-80", name="NVIDIA A100 80GB", match=("a100",), sm=(8, 0), mem_gib=80 * 0.9313,
            hbm_tbs=2.039, bf16_tflops=312, fp8_tflops=None, tf32_tflops=156, fp32_tflops=19.5,
            nvlink_gbs=300),
    GpuSpec(key="l40s", name="NVIDIA L40S", match=("l40s",), sm=(8, 9), mem_gib=48 * 0.9313,
            hbm_tbs=0.864, bf16_tflops=362, fp8_tflops=733, tf32_tflops=183, fp32_tflops=91.6,
            nvlink_gbs=32, note="GDDR6; vendor quotes 733 dense FP8 / 1466 sparse."),
    GpuSpec(key="l4", name="NVIDIA L4", match=("l4",), sm=(8, 9), mem_gib=24 * 0.9313, hbm_tbs=0.3,
            bf16_tflops=121, fp8_tflops=242.5, tf32_tflops=60, fp32_tflops=30.3, nvlink_gbs=32),
    GpuSpec(key="rtx4090", name="NVIDIA GeForce RTX 4090", match=("rtx 4090", "4090"), sm=(8, 9),
            mem_gib=24 * 0.9313, hbm_tbs=1.008, bf16_tflops=165, fp8_tflops=330, tf32_tflops=82.6,
            fp32_tflops=82.6, nvlink_gbs=32,
            note="Dense with FP32 accumulate is half the FP16-accumulate figure; we list FP32 accumulate."),
)


def gpu_by_key(key: str) -> GpuSpec:
    """The catalog entry for a command-line name; raises ValueError listing the known names."""
    k = key.strip().lower().replace("_", "-")
    aliases = {"h100": "h100-sxm", "a100": "a100-80", "4090": "rtx4090", "rtx-4090": "rtx4090"}
    k = aliases.get(k, k)
    for spec in GPU_CATALOG:
        if spec.key == k:
            return spec
    known = ", ".join(s.key for s in GPU_CATALOG)
    raise ValueError(f"unknown GPU '{key}': known GPUs are {known}")


def lookup_gpu(device_name: str) -> GpuSpec | None:
    """Match a driver-reported device name ("NVIDIA H100 80GB HBM3") to a catalog entry."""
    n = device_name.lower()
    for spec in GPU_CATALOG:
        if spec.key == "l4" and "l40" in n:  # "l4" is a substring of "l40s"
            continue
        if any(m in n for m in spec.match):
            return spec
    return None
