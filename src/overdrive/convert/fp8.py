"""Low-precision linears: nn.Linear → torchao Float8Linear (real or emulated), te.Linear, or the
MXFP8/NVFP4 linears of `convert.mx`. Which layers convert: `convert.policy` (reported per layer).
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable

import torch
from torch import nn

from overdrive.convert.padding import token_padded
from overdrive.convert.policy import HEAD_NAMES, layer_policy
from overdrive.convert.swap import LayerDecision, plan_swaps, share_params, swap_modules
from overdrive.formats import EMULATED, TE, TORCHAO, Engine, Format, get_format, tokens_multiple, version_tuple

__all__ = ["fp8_layer_policy", "convert_fp8", "HEAD_NAMES", "te_fp8_recipe", "te_linear_like", "te_autocast",
           "TE_FP8_TOKENS_MULTIPLE", "CONVERTERS", "torchao_recomputes_weights"]


def fp8_layer_policy(model: nn.Module, *, emulated: bool, min_dim: int, convert_head: bool,
                     module_filter_fn: Callable[[nn.Module, str], bool] | None = None, fmt: str = "fp8",
                     backend: str | None = None) -> Callable[[nn.Module, str], tuple[bool, str] | None]:
    backend = EMULATED if emulated else (backend or TORCHAO)
    return layer_policy(model, fmt=fmt, backend=backend, min_dim=min_dim, convert_head=convert_head,
                        module_filter_fn=module_filter_fn)


def _kind(m: nn.Module) -> str:
    if isinstance(m, nn.Linear):
        return f"Linear({m.in_features}→{m.out_features})"
    return type(m).__name__


# Transformer Engine recipe classes built with settings other than their defaults.
_TE_SETTINGS = {"DelayedScaling": lambda rec: dict(fp8_format=rec.Format.HYBRID, amax_history_len=16,
                                                   amax_compute_algo="max")}


def te_fp8_recipe(scaling: str | None):
    """The Transformer Engine recipe object for a resolved format (resolve checked the TE version): the
    class its `formats.Engine` names (`api`)."""
    rec = importlib.import_module("transformer_engine.common.recipe")
    api = get_format(scaling or "tensorwise").engine(TE).api
    if not api:
        raise ValueError(f"Transformer Engine has no recipe for {scaling}")
    return getattr(rec, api)(**_TE_SETTINGS.get(api, lambda rec: {})(rec))


# Transformer Engine's per-tensor FP8 needs the token count M % 16, not 8: its forward asserts
# prod(shape[:-1]) % 8 (`assert_dim_for_fp8_exec`), but the wgrad GEMM general_gemm(x, dy, layout="NT")
# (module/linear.py:1184-1220) reduces over M, and cuBLASLt FP8 checks lda/ldb % 16 ("Caller must pad",
# common/gemm/cublaslt_gemm.cu:161,252): 8 x 3 tokens crashed in backward. The rules: `formats.shape_rules`.
TE_FP8_TOKENS_MULTIPLE = tokens_multiple("fp8", TE)


def te_linear_like(te, m: nn.Linear, *, tokens_multiple: int) -> nn.Module:
    """A te.Linear holding `m`'s own Parameters, its input's tokens zero-padded to `tokens_multiple`."""
    cls = token_padded(te.Linear, tokens_multiple)
    new = cls(m.in_features, m.out_features, bias=m.bias is not None, params_dtype=m.weight.dtype,
              device=m.weight.device)
    with torch.no_grad():
        share_params(m, new)
    return new


def te_autocast(te_recipe):
    """Transformer Engine's FP8 autocast for `te_recipe`: `te.autocast(enabled=, recipe=)` from TE 2.9
    (transformer_engine/pytorch/quantization.py, v2.9), `te.fp8_autocast(enabled=, fp8_recipe=)` before
    (transformer_engine/pytorch/fp8.py, v2.0-v2.8; deprecated from 2.9). Outside it a te.Linear runs in
    its high-precision dtype: every TE FP8 forward, timed or trained, must run inside."""
    te = importlib.import_module("transformer_engine.pytorch")
    if hasattr(te, "autocast"):
        return te.autocast(enabled=True, recipe=te_recipe)
    return te.fp8_autocast(enabled=True, fp8_recipe=te_recipe)


def _te(model: nn.Module, decide, fmt: Format, eng: Engine, all_gather: bool) -> list[LayerDecision]:
    """te.Linear for every chosen layer; the format comes from TE's autocast recipe (`te_fp8_recipe`), the
    token padding from its rules (per-tensor FP8 M % 16, MXFP8 and NVFP4 M % 32)."""
    te = importlib.import_module("transformer_engine.pytorch")
    mult = eng.rules.multiple("M")
    return swap_modules(model, decide, lambda m, fqn: te_linear_like(te, m, tokens_multiple=mult), _kind)


def _torchao_float8(model: nn.Module, decide, fmt: Format, eng: Engine, all_gather: bool) -> list[LayerDecision]:
    """torchao's Float8Linear (real or emulated) with its recipe named by the engine (`api`)."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    cfg = Float8LinearConfig.from_recipe_name(fmt.engine(TORCHAO).api)
    if eng.backend == EMULATED:
        cfg = dataclasses.replace(cfg, emulate=True)
    if all_gather:
        cfg = dataclasses.replace(cfg, enable_fsdp_float8_all_gather=True)
        if torchao_recomputes_weights():
            cfg = dataclasses.replace(cfg, force_recompute_fp8_weight_in_bwd=True)
    # torchao's public entry point, not Float8Linear.from_float: it also applies torchao's inductor
    # workaround for a Triton fp8 miscompile (NaN in compiled backward on newer torch). Our policy
    # decides, its filter obeys; Float8Linear keeps the user's weight and bias Parameters.
    plan = plan_swaps(model, decide, _kind)
    chosen = {d.fqn for d in plan if d.converted}
    if chosen:
        convert_to_float8_training(model, config=cfg, module_filter_fn=lambda m, fqn: fqn in chosen)
        if eng.backend == TORCHAO:
            _pad_float8_tokens(model, chosen, eng.rules.multiple("M"))
    return plan


