"""GPU catalog: dense peak rates, memory and links, for MFU and for `overdrive plan`.

Peaks are the vendors' dense (not sparse) figures per GPU from NVIDIA's datasheets (the same figures
torchtitan's MFU uses): H100 SXM BF16 989 TFLOP/s, FP8 1979; where a vendor quotes "with sparsity" we halve it. Memory is
what `nvidia-smi --query-gpu=memory.total` reports, in MiB (an "80GB" H100 shows 81,559 MiB =
79.6 GiB, not 80 x 0.9313), because that is what an allocation can use. Sources per entry in `source`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

__all__ = ["GpuSpec", "GPU_CATALOG", "lookup_gpu", "gpu_by_key"]

_MIB = 2**20 / 2**30  # GiB per MiB


@dataclass(frozen=True, kw_only=True)
class GpuSpec:
    key: str
    """Short name used on the command line (`--gpu h100-sxm`)."""
    name: str
    """Marketing name."""
    match: tuple[str, ...]
    """Lower-case substrings of `torch.cuda.get_device_name()` that identify this GPU (any one)."""
    sm: tuple[int, int]
    """Compute capability."""
    mem_mib: int
    """Device memory as `nvidia-smi` reports it, MiB."""
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
    fp4_tflops: float | None = None
    """Dense FP4 (NVFP4/MXFP4) tensor-core peak, TFLOP/s; Blackwell only."""
    exclude: tuple[str, ...] = ()
    """Substrings that rule this entry out even when `match` hits ("h100 nvl" is not an SXM H100)."""
    source: str = ""
    note: str = ""

    @property
    def nic_gbs(self) -> float:
        """Scale-out network per GPU, one direction, GB/s: the compute NIC each GPU has in NVIDIA's reference
        system for it (`NICS`), the planner's inter-node rate unless `--inter-gbs` says otherwise."""
        gbs = NICS[_NIC_OF.get(self.key, "assumed")][0]
        return gbs if self.key in _NIC_OF else min(gbs, self.nvlink_gbs)   # a card's NIC sits behind its PCIe

    @property
    def nic_source(self) -> str:
        """Where `nic_gbs` comes from."""
        return NICS[_NIC_OF.get(self.key, "assumed")][1]

    @property
    def mem_gib(self) -> float:
        """Device memory in GiB (2^30 bytes), from the driver's MiB."""
        return self.mem_mib * _MIB

    def to_dict(self) -> dict:
        d = asdict(self)
        d["sm"], d["match"], d["exclude"] = list(self.sm), list(self.match), list(self.exclude)
        d["mem_gib"] = round(self.mem_gib, 2)
        d["nic_gbs"], d["nic_source"] = self.nic_gbs, self.nic_source
        return d


_NV = "NVIDIA datasheet (dense figures; sparse halved)"
NICS = {
    "a100": (25.0, "DGX A100: 8 single-port ConnectX-6, HDR InfiniBand 200 Gb/s per GPU"),
    "a800": (25.0, "assumed as the DGX A100's 200 Gb/s HDR per GPU"),
    "hopper": (50.0, "DGX H100/H200: 8 ConnectX-7, 400 Gb/s per GPU"),
    "h800": (50.0, "assumed as the DGX H100's 400 Gb/s per GPU"),
    "meta": (50.0, "Meta's Grand Teton H100 clusters: 400 Gb/s per GPU, RoCE or InfiniBand"),
    "b200": (50.0, "DGX B200: 8 ConnectX-7, 400 Gb/s per GPU"),
    "gb200": (50.0, "GB200 NVL72: 4 ConnectX-7 per 4-GPU compute tray, 400 Gb/s per GPU"),
    "ultra": (100.0, "DGX B300 and GB300 NVL72: a ConnectX-8 SuperNIC per GPU, 800 Gb/s"),
    "assumed": (50.0, "assumed 400 Gb/s per GPU, at most the card's PCIe link: no reference multi-node system for it"),
}
"""The compute fabric of each GPU's reference system (NVIDIA's DGX and NVL72 datasheets): (GB/s per GPU one way,
source)."""
_NIC_OF = {"a100-40": "a100", "a100-80": "a100", "a800": "a800", "h100-sxm": "hopper", "h200": "hopper",
           "h800": "h800", "h100-96gb": "meta", "b200": "b200", "gb200": "gb200", "b300": "ultra", "gb300": "ultra"}
