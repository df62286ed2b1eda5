"""Resolve the Blackwell block-scaled formats (MXFP8, NVFP4) to the best engine that runs here.

Order (backend "auto"):
1. Transformer Engine: te.Linear under `MXFP8BlockScaling` (TE >= 2.0) / `NVFP4BlockScaling`
   (TE >= 2.8), when TE's own probe says the format is available (SM 10.x) and its smoke run passed.
2. torchao 0.18: MXFP8 for dense linears (the `MXFP8TrainingOpConfig` settings, SM 10.x with its
   CUDA MXFP8 cast kernels); NVFP4 `NVFP4TrainingConfig` (Triton, SM >= 10.0, bf16, M/K/N % 128).
3. No GPU that runs FP8 at all: emulation (numerics only, never a speedup): torchao's
   MXFP8_EMULATED_RCEIL recipe; our NVFP4 emulation (pure torch, always available).
4. A GPU with FP8 but without these formats (H100/H200): per-tensor FP8 through the usual FP8
   resolution — a real speedup there, where emulation would be a slowdown. Ask for
   `fp8_backend="emulated"` (e.g. "nvfp4+emulated") to study the numerics on such a GPU.
"""

from __future__ import annotations

from overdrive.env import EnvReport

__all__ = ["resolve_block_scaled", "TE_SINCE", "version_tuple"]

# First Transformer Engine release with each recipe class (TE's API docs: 2.0 lists MXFP8BlockScaling;
# 2.7's recipe.Format has no E2M1, 2.8 adds NVFP4BlockScaling).
TE_SINCE = {"mxfp8": (2, 0), "nvfp4": (2, 8)}
_NAME = {"mxfp8": "MXFP8", "nvfp4": "NVFP4"}


def version_tuple(v: str | None) -> tuple[int, ...]:
    """"2.8.0+cu12" -> (2, 8, 0); unknown -> ()."""
    out = []
    for part in (v or "").split("+")[0].split("."):
        digits = "".join(ch for ch in part if ch.isdigit())
        if not digits:
            break
        out.append(int(digits))
    return tuple(out)


def _te_why_not(fmt: str, env: EnvReport) -> str | None:
    te = env.engine("transformer_engine")
    name = _NAME[fmt]
    if te.status == "missing":
        return "Transformer Engine is not installed"
    if not te.ok and te.status != "unsupported":
        return f"Transformer Engine is {te.status}: {te.reason}"
    if not env.gpus:
        return "Transformer Engine needs a CUDA GPU"
    v = version_tuple(te.version)
    if v and v < TE_SINCE[fmt]:
        since = ".".join(map(str, TE_SINCE[fmt]))
        return f"Transformer Engine {te.version} predates {name} (NVFP4BlockScaling/MXFP8BlockScaling first in " \
               f"{since}): pip install -U transformer_engine[pytorch]"
    avail = te.details.get(f"is_{fmt}_available")
    if avail is False or (avail is None and not any(g.capabilities[fmt] for g in env.gpus)):
        g = env.gpus[0]
        why = te.details.get(f"{fmt}_reason") or f"{name} needs SM 10.x"
        return f"Transformer Engine: {why} ({g.name} is SM {g.cc[0]}.{g.cc[1]})"
    if te.details.get(f"{fmt}_smoke_ok") is False:
        return f"Transformer Engine's {name} te.Linear failed here: {te.details.get(f'{fmt}_smoke_error')}"
    if not te.ok:
        return f"Transformer Engine is {te.status}: {te.reason}"
    return None


def _ao_why_not(fmt: str, env: EnvReport) -> str | None:
    ao = env.engine("torchao")
    name = _NAME[fmt]
    if ao.status == "missing":
        return "torchao is not installed"
    if not env.gpus or not any(g.capabilities[fmt] for g in env.gpus):
        where = f"{env.gpus[0].name} is SM {env.gpus[0].cc[0]}.{env.gpus[0].cc[1]}" if env.gpus else "no GPU here"
        return f"torchao's {name} kernels need SM 10.x ({where})"
    if ao.details.get(f"{fmt}_ok"):
        return None
    err = ao.details.get(f"{fmt}_error")
    return f"torchao's {name} training linear failed here: {err}" if err else \
        f"torchao's {name} training linear was not probed on this GPU (torchao {ao.version})"


def _emulation_why_not(fmt: str, env: EnvReport) -> str | None:
    if fmt == "nvfp4":
        return None  # overdrive's own NVFP4 emulation: plain torch ops
    ao = env.engine("torchao")
    if ao.details.get("mxfp8_emulate_ok"):
        return None
    if ao.status == "missing":
        return "torchao is not installed (pip install 'torchao>=0.10' for its MXFP8 emulation)"
    return f"torchao's MXFP8 emulated recipe failed here: {ao.details.get('mxfp8_emulate_error') or ao.reason}"


def resolve_block_scaled(fmt: str, req_backend: str, env: EnvReport, log, *, te_blocked: str | None = None
                         ) -> tuple[str | None, str]:
    """(backend, why) for `fmt` with the user's backend request; backend None means "not here": the
    caller falls back to per-tensor FP8. Decisions go to `log` (a fallback raises under strict).
    `te_blocked`: why Transformer Engine must not be used with the rest of the recipe."""
    name = _NAME[fmt]
    want = f"{fmt} (backend {req_backend})"
    checks = {"transformer_engine": (lambda f, e: te_blocked or _te_why_not(f, e)), "torchao": _ao_why_not}
    order = {"auto": ["transformer_engine", "torchao"], "transformer_engine": ["transformer_engine", "torchao"],
             "torchao": ["torchao", "transformer_engine"], "emulated": []}[req_backend]
    reasons: list[str] = []
    for b in order:
        why = checks[b](fmt, env)
        if why is None:
            label = f"{name} via {'Transformer Engine' if b == 'transformer_engine' else 'torchao'} on {env.gpus[0].name}"
            if req_backend in ("auto", b):
                log.add(fmt, want, b, label)
            else:
                log.add(fmt, want, b, f"{req_backend} {name} requested: {'; '.join(reasons)} → {label}", fallback=True)
            return b, label
        reasons.append(why)
    fp8_gpu = any(g.capabilities["fp8"] for g in env.gpus)
    emu_why = _emulation_why_not(fmt, env)
    if emu_why is None and (req_backend == "emulated" or not fp8_gpu):
        gemms = "forward, grad-input and grad-weight GEMMs"
        how = "torchao's MXFP8_EMULATED_RCEIL recipe" if fmt == "mxfp8" else \
            "E2M1 values, 16-element blocks, E4M3 block scales, round-to-nearest (no Hadamard transform or " \
            "stochastic rounding)"
        label = f"emulated {name}: {how}, on the {gemms}; numerics only, not faster"
        if req_backend == "emulated":
            log.add(fmt, want, "emulated", label)
        else:
            log.add(fmt, want, "emulated", f"{fmt} requested: {'; '.join(reasons)} → {label}", fallback=True)
        return "emulated", label
    if emu_why:
        reasons.append(emu_why)
    return None, "; ".join(reasons)