WEIGHT_RECOMPUTE_UNTIL = (0, 12)
"""torchao before 0.12 needs `force_recompute_fp8_weight_in_bwd` under FSDP: without it torch.compile's partitioner
saves each float8 linear's gathered (unsharded) weight transpose for the backward, a float8 copy of every weight
held from forward to backward (pytorch/ao#936, pytorch/pytorch#141881 "Partitioner stores fp8 copy of all weights
between fwd and bwd, causing OOM"; torchtitan's float8 doc passed the flag beside the float8 all-gather). torchao
0.12 made the flag a no-op that logs a deprecation (pytorch/ao#2356: PyTorch's partitioner handles it)."""


def torchao_recomputes_weights() -> bool:
    """Whether the installed torchao takes `force_recompute_fp8_weight_in_bwd` (0.6 to 0.11; `WEIGHT_RECOMPUTE_UNTIL`)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        v = version_tuple(version("torchao"))
    except PackageNotFoundError:
        return False
    return bool(v) and v < WEIGHT_RECOMPUTE_UNTIL


def _block_scaled(model: nn.Module, decide, fmt: Format, eng: Engine, all_gather: bool) -> list[LayerDecision]:
    from overdrive.convert.mx import MX_FACTORIES

    return swap_modules(model, decide, MX_FACTORIES[eng.converter](fmt, eng), _kind)


CONVERTERS = {"te": _te, "torchao-float8": _torchao_float8, "torchao-mxfp8": _block_scaled,
              "torchao-nvfp4": _block_scaled, "nvfp4-emulated": _block_scaled}
"""`formats.Engine.converter` -> `convert(model, decide, format, engine, fsdp_float8_all_gather)`."""


def convert_fp8(model: nn.Module, *, backend: str, scaling: str, min_dim: int = 1024, convert_head: bool = False,
                module_filter_fn: Callable[[nn.Module, str], bool] | None = None,
                enable_fsdp_float8_all_gather: bool = False) -> list[LayerDecision]:
    """Swap the chosen linears in place; returns one decision per linear-like layer.

    `scaling` names the format (`formats.FORMATS`: a name, preset or `fp8_scaling` value); `backend` the
    engine of that format that runs it. `enable_fsdp_float8_all_gather` (torchao, formats with
    `fsdp_float8_all_gather`): FSDP2 all-gathers the weights in float8."""
    fmt = get_format(scaling)
    eng = fmt.engine(backend)
    if eng is None or eng.unsupported:
        raise ValueError(f"unknown FP8 backend {backend!r} for {fmt.name}: "
                         f"{', '.join(e.backend for e in fmt.engines if not e.unsupported)}")
    decide = layer_policy(model, fmt=fmt.name, backend=backend, min_dim=min_dim, convert_head=convert_head,
                          module_filter_fn=module_filter_fn)
    return CONVERTERS[eng.converter](model, decide, fmt, eng, enable_fsdp_float8_all_gather)


def _pad_float8_tokens(model: nn.Module, chosen: set[str], multiple: int) -> None:
    """torchao's Float8Linear pads nothing: its wgrad torch.mm(grad_output.t(), input) (float8/float8_linear.py:
    197-200) becomes `_scaled_mm` with mat1 (N, M), and ATen requires mat1's trailing dim M % 16 (ScaledBlas.cpp
    `_scaled_mm_out_cuda`). Its `pad_inner_dim` (float8/config.py:231, off by default) would pad and re-lay-out
    both operands of every GEMM, every step, aligned or not (float8_ops.py:335-345); padding the tokens costs
    nothing when M % 16 == 0 (the usual batch x sequence) and one zero pad of x otherwise. The emulated path
    never calls `_scaled_mm` and is left as it is."""
    from torchao.float8.float8_linear import Float8Linear

    padded = token_padded(Float8Linear, multiple)
    for fqn, m in model.named_modules():
        if fqn in chosen and type(m) is Float8Linear:
            m.__class__ = padded  # same module, same Parameters and state_dict keys; only forward pads