# Order matters for matching: more specific names first ("gb200" before "b200", "h100 nvl" before "h100").
GPU_CATALOG: tuple[GpuSpec, ...] = (
    GpuSpec(key="gb300", name="NVIDIA GB300 (Grace Blackwell Ultra)", match=("gb300",), sm=(10, 3),
            mem_mib=268 * 1024, hbm_tbs=8.0, bf16_tflops=2500, fp8_tflops=5000, fp4_tflops=15000, tf32_tflops=1250,
            fp32_tflops=80, nvlink_gbs=900, source=f"{_NV}: GB300 NVL72 / 72 GPUs",
            note="288 GB HBM3e = 268 GiB; nvidia-smi figure not yet seen by the project. Blackwell Ultra doubles "
                 "the SFU exponential (MUFU.EX2) throughput softmax runs on (NVIDIA technical blog 'Making Softmax "
                 "More Efficient with NVIDIA Blackwell Ultra'); up to 1,400 W per GPU against GB200's 1,200 W "
                 "(reported board power, e.g. glennklockwood.com/garden/processors/B300). Sustained clocks are not "
                 "published, so the dense peaks stay the NVL72 datasheet's, the same as GB200's."),
    GpuSpec(key="gb200", name="NVIDIA GB200 (Grace Blackwell)", match=("gb200",), sm=(10, 0), mem_mib=189_471,
            hbm_tbs=8.0, bf16_tflops=2500, fp8_tflops=5000, fp4_tflops=10000, tf32_tflops=1250, fp32_tflops=80,
            nvlink_gbs=900, source=f"{_NV}: GB200 NVL72 / 72 GPUs (1,200 W parts)",
            note="186 GB HBM3e; the MiB figure is the commonly reported nvidia-smi total, not yet seen by the project."),
    GpuSpec(key="b300", name="NVIDIA B300 (Blackwell Ultra)", match=("b300",), sm=(10, 3), mem_mib=268 * 1024,
            hbm_tbs=8.0, bf16_tflops=2250, fp8_tflops=4500, fp4_tflops=13500, tf32_tflops=1100, fp32_tflops=75,
            nvlink_gbs=900, source=f"{_NV}: DGX B300 / 8 GPUs",
            note="288 GB HBM3e = 268 GiB (one conversion: GB -> GiB); BF16 and HBM are the lead figures. Blackwell "
                 "Ultra: twice B200's SFU exponential throughput (NVIDIA technical blog 'Making Softmax More "
                 "Efficient with NVIDIA Blackwell Ultra')."),
    GpuSpec(key="b200", name="NVIDIA B200", match=("b200",), sm=(10, 0), mem_mib=183_359, hbm_tbs=8.0,
            bf16_tflops=2250, fp8_tflops=4500, fp4_tflops=9000, tf32_tflops=1100, fp32_tflops=75, nvlink_gbs=900,
            source=f"{_NV}: DGX B200 / 8 GPUs; memory from nvidia-smi on a DGX B200"),
    GpuSpec(key="h200-nvl", name="NVIDIA H200 NVL", match=("h200 nvl",), sm=(9, 0), mem_mib=143_771, hbm_tbs=4.8,
            bf16_tflops=835, fp8_tflops=1671, tf32_tflops=418, fp32_tflops=60, nvlink_gbs=450,
            source=f"{_NV}: H200 NVL (600 W PCIe card, NVLink bridge)"),
    GpuSpec(key="h200", name="NVIDIA H200 SXM", match=("h200",), exclude=("nvl",), sm=(9, 0), mem_mib=143_771,
            hbm_tbs=4.8, bf16_tflops=989, fp8_tflops=1979, tf32_tflops=494, fp32_tflops=67, nvlink_gbs=450,
            source=f"{_NV}: H200 SXM; memory from nvidia-smi on the project's H200",
            note="Measured on the project's H200: bf16 8192^3 GEMM ~770-800 TFLOP/s, copy ~4.3 TB/s."),
    GpuSpec(key="h100-nvl", name="NVIDIA H100 NVL", match=("h100 nvl",), sm=(9, 0), mem_mib=95_830, hbm_tbs=3.9,
            bf16_tflops=835, fp8_tflops=1671, tf32_tflops=418, fp32_tflops=60, nvlink_gbs=300,
            source=f"{_NV}: H100 NVL (94 GB, 400 W PCIe card, NVLink bridge 600 GB/s both ways)",
            note="MiB figure not yet seen by the project."),
    GpuSpec(key="h100-pcie", name="NVIDIA H100 PCIe", match=("h100 pcie", "h100-pcie"), sm=(9, 0), mem_mib=81_559,
            hbm_tbs=2.0, bf16_tflops=756, fp8_tflops=1513, tf32_tflops=378, fp32_tflops=51, nvlink_gbs=64,
            source=f"{_NV}: H100 PCIe"),
    GpuSpec(key="h100-96gb", name="NVIDIA H100 96GB HBM2e (SXM, 500 W)", match=("h100 96gb",), sm=(9, 0),
            mem_mib=97_871, hbm_tbs=2.4, bf16_tflops=912, fp8_tflops=1824, tf32_tflops=456, fp32_tflops=62,
            nvlink_gbs=450, source="torchtitan benchmarks/llama3_h100_202412_torchtitan.md (Grand Teton hosts)",
            note="torchtitan: 'peak between SXM and NVL, exact value unknown' at the 500 W limit; we take the "
                 "midpoint of 989 and 835. MiB figure not yet seen by the project."),
    GpuSpec(key="h100-sxm", name="NVIDIA H100 SXM", match=("h100",), exclude=("nvl", "pcie", "96gb"), sm=(9, 0),
            mem_mib=81_559, hbm_tbs=3.35, bf16_tflops=989, fp8_tflops=1979, tf32_tflops=494, fp32_tflops=67,
            nvlink_gbs=450, source=f"{_NV}: H100 SXM5 80GB; memory from nvidia-smi ('NVIDIA H100 80GB HBM3')"),
    GpuSpec(key="h800", name="NVIDIA H800 SXM", match=("h800",), sm=(9, 0), mem_mib=81_559, hbm_tbs=3.35,
            bf16_tflops=989, fp8_tflops=1979, tf32_tflops=494, fp32_tflops=67, nvlink_gbs=200,
            source=f"{_NV}: H800 SXM5 (the H100 SXM's die and HBM3 with NVLink cut to 400 GB/s both ways and FP64 "
                   "to about 1 TFLOP/s, for export-controlled markets)",
            note="Compute and memory are the H100 SXM's; the planner's data-parallel and TP collectives inside a "
                 "node run at 200 GB/s per direction. MiB figure taken as the H100 SXM's, not yet seen by the "
                 "project."),
    GpuSpec(key="a800", name="NVIDIA A800 80GB", match=("a800",), sm=(8, 0), mem_mib=81_920, hbm_tbs=2.039,
            bf16_tflops=312, fp8_tflops=None, tf32_tflops=156, fp32_tflops=19.5, nvlink_gbs=200,
            source=f"{_NV}: A800 80GB SXM4 (the A100 80GB with NVLink cut to 400 GB/s both ways)",
            note="MiB figure taken as the A100 80GB's, not yet seen by the project."),
    GpuSpec(key="a100-40", name="NVIDIA A100 40GB", match=("a100-sxm4-40gb", "a100-pcie-40gb", "a100 40gb"),
            sm=(8, 0), mem_mib=40_960, hbm_tbs=1.555, bf16_tflops=312, fp8_tflops=None, tf32_tflops=156,
            fp32_tflops=19.5, nvlink_gbs=300, source=f"{_NV}: A100 40GB SXM4"),
    GpuSpec(key="a100-80", name="NVIDIA A100 80GB", match=("a100",), sm=(8, 0), mem_mib=81_920, hbm_tbs=2.039,
            bf16_tflops=312, fp8_tflops=None, tf32_tflops=156, fp32_tflops=19.5, nvlink_gbs=300,
            source=f"{_NV}: A100 80GB SXM4"),
    GpuSpec(key="l40s", name="NVIDIA L40S", match=("l40s",), sm=(8, 9), mem_mib=46_068, hbm_tbs=0.864,
            bf16_tflops=362, fp8_tflops=733, tf32_tflops=183, fp32_tflops=91.6, nvlink_gbs=32,
            source=f"{_NV}: L40S", note="GDDR6; vendor quotes 733 dense FP8 / 1466 sparse."),
    GpuSpec(key="l4", name="NVIDIA L4", match=("l4",), exclude=("l40",), sm=(8, 9), mem_mib=23_034, hbm_tbs=0.3,
            bf16_tflops=121, fp8_tflops=242.5, tf32_tflops=60, fp32_tflops=30.3, nvlink_gbs=32, source=f"{_NV}: L4"),
    GpuSpec(key="rtx4090", name="NVIDIA GeForce RTX 4090", match=("rtx 4090", "4090"), sm=(8, 9), mem_mib=24_564,
            hbm_tbs=1.008, bf16_tflops=165, fp8_tflops=330, tf32_tflops=82.6, fp32_tflops=82.6, nvlink_gbs=32,
            source="NVIDIA Ada whitepaper",
            note="Dense with FP32 accumulate is half the FP16-accumulate figure; we list FP32 accumulate."),
)

