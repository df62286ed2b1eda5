"""Micro-benchmarks: AdamW step, LayerNorm/RMSNorm fwd+bwd, GEMM per precision, SDPA per backend.

Each group times its providers interleaved in rounds (median, p10, p90) and reports achieved
TFLOP/s or GB/s. A provider that cannot run here is listed as skipped with the reason; FP8 GEMM
without FP8 tensor cores is skipped (emulation is never a speed).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from overdrive.measure.stats import summarize
from overdrive.measure.rounds import interleaved_rounds, time_fn
from overdrive.env import EnvReport

__all__ = ["run_micro", "MICRO_SIZES"]

PROVIDER_S = 8.0
"""Seconds of timed calls after which one micro-benchmark provider stops (it keeps at least two samples)."""

MICRO_SIZES = {
    "cpu-quick": {"adamw_params": 1 << 20, "norm": (2048, 512), "gemm": [(512, 512, 512)], "sdpa": (4, 4, 128, 64),
                  "rounds": 3, "reps": 3},
    "cpu": {"adamw_params": 4 << 20, "norm": (4096, 1024), "gemm": [(1024, 1024, 1024), (2048, 512, 2048)],
            "sdpa": (4, 8, 256, 64), "rounds": 5, "reps": 3},
    "gpu": {"adamw_params": 256 << 20, "norm": (16384, 4096),
            "gemm": [(8192, 8192, 8192), (16384, 4096, 16384), (8192, 2048, 8192)],
            "sdpa": (8, 16, 2048, 128), "rounds": 5, "reps": 10},
}


def _group(name: str, providers: dict[str, tuple[Callable[[], None], float, str] | str], device: str,
           rounds: int, reps: int) -> list[dict]:
    """providers: name -> (fn, work per call, unit) or a skip reason. Interleaved rounds."""
    live = {k: v for k, v in providers.items() if not isinstance(v, str)}
    samples: dict[str, list[float]] = {k: [] for k in live}
    warm: dict[str, float] = {}
    for k, (fn, _, _) in live.items():  # warm-up (kernel selection, lazy init)
        warm[k] = time_fn(fn, cuda=device == "cuda")

    # A provider far slower than the others (a bf16 GEMM on a CPU without bf16 units: seconds a
    # call) gets one call per sample and stops after two samples once it has used PROVIDER_S:
    # its rate is still measured, without minutes of the run going to it.
    def run_one(k: str, _r: int) -> bool:
        n = max(1, min(reps, int(PROVIDER_S / 4 / max(warm[k] / 1e3, 1e-9))))
        samples[k].append(time_fn(live[k][0], cuda=device == "cuda", reps=n))
        return len(samples[k]) < 2 or sum(samples[k]) * n / 1e3 < PROVIDER_S

    interleaved_rounds(list(live), run_one, rounds=rounds)
    rows = []
    for k, v in providers.items():
        if isinstance(v, str):
            rows.append({"group": name, "provider": k, "status": "skipped", "reason": v})
            continue
        s = summarize(samples[k])
        work, unit = v[1], v[2]
        rows.append({"group": name, "provider": k, "status": "ok", "ms": s,
                     "rate": work / (s["median"] / 1e3) / 1e12 if s["median"] else None, "unit": unit})
    return rows


def _adamw(env: EnvReport, n: int, device: str) -> dict:
    out: dict = {}
    for impl in ("for-loop", "foreach", "torch-fused", "apex"):
        if impl == "torch-fused" and not env.engine_ok("fused_adamw"):
            out[impl] = env.engine("fused_adamw").reason
            continue
        if impl == "apex" and not env.engine_ok("apex"):
            out[impl] = f"apex {env.engine('apex').status}: {env.engine('apex').reason}"
            continue
        # 16 tensors like a small model's, so foreach/fused have lists to batch over.
        params = [torch.nn.Parameter(torch.randn(n // 16, device=device)) for _ in range(16)]
        for p in params:
            p.grad = torch.randn_like(p)
        from overdrive.optim import build_adamw

        holder = torch.nn.ParameterList(params)
        opt = build_adamw(holder, impl, lr=1e-4)
        # Traffic per element: read p, g, m, v; write p, m, v → 7 x 4 bytes.
        out[impl] = (opt.step, 28.0 * n, "TB/s")
    return out


def _norms(env: EnvReport, shape: tuple[int, int], device: str, dtype) -> dict[str, dict]:
    rows, cols = shape
    x = torch.randn(rows, cols, device=device, dtype=dtype, requires_grad=True)
    gy = torch.randn_like(x)
    groups: dict[str, dict] = {"layernorm": {}, "rmsnorm": {}}
    mods = {"torch": ("torch.nn", "LayerNorm", "RMSNorm")}
    for backend, eng, modname, ln, rms in (("liger", "liger_kernel", "liger_kernel.transformers", "LigerLayerNorm",
                                            "LigerRMSNorm"),
                                           ("apex", "apex", "apex.normalization", "FusedLayerNorm", "FusedRMSNorm"),
                                           ("transformer_engine", "transformer_engine", "transformer_engine.pytorch",
                                            "LayerNorm", "RMSNorm")):
        st = env.engine(eng)
        if st.ok:
            mods[backend] = (modname, ln, rms)
        else:
            groups["layernorm"][backend] = groups["rmsnorm"][backend] = f"{eng} {st.status}: {st.reason}"
    import importlib

    for backend, (modname, ln, rms) in mods.items():
        lib = importlib.import_module(modname)
        for kind, cls in (("layernorm", ln), ("rmsnorm", rms)):
            # LigerRMSNorm's default in_place=True writes dX into dY's storage (liger_kernel ops/rms_norm.py:
            # 555-556), so the gy every provider reuses would be overwritten each call. in_place=False runs the
            # same kernel into a fresh dX (one zeros_like more, ops/rms_norm.py:557-558); cloning gy per call
            # would put a read and a write more in the timed region.
            kw = {"in_place": False} if (backend, kind) == ("liger", "rmsnorm") else {}
            m = getattr(lib, cls)(cols, **kw).to(device=device, dtype=dtype)

            def fn(m=m):
                y = m(x)
                y.backward(gy)
                x.grad = None

            # fwd reads x, writes y; bwd reads x, gy, writes gx: ~5 tensors of rows*cols.
            groups[kind][backend] = (fn, 5.0 * x.numel() * x.element_size(), "TB/s")
    return groups


def _gemm(env: EnvReport, m: int, k: int, n: int, device: str) -> dict:
    out: dict = {}
    a32, b32 = torch.randn(m, k, device=device), torch.randn(k, n, device=device)
    flops = 2.0 * m * k * n

    def mm(a, b, tf32=False):
        def fn():
            if device == "cuda":
                old = torch.backends.cuda.matmul.allow_tf32
                torch.backends.cuda.matmul.allow_tf32 = tf32
                a @ b
                torch.backends.cuda.matmul.allow_tf32 = old
            else:
                a @ b
        return fn

    out["fp32"] = (mm(a32, b32), flops, "TFLOP/s")
    if device == "cuda":
        out["tf32"] = (mm(a32, b32, tf32=True), flops, "TFLOP/s")
    else:
        out["tf32"] = "TF32 is a tensor-core format: GPU only"
    out["bf16"] = (mm(a32.bfloat16(), b32.bfloat16()), flops, "TFLOP/s")
    from overdrive.formats.shape_rules import SCALED_MM

    (_, c1), (r2, c2) = SCALED_MM["mat1"], SCALED_MM["mat2"]  # ATen's operand rule for (M, K) @ (K, N)
    if env.gpus and env.gpus[0].capabilities["fp8"] and (k % c1 or k % r2 or n % c2):
        out["fp8"] = f"torch._scaled_mm needs K and N divisible by 16 (ScaledBlas.cpp), not {m}x{k}x{n}"
    elif env.gpus and env.gpus[0].capabilities["fp8"]:
        a8 = a32.to(torch.float8_e4m3fn)
        b8 = b32.t().contiguous().to(torch.float8_e4m3fn).t()  # column-major B, as cuBLASLt wants
        one = torch.ones((), device=device)
        # use_fast_accum=True, as torchao float8 runs its forward GEMM (Float8LinearConfig
        # gemm_config_output); torch's default (False) is the slower accumulation of its grad GEMMs.
        out["fp8"] = (lambda: torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16,
                                               use_fast_accum=True), flops, "TFLOP/s")
    else:
        out["fp8"] = "no FP8 tensor cores here (SM >= 8.9 needed); an emulated FP8 GEMM is not a speed"
    return out


def _sdpa(env: EnvReport, shape: tuple[int, int, int, int], device: str) -> dict:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    B, H, T, D = shape
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    q, k, v = (torch.randn(B, H, T, D, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
    g = torch.randn(B, H, T, D, device=device, dtype=dtype)
    flops = 3.0 * 4 * B * H * T * T * D / 2  # fwd 4·B·H·T²·D (causal: half), bwd 2x fwd
    out: dict = {}
    for name, attr in (("flash", "FLASH_ATTENTION"), ("efficient", "EFFICIENT_ATTENTION"),
                       ("cudnn", "CUDNN_ATTENTION"), ("math", "MATH")):
        st = env.engine(f"sdpa_{name}")
        if not st.ok:
            out[name] = f"{st.status}: {st.reason}"
            continue
        backend = getattr(SDPBackend, attr)

        def fn(backend=backend):
            with sdpa_kernel(backend):
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            y.backward(g)
            q.grad = k.grad = v.grad = None

        out[name] = (fn, flops, "TFLOP/s")
    return out


def run_micro(env: EnvReport, size: str, progress=None) -> list[dict]:
    if size == "none":
        return []
    cfg = MICRO_SIZES[size]
    dev = env.device
    rounds, reps = cfg["rounds"], cfg["reps"]
    rows: list[dict] = []
    dtype = torch.bfloat16 if dev == "cuda" else torch.float32
    jobs = [("adamw_step", lambda: _adamw(env, cfg["adamw_params"], dev))]
    for kind in ("layernorm", "rmsnorm"):
        jobs.append((f"{kind}_fwd_bwd", lambda kind=kind: _norms(env, cfg["norm"], dev, dtype)[kind]))
    for (m, k, n) in cfg["gemm"]:
        jobs.append((f"gemm_{m}x{k}x{n}", lambda m=m, k=k, n=n: _gemm(env, m, k, n, dev)))
    jobs.append(("sdpa_fwd_bwd", lambda: _sdpa(env, cfg["sdpa"], dev)))
    task = progress.add_task("micro", total=len(jobs)) if progress else None
    for name, make in jobs:
        try:
            rows += _group(name, make(), dev, rounds, reps)
        except Exception as e:  # a failing micro group is a result, not the end of the run
            rows.append({"group": name, "provider": "*", "status": "failed", "reason": f"{type(e).__name__}: {e}"})
        if progress:
            progress.update(task, advance=1, description=f"micro {name}")
    return rows
