"""Fact gatherers for torch's own features, used by `_probes` (in its child process): the GPUs,
torch.compile, fused AdamW and the SDPA backends; and the helpers every gatherer shares.

Kept apart so each file reads in one sitting; like `_probes`, they only gather facts.
"""

from __future__ import annotations


def _err(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}".strip().splitlines()[0][:400]


def _device():
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def probe_gpus() -> dict:
    import torch

    out: dict = {"cuda_available": False, "gpus": []}
    try:
        out["cuda_available"] = bool(torch.cuda.is_available())
        for i in range(torch.cuda.device_count() if out["cuda_available"] else 0):
            p = torch.cuda.get_device_properties(i)
            out["gpus"].append({
                "index": i, "name": p.name, "cc": [p.major, p.minor],
                "mem_bytes": int(p.total_memory), "sm_count": int(p.multi_processor_count),
            })
    except Exception as e:  # a driver/runtime mismatch shows up here
        out["error"] = _err(e)
    return out


def probe_compile() -> dict:
    import torch

    dev = _device()
    f: dict = {"device": dev}
    try:
        fn = torch.compile(lambda a, b: torch.nn.functional.gelu(a @ b) * 2.0)
        a, b = torch.randn(16, 16, device=dev), torch.randn(16, 16, device=dev)
        ok = torch.allclose(fn(a, b), torch.nn.functional.gelu(a @ b) * 2.0, atol=1e-4, rtol=1e-4)
        f["ok"] = bool(ok)
        if not ok:
            f["error"] = "compiled result differs from eager"
    except BaseException as e:
        f["ok"], f["error"] = False, _err(e)
    return f


def probe_torch_native() -> dict:
    """Fused AdamW and the SDPA backends on the default device."""
    import torch
    import torch.nn.functional as F

    dev = _device()
    f: dict = {"device": dev}
    try:
        p = torch.nn.Parameter(torch.randn(64, device=dev))
        opt = torch.optim.AdamW([p], lr=1e-3, fused=True)
        p.grad = torch.randn_like(p)
        opt.step()
        f["fused_adamw"] = True
    except BaseException as e:
        f["fused_adamw"], f["fused_adamw_error"] = False, _err(e)
    f["sdpa"] = {}
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except BaseException as e:
        f["sdpa_error"] = _err(e)
        return f
    dtype = torch.bfloat16 if dev == "cuda" else torch.float32
    q = torch.randn(1, 2, 64, 64, device=dev, dtype=dtype)
    names = {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION",
             "cudnn": "CUDNN_ATTENTION", "math": "MATH"}
    for short, attr in names.items():
        backend = getattr(SDPBackend, attr, None)
        if backend is None:
            f["sdpa"][short] = {"ok": False, "error": "this torch has no such backend"}
            continue
        try:
            with sdpa_kernel(backend):
                F.scaled_dot_product_attention(q, q, q, is_causal=True)
            f["sdpa"][short] = {"ok": True}
        except BaseException as e:
            # The error names the reasons each backend declined ("not supported on CPU", ...).
            f["sdpa"][short] = {"ok": False, "error": _err(e)}
    return f
