"""Fact gatherers for the engines' MXFP8/NVFP4 support, used by `_probes` (in its child process).

Kept apart so each file reads in one sitting; like `_probes`, they only gather facts.
"""

from __future__ import annotations

import importlib


def _te_support(te, what: str) -> tuple[bool, str, str] | None:
    """(available, reason, which API answered) for one TE format check, across TE versions.

    TE >= 2.9 exports `is_<what>_available(return_reason=True)` at the top level. TE 2.0-2.8 have
    `transformer_engine.pytorch.fp8.check_<what>_support()` -> (bool, reason) and the same answer
    from `FP8GlobalStateManager.is_<what>_available()`. Asking only the top level classed every
    TE 2.0-2.8 as "no FP8" on Hopper."""
    fn = getattr(te, f"is_{what}_available", None)
    if fn is not None:
        r = fn(return_reason=True)
        ok, why = (r[0], r[1]) if isinstance(r, tuple) else (r, "")
        return bool(ok), str(why or ""), f"transformer_engine.pytorch.is_{what}_available"
    try:
        fp8 = importlib.import_module("transformer_engine.pytorch.fp8")
    except ImportError:
        return None
    fn = getattr(fp8, f"check_{what}_support", None)
    api = f"transformer_engine.pytorch.fp8.check_{what}_support"
    if fn is None:
        mgr = getattr(fp8, "FP8GlobalStateManager", None)
        fn = getattr(mgr, f"is_{what}_available", None) if mgr is not None else None
        api = f"FP8GlobalStateManager.is_{what}_available"
    if fn is None:
        return None
    r = fn()
    ok, why = (r[0], r[1]) if isinstance(r, tuple) else (r, "")
    return bool(ok), str(why or ""), api


def _run_mx(fmt: str, device: str, *, emulated: bool) -> None:
    """One forward+backward of torchao 0.18's MXFP8 / NVFP4 training linear (dims 128: NVFP4's rule), the
    one the format's torchao engine converts to (`formats.Engine.converter`)."""
    import torch

    from overdrive.formats import get_format

    if get_format(fmt).engine("torchao").converter == "torchao-mxfp8":
        from torchao.prototype.moe_training.config import MXFP8TrainingOpConfig, MXFP8TrainingRecipe
        from torchao.prototype.moe_training.mxfp8_linear import MXFP8Linear

        cfg = MXFP8TrainingOpConfig.from_recipe(MXFP8TrainingRecipe.MXFP8_EMULATED_RCEIL if emulated
                                                else MXFP8TrainingRecipe.MXFP8_RCEIL)
        d = 32 if emulated else 128  # one MXFP8 block is enough to prove the emulated path (seconds on a busy CPU)
        lin = MXFP8Linear(d, d, bias=False, kernel_preference=cfg.kernel_preference,
                          scale_calculation_mode=cfg.scale_calculation_mode)
    else:
        from torchao.prototype.moe_training.nvfp4_training.nvfp4_training import NVFP4Linear

        d = 128  # torchao's Triton NVFP4 kernels need M, K, N % 128
        lin = NVFP4Linear(d, d)
    dtype = torch.float32 if emulated else torch.bfloat16
    lin = lin.to(device, dtype)
    x = torch.randn(d, d, device=device, dtype=dtype, requires_grad=True)
    y = lin(x)
    y.float().sum().backward()
    if not torch.isfinite(y).all():
        raise RuntimeError(f"{fmt} linear produced non-finite output")