_ALIASES = {"h100": "h100-sxm", "a100": "a100-80", "4090": "rtx4090", "rtx-4090": "rtx4090", "h100-96": "h100-96gb",
            "h200-sxm": "h200", "b200-sxm": "b200"}


def gpu_by_key(key: str, mem_gib: float | None = None) -> GpuSpec:
    """The catalog entry for a command-line name, with `mem_gib` GiB of memory where given (a board that has more
    or less than the catalog's, `overdrive plan --gpu-mem`); raises ValueError listing the known names."""
    k = key.strip().lower().replace("_", "-")
    k = _ALIASES.get(k, k)
    for spec in GPU_CATALOG:
        if spec.key != k:
            continue
        if mem_gib is None:
            return spec
        if not (isinstance(mem_gib, (int, float)) and 1 <= mem_gib <= 4096):
            raise ValueError(f"--gpu-mem {mem_gib}: give the GPU's memory in GiB, 1 to 4096 (the catalog's "
                             f"{spec.key} has {spec.mem_gib:.0f})")
        return replace(spec, mem_mib=round(mem_gib * 1024), note=f"memory {mem_gib:g} GiB by --gpu-mem")
    known = ", ".join(s.key for s in GPU_CATALOG)
    raise ValueError(f"unknown GPU '{key}': known GPUs are {known}")


def lookup_gpu(device_name: str) -> GpuSpec | None:
    """Match a driver-reported device name ("NVIDIA H100 80GB HBM3") to a catalog entry."""
    n = device_name.lower()
    for spec in GPU_CATALOG:
        if any(m in n for m in spec.match) and not any(x in n for x in spec.exclude):
            return spec
    return None
