"""Fact gatherers for the engines' MXFP8/NVFP4 support, used by `_probes` (in its child process).

Kept apart so each file reads in one sitting; like `_probes`, they only gather facts.
"""

from __future__ import annotations

import importlib

from overdrive.env._probes_torch import _err


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


def _probed() -> list:
    """The formats whose engines are probed by name (`Format.probed`): MXFP8, NVFP4."""
    from overdrive.formats import FORMATS

    return list({f.kind: f for f in FORMATS.values() if f.probed}.values())


def _te_linear_runs(recipe, enabled: bool = True) -> None:
    """One te.Linear forward+backward on the GPU under TE's FP8 autocast with `recipe` (None: TE's default)."""
    import torch
    import transformer_engine.pytorch as te

    d = 128 if recipe is not None else 64  # the block-scaled recipes' rules: dims % 32 (NVFP4's wgrad)
    lin = te.Linear(d, d, params_dtype=torch.bfloat16).cuda()
    x = torch.randn(d if recipe is not None else 32, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    kw = {} if recipe is None else {"recipe": recipe}
    ctx = te.autocast(enabled=enabled, **kw) if hasattr(te, "autocast") else \
        te.fp8_autocast(enabled=enabled, **({} if recipe is None else {"fp8_recipe": recipe}))
    with ctx:
        y = lin(x)
    y.float().sum().backward()
    torch.cuda.synchronize()


def _te_availability(f: dict) -> None:
    """TE's own answer, format by format: fp8_available, is_<kind>_available and their reasons."""
    try:
        import transformer_engine.pytorch as te

        for what in ("fp8", *[fmt.kind for fmt in _probed()], "fp8_block_scaling"):
            got = _te_support(te, what)
            if got is None:
                continue
            ok, reason, api = got
            key = "fp8_available" if what == "fp8" else f"is_{what}_available"
            f[key], f[f"{what}_reason"] = ok, reason
            f.setdefault("probe_api", api)
        f.setdefault("fp8_available", False)
        f.setdefault("fp8_reason", "this Transformer Engine has no FP8 availability check")
    except BaseException as e:
        f["fp8_available"], f["fp8_reason"] = False, _err(e)
