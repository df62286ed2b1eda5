"""Fake machines at the probe boundary: facts dicts as `overdrive.env.probing.collect_facts` returns."""

from __future__ import annotations

import copy

GPU = {
    "h100": {"name": "NVIDIA H100 80GB HBM3", "cc": [9, 0], "mem_bytes": 85_520_809_984, "sm_count": 132},
    "a100": {"name": "NVIDIA A100-SXM4-80GB", "cc": [8, 0], "mem_bytes": 85_899_345_920, "sm_count": 108},
    "b200": {"name": "NVIDIA B200", "cc": [10, 0], "mem_bytes": 191_000_000_000, "sm_count": 148},
    "h200": {"name": "NVIDIA H200", "cc": [9, 0], "mem_bytes": 150_000_000_000, "sm_count": 132},
}

_BASE = {
    "os": {"system": "Linux", "release": "6.1", "platform": "Linux-6.1-x86_64"},
    "python": {"version": "3.11.7", "executable": "/usr/bin/python3"},
    "cpu": {"model": "Fake Xeon", "arch": "x86_64", "count": 2,
            "flags": {"avx2": True, "avx512f": False, "avx512_bf16": False, "amx_bf16": False},
            "ram_bytes": 24 * 2**30, "isa": "AVX2", "matmul_gflops": {"fp32": 93.0, "bf16": 1.3}},
    "torch": {"version": "2.13.0+cpu", "cuda": None, "hip": None, "build": "cpu", "cudnn": None, "nccl": None},
    "toolchain": {"nvcc": None, "nvcc_version": None, "cudnn_header": None, "c_compiler": "/usr/bin/g++",
                  "driver": None},
    "installed": {"te": False, "apex": False, "torchao": False, "liger": False, "triton": False},
    "probes": {
        "gpus": {"cuda_available": False, "gpus": []},
        "compile": {"device": "cpu", "ok": True},
        "torch_native": {"device": "cpu", "fused_adamw": True,
                         "sdpa": {"flash": {"ok": True}, "efficient": {"ok": False, "error": "x"},
                                  "cudnn": {"ok": False, "error": "x"}, "math": {"ok": True}}},
    },
}

TE_OK = {"import_ok": True, "ext_ok": True, "version": "2.8.0", "fp8_available": True, "fp8_reason": "",
         "smoke_ok": True, "smoke_fp8": True}
APEX_OK = {"import_ok": True, "is_nvidia_apex": True, "amp_C": True, "fused_layer_norm_cuda": True,
           "smoke_ok": True, "norm_smoke_ok": True, "norm_max_error": 0.008, "version": None}
TORCHAO_EMU = {"import_ok": True, "version": "0.18.0", "emulate_ok": True, "mxfp8_emulate_ok": True}
# Blackwell (SM 10.0): what TE >= 2.9 and torchao 0.18 report when their MXFP8/NVFP4 kernels ran.
TE_B200 = dict(TE_OK, version="2.9.0", is_mxfp8_available=True, is_nvfp4_available=True, mxfp8_smoke_ok=True,
               nvfp4_smoke_ok=True, probe_api="transformer_engine.pytorch.is_fp8_available")
TORCHAO_B200 = dict(TORCHAO_EMU, fp8_ok=True, mxfp8_ok=True, nvfp4_ok=True)
LIGER_OK = {"import_ok": True, "version": "0.8.5", "smoke_ok": True}
TRITON_OK = {"import_ok": True, "version": "3.5.0", "kernel_ok": True}


def machine(gpu: str | None = None, *, te: dict | None = None, apex: dict | None = None,
            torchao: dict | None = None, liger: dict | None = None, triton: dict | None = None,
            cpu_rates: dict | None = None) -> dict:
    """A facts dict: `gpu` one of GPU's keys (or None), engines given by their probe facts."""
    f = copy.deepcopy(_BASE)
    if cpu_rates is not None:
        f["cpu"]["matmul_gflops"] = cpu_rates
    if gpu:
        f["torch"].update(version="2.11.0+cu130", cuda="13.0", build="cuda", cudnn=91000, nccl="2.27.7")
        f["toolchain"].update(nvcc="/usr/local/cuda/bin/nvcc", nvcc_version="13.0",
                              cudnn_header="/usr/include/cudnn.h", driver="580.65")
        f["probes"]["gpus"] = {"cuda_available": True, "gpus": [dict(GPU[gpu], index=0)]}
        f["probes"]["compile"]["device"] = "cuda"
        f["probes"]["torch_native"] = {"device": "cuda", "fused_adamw": True,
                                       "sdpa": {k: {"ok": True} for k in ("flash", "efficient", "cudnn", "math")}}
    for key, facts in (("te", te), ("apex", apex), ("torchao", torchao), ("liger", liger), ("triton", triton)):
        if facts is not None:
            f["installed"][key] = True
            f["probes"][key] = copy.deepcopy(facts)
    return f




# The fake engines (Transformer Engine, torchao's GEMMs, ATen's _scaled_mm, Liger) live in fake_engines.py;
# their shape rules in overdrive.formats.shape_rules.
from fake_engines import (TE_FAKE_VERSIONS, backward_rules, enforce, fake_liger_norms, fake_mxfp8_mm,  # noqa: E402,F401
                          fake_nvfp4_linear, fake_scaled_mm, fake_te, fake_te_linear)
