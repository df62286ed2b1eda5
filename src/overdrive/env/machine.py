"""The environment report (`EnvReport`): what this machine is and what it can really run.

`build_report(facts)` is pure: the same facts give the same report, so tests build the
reports of machines we do not have (an H100 with TE, an A100, a B200, a broken Apex).
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field

from overdrive.env.catalog import GpuSpec, lookup_gpu
from overdrive.env.engines import EngineStatus, classify_engines
from overdrive.formats import FORMATS

__all__ = ["SCHEMA_VERSION", "EnvReport", "GpuInfo", "build_report", "gpu_capabilities"]

SCHEMA_VERSION = "overdrive.env/1"


def gpu_capabilities(cc: tuple[int, int]) -> dict[str, bool]:
    """What the tensor cores of a compute capability can do (NVIDIA's architecture tables)."""
    return {
        "fp16": cc >= (7, 0),          # Volta tensor cores
        "bf16": cc >= (8, 0),          # Ampere
        "tf32": cc >= (8, 0),
        # Each low-precision format's own gate (`Format.runs_on`): FP8 on Ada (8.9) and Hopper (9.0) E4M3/E5M2
        # tensor cores; block-scaled MXFP8 on the data-center Blackwell parts (SM 10.x); NVFP4 on Blackwell.
        **{f.kind: f.runs_on(cc) for f in FORMATS.values()},
    }


@dataclass(kw_only=True)
class GpuInfo:
    index: int
    name: str
    cc: tuple[int, int]
    mem_gib: float
    sm_count: int
    capabilities: dict[str, bool]
    spec: GpuSpec | None

    def to_dict(self) -> dict:
        spec = self.spec
        return {
            "index": self.index, "name": self.name, "cc": list(self.cc), "mem_gib": round(self.mem_gib, 2),
            "sm_count": self.sm_count, "capabilities": self.capabilities,
            "catalog": spec.key if spec else None,
            "peak_bf16_tflops": spec.bf16_tflops if spec else None,
            "peak_fp8_tflops": spec.fp8_tflops if spec else None,
            "hbm_tbs": spec.hbm_tbs if spec else None,
        }


@dataclass(kw_only=True)
class EnvReport:
    created: str
    platform: dict
    torch: dict
    toolchain: dict
    gpus: list[GpuInfo]
    engines: dict[str, EngineStatus]
    best_precision: str
    best_precision_reason: str
    fp8_backend: str | None
    fp8_reason: str
    verdict: list[str] = field(default_factory=list)
    facts: dict = field(default_factory=dict, repr=False)

    @property
    def has_gpu(self) -> bool:
        return bool(self.gpus)

    @property
    def device(self) -> str:
        return "cuda" if self.gpus else "cpu"

    def engine(self, name: str) -> EngineStatus:
        return self.engines.get(name) or EngineStatus(name=name, status="missing", reason="not probed")

    def engine_ok(self, name: str) -> bool:
        return self.engine(name).ok

    def to_dict(self) -> dict:
        return {
            "schema": SCHEMA_VERSION, "created": self.created, "platform": self.platform, "torch": self.torch,
            "toolchain": self.toolchain, "gpus": [g.to_dict() for g in self.gpus],
            "engines": {k: v.to_dict() for k, v in self.engines.items()},
            "best_precision": {"precision": self.best_precision, "reason": self.best_precision_reason},
            "fp8": {"backend": self.fp8_backend, "reason": self.fp8_reason},
            "verdict": self.verdict,
        }


def _gpus(facts: dict) -> list[GpuInfo]:
    out = []
    for g in (facts.get("probes", {}).get("gpus") or {}).get("gpus", []):
        cc = (int(g["cc"][0]), int(g["cc"][1]))
        out.append(GpuInfo(index=g["index"], name=g["name"], cc=cc, mem_gib=g["mem_bytes"] / 2**30,
                           sm_count=g["sm_count"], capabilities=gpu_capabilities(cc), spec=lookup_gpu(g["name"])))
    return out


def _best_precision(cpu: dict, gpus: list[GpuInfo]) -> tuple[str, str]:
    if gpus:
        g = gpus[0]
        if g.capabilities["bf16"]:
            return "bf16", f"{g.name} (SM {g.cc[0]}.{g.cc[1]}) has bf16 tensor cores; no loss scaling needed"
        if g.capabilities["fp16"]:
            return "fp16", f"{g.name} (SM {g.cc[0]}.{g.cc[1]}) has fp16 but no bf16 tensor cores"
        return "fp32", f"{g.name} (SM {g.cc[0]}.{g.cc[1]}) has no tensor cores"
    flags = cpu.get("flags", {})
    rates = cpu.get("matmul_gflops") or {}
    if rates.get("fp32") and rates.get("bf16"):
        # The measurement wins over the flags (a VM may list AMX without enabling it). On a 2-core
        # AVX2 machine we measured bf16 ~70x slower than fp32 (1.3 vs 93 GFLOP/s).
        ratio = rates["bf16"] / rates["fp32"]
        measured = f"bf16 matmul {rates['bf16']:.3g} vs fp32 {rates['fp32']:.3g} GFLOP/s measured here"
        if ratio >= 1.2:
            return "bf16", f"this CPU has working bf16 units: {measured}"
        if ratio >= 0.8:
            return "fp32", f"bf16 brings no speed on this CPU ({measured}), fp32 keeps full accuracy"
        return "fp32", f"this CPU has no usable bf16 units: {measured} ({1 / ratio:.0f}x slower)"
    if flags.get("amx_bf16") or flags.get("avx512_bf16"):
        unit = "AMX" if flags.get("amx_bf16") else "AVX512-BF16"
        return "bf16", f"this CPU lists bf16 units ({unit})"
    return "fp32", "this CPU has no bf16 units (no AVX512-BF16/AMX): bf16 runs far slower than fp32 here"


def _fp8(engines: dict[str, EngineStatus], gpus: list[GpuInfo]) -> tuple[str | None, str]:
    if not any(g.capabilities["fp8"] for g in gpus):
        why = (f"{gpus[0].name} is SM {gpus[0].cc[0]}.{gpus[0].cc[1]}, FP8 needs SM >= 8.9" if gpus
               else "no GPU with SM >= 8.9")
        emu = " (torchao emulation available for numerics only)" if engines.get("torchao") and \
            engines["torchao"].details.get("emulate_ok") else ""
        return None, why + emu
    for name, label in (("transformer_engine", "Transformer Engine"), ("torchao", "torchao float8")):
        if engines.get(name) and engines[name].ok:
            return name, f"{label} runs FP8 on {gpus[0].name}"
    return None, ("the GPU has FP8 tensor cores but no FP8 engine works: "
                  "pip install 'torchao>=0.10' or install Transformer Engine")


def build_report(facts: dict, *, created: str | None = None) -> EnvReport:
    gpus = _gpus(facts)
    gdicts = [{"name": g.name, "cc": g.cc} for g in gpus]
    engines = classify_engines(facts, gdicts)
    cpu = facts.get("cpu", {})
    best, best_why = _best_precision(cpu, gpus)
    fp8_backend, fp8_why = _fp8(engines, gpus)
    gp = facts.get("probes", {}).get("gpus") or {}
    torch_f = dict(facts.get("torch", {}))
    torch_f["cuda_available"] = bool(gp.get("cuda_available"))
    if gp.get("error") or "_timeout" in gp or "_crash" in gp:
        torch_f["cuda_error"] = gp.get("error") or gp.get("_crash") or f"CUDA init hung ({gp['_timeout']} s)"
    rep = EnvReport(
        created=created or _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        platform={"os": facts.get("os", {}), "python": facts.get("python", {}), "cpu": cpu},
        torch=torch_f, toolchain=facts.get("toolchain", {}), gpus=gpus, engines=engines,
        best_precision=best, best_precision_reason=best_why, fp8_backend=fp8_backend, fp8_reason=fp8_why,
        facts=facts,
    )
    rep.verdict = _verdict(rep)
    return rep


def _verdict(r: EnvReport) -> list[str]:
    lines = []
    if r.fp8_backend:
        lines.append(f"FP8: available — {r.fp8_reason}.")
    else:
        lines.append(f"FP8: unavailable — {r.fp8_reason}.")
    lines.append(f"Best precision here: {r.best_precision} ({r.best_precision_reason}).")
    broken = [e for e in r.engines.values() if e.status == "broken"]
    for e in broken:
        lines.append(f"{e.name} is broken: {e.reason}. Fix: {e.fix}")
    if r.torch.get("cuda_error"):
        lines.append(f"CUDA is present but failed to initialise: {r.torch['cuda_error']}.")
    if not r.gpus and r.torch.get("build") == "cuda":
        lines.append("This torch is a CUDA build but no GPU is visible (check the driver and CUDA_VISIBLE_DEVICES).")
    return lines
