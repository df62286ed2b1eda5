"""Fake engines that hold the real ones' contracts: Transformer Engine (te.Linear, autocast, recipes), torchao's
MXFP8/NVFP4 training GEMMs and ATen's `torch._scaled_mm` (what torchao float8 calls), Liger's norms.

Each fake has the real signature (tests/unit/test_engine_contracts.py compares them with the installed torchao
and liger-kernel and with tests/te_api.py for Transformer Engine) and raises where the real engine raises. The
shape rules are not copied here: `enforce` reads them from `overdrive.formats.shape_rules` (the table the
padding code reads, each rule beside its engine source line), forward and backward, so a caller that would
crash on the GPU crashes here too, and a rule fixed there is fixed in both.
"""

from __future__ import annotations

import functools

_ERRORS = {"AssertionError": AssertionError, "ValueError": ValueError, "RuntimeError": RuntimeError}


def enforce(engine: str, gemm: str, *, m: int, k: int, n: int, errors: dict | None = None) -> None:
    """Raise what `engine` raises when its `gemm` ("fprop" | "dgrad" | "wgrad") meets an (M, K) x (N, K) Linear
    that breaks one of its shape rules. `errors` renames an error type (an older release's)."""
    from overdrive.formats.shape_rules import SHAPE_RULES

    broken = SHAPE_RULES[engine].broken(gemm, m=m, k=k, n=n)
    if broken:
        r = broken[0]
        exc = (errors or {}).get(r.error) or _ERRORS[r.error]
        raise exc(f"{r.message} (got M={m}, K={k}, N={n}: {engine} {gemm} needs {r.dim} % {r.multiple}; "
                  f"{r.source})")


@functools.cache
def _backward_rules_fn():
    import torch

    class _BackwardRules(torch.autograd.Function):
        """Identity whose backward runs the engine's dgrad and wgrad checks first: the real engine raises
        there, in loss.backward(), not in the forward."""

        @staticmethod
        def forward(ctx, y, check):
            ctx.check = check
            return y.view_as(y)

        @staticmethod
        def backward(ctx, g):
            ctx.check()
            return g, None

    return _BackwardRules


def backward_rules(y, engine: str, *, m: int, k: int, n: int, errors: dict | None = None):
    """`y`, with `engine`'s dgrad and wgrad shape rules checked when the gradient reaches it."""
    def check():
        enforce(engine, "dgrad", m=m, k=k, n=n, errors=errors)
        enforce(engine, "wgrad", m=m, k=k, n=n, errors=errors)

    return _backward_rules_fn().apply(y, check) if y.requires_grad else y


TE_FAKE_VERSIONS = ("2.8.0", "2.9.0", "2.18.0")
"""The Transformer Engine releases the fake modules can claim to be (te.Linear's signature is the same
from 2.6 to 2.18; `te.autocast` exists from 2.9)."""


def _te_engine(recipe) -> str:
    """The shape_rules key of a TE recipe, from the format registry: the rules of the Transformer Engine
    engine whose recipe class (`Engine.api`) it is (per-tensor FP8 delayed or current scaling, MXFP8, NVFP4)."""
    from overdrive.formats import FORMATS

    name = type(recipe).__name__
    rules = next((e.rules for f in FORMATS.values() for e in f.engines
                  if e.backend == "transformer_engine" and e.api == name), None)
    if rules is None:
        raise TypeError(f"not a Transformer Engine recipe: {name}")
    return rules.name


def fake_te_linear():
    """te.Linear as `fake_te()` fakes it (real signature, TE's shape rules under its FP8 autocast, dynamo
    disabled on forward); tests subclass it to check how the applier drives it."""
    return fake_te()[0]["transformer_engine.pytorch"].Linear


def fake_te(version: str = "2.9.0"):
    """(modules, state): fake `transformer_engine`, `.pytorch`, `.common`, `.common.recipe` modules for
    `sys.modules`, as TE `version` defines them, and a state dict (autocast depth, recipes entered, te.Linear
    calls with whether they ran in FP8). te.Linear.forward is torch._dynamo.disable'd, as TE's
    `@no_torch_dynamo()` makes it; under the FP8 autocast it enforces TE's shape rules for the recipe
    (`overdrive.formats.shape_rules`, each cited) in forward (fprop) and backward (dgrad, wgrad)."""
    import contextlib
    import dataclasses
    import enum
    import types

    import torch
    import torch.nn.functional as F
    from torch import nn

    from te_api import TE_API

    if version not in TE_FAKE_VERSIONS:
        raise ValueError(f"fake_te models TE {TE_FAKE_VERSIONS}, not {version}")
    api = TE_API[version.rsplit(".", 1)[0]]
    state = {"depth": 0, "recipes": [], "calls": [], "version": version}
    # assert_dim_for_fp8_exec asserted up to v2.14 and raises ValueError from v2.15 (utils.py).
    errors = {"ValueError": AssertionError} if tuple(map(int, version.split(".")[:2])) < (2, 15) else {}
    stack: list = []

    class Format(enum.Enum):
        E4M3 = "E4M3"
        E5M2 = "E5M2"
        HYBRID = "HYBRID"

    def _recipe(name: str, fields: dict) -> type:
        return dataclasses.make_dataclass(name, [(k, object, dataclasses.field(default=v)) for k, v in fields.items()])

    rec = types.ModuleType("transformer_engine.common.recipe")
    rec.Format = Format
    rec.DelayedScaling = _recipe("DelayedScaling", {"margin": 0, "fp8_format": Format.HYBRID, "amax_history_len": 1024,
                                                    "amax_compute_algo": "max"})
    rec.Float8CurrentScaling = _recipe("Float8CurrentScaling", {"fp8_format": Format.HYBRID})
    rec.MXFP8BlockScaling = _recipe("MXFP8BlockScaling", {"margin": 0, "fp8_format": Format.E4M3})
    rec.NVFP4BlockScaling = _recipe("NVFP4BlockScaling", {"disable_rht": False})
    for cls in (rec.DelayedScaling, rec.Float8CurrentScaling, rec.MXFP8BlockScaling, rec.NVFP4BlockScaling):
        cls.__module__ = "transformer_engine.common.recipe"

    @contextlib.contextmanager
    def _region(enabled, recipe):
        recipe = recipe if recipe is not None else rec.DelayedScaling()
        state["depth"] += 1
        state["recipes"].append(type(recipe).__name__)
        stack.append(recipe if enabled else None)
        try:
            yield
        finally:
            stack.pop()
            state["depth"] -= 1

    def fp8_autocast(enabled=True, calibrating=False, fp8_recipe=None, fp8_group=None, _graph=False):
        return _region(enabled, fp8_recipe)

    def autocast(enabled=True, calibrating=False, recipe=None, amax_reduction_group=None, _graph=False):
        return _region(enabled, recipe)

    class Linear(nn.Module):
        def __init__(self, in_features, out_features, sequence_parallel=False, fuse_wgrad_accumulation=False,
                     tp_group=None, tp_size=1, get_rng_state_tracker=None, rng_tracker_name=None, init_method=None,
                     bias=True, return_bias=False, params_dtype=None, parallel_mode=None, parameters_split=None,
                     device="cuda", ub_overlap_ag=False, ub_overlap_rs=False, ub_overlap_rs_dgrad=False,
                     ub_bulk_dgrad=False, ub_bulk_wgrad=False, ub_name=None, delay_wgrad_compute=False,
                     symmetric_ar_type=None, save_original_input=False, name=None):
            super().__init__()
            if tp_size != 1 or sequence_parallel or parallel_mode or parameters_split or return_bias:
                raise NotImplementedError("fake te.Linear: tensor parallelism, split or returned bias not modelled")
            dt = params_dtype or torch.get_default_dtype()
            self.weight = nn.Parameter(torch.empty(out_features, in_features, dtype=dt, device=device))
            self.bias = nn.Parameter(torch.zeros(out_features, dtype=dt, device=device)) if bias else None

        @torch._dynamo.disable  # TE: @no_torch_dynamo() on forward, every 2.x (te_api "lines")
        def forward(self, inp, is_first_microbatch=None, fp8_output=False, fp8_grad=False):
            recipe = stack[-1] if stack else None
            m, k, n = inp.numel() // inp.shape[-1], inp.shape[-1], self.weight.shape[0]
            if recipe is not None:
                engine = _te_engine(recipe)
                enforce(engine, "fprop", m=m, k=k, n=n, errors=errors)
            state["calls"].append({"fp8": recipe is not None, "tokens": m, "compiling": torch.compiler.is_compiling()})
            # TE casts the input to the activation dtype: torch autocast's, else the parameters'.
            dt = torch.get_autocast_dtype(inp.device.type) if torch.is_autocast_enabled(inp.device.type) \
                else self.weight.dtype
            b = self.bias.to(dt) if self.bias is not None else None
            y = F.linear(inp.to(dt), self.weight.to(dt), b)
            # dgrad and wgrad run in TE's backward, with the recipe of the forward that saved them.
            return backward_rules(y, engine, m=m, k=k, n=n, errors=errors) if recipe is not None else y

        def get_extra_state(self):
            return torch.tensor([1.0])  # TE keeps its FP8 scaling metadata here

        def set_extra_state(self, st):
            self.loaded_extra = st

    class _Norm(nn.Module):
        def __init__(self, normalized_shape, eps=1e-5, sequence_parallel=None, params_dtype=None,
                     zero_centered_gamma=False, hidden_size=None, **kwargs):
            super().__init__()
            extra = set(kwargs) - {"device", "dtype"}  # TE passes these two on to its ops; others raise there
            if extra:
                raise TypeError(f"unexpected keyword arguments {sorted(extra)}")
            n = normalized_shape if isinstance(normalized_shape, int) else normalized_shape[-1]
            self.weight = nn.Parameter(torch.ones(n, device=kwargs.get("device")))
            self.eps, self.zero_centered_gamma = eps, zero_centered_gamma

        def _w(self):
            return self.weight + 1 if self.zero_centered_gamma else self.weight

    class LayerNorm(_Norm):
        def __init__(self, normalized_shape, eps=1e-5, sequence_parallel=None, params_dtype=None,
                     zero_centered_gamma=False, hidden_size=None, **kwargs):
            super().__init__(normalized_shape, eps, sequence_parallel, params_dtype, zero_centered_gamma,
                             hidden_size, **kwargs)
            self.bias = nn.Parameter(torch.zeros_like(self.weight))

        def forward(self, inp):
            return F.layer_norm(inp, (inp.shape[-1],), self._w(), self.bias, self.eps)

    class RMSNorm(_Norm):
        def forward(self, inp):
            return F.rms_norm(inp, (inp.shape[-1],), self._w(), self.eps)

    te = types.ModuleType("transformer_engine.pytorch")
    te.Linear, te.LayerNorm, te.RMSNorm, te.fp8_autocast = Linear, LayerNorm, RMSNorm, fp8_autocast
    if api["autocast"] is not None:
        te.autocast = autocast
    for cls in (Linear, LayerNorm, RMSNorm):
        cls.__module__ = "transformer_engine.pytorch"
    root = types.ModuleType("transformer_engine")
    root.__version__ = version
    common = types.ModuleType("transformer_engine.common")
    root.pytorch, root.common, common.recipe = te, common, rec
    return {"transformer_engine": root, "transformer_engine.pytorch": te, "transformer_engine.common": common,
            "transformer_engine.common.recipe": rec}, state




def fake_mxfp8_mm(calls: list | None = None):
    """torchao 0.18's `_to_mxfp8_then_scaled_mm(input_hp, weight_hp, kernel_preference,
    scale_calculation_mode, wgrad_with_hp=False)` (prototype/moe_training/mxfp8_linear.py): its Triton dim-0
    cast wants bf16 (mx_formats/kernels.py:860-862), then the "torchao/mxfp8" shape rules forward and backward;
    torchao's own emulated MXFP8 path computes it, in bf16 as the real GEMM returns."""
    from torchao.prototype.moe_training import mxfp8_linear
    from torchao.quantization.quantize_.common.kernel_preference import KernelPreference

    real = mxfp8_linear._to_mxfp8_then_scaled_mm

    def _to_mxfp8_then_scaled_mm(input_hp, weight_hp, kernel_preference, scale_calculation_mode,
                                 wgrad_with_hp=False):
        import torch

        emulated = kernel_preference == KernelPreference.EMULATED
        m, k, n = input_hp.numel() // input_hp.shape[-1], input_hp.shape[-1], weight_hp.shape[0]
        if not emulated:
            for t, what in ((input_hp, "input"), (weight_hp, "weight")):
                assert t.dtype == torch.bfloat16, f"only bfloat16 inputs are supported, got {t.dtype} ({what})"
            enforce("torchao/mxfp8", "fprop", m=m, k=k, n=n)
        if calls is not None:
            calls.append((tuple(input_hp.shape), input_hp.dtype, weight_hp.dtype))
        y = real(input_hp, weight_hp, KernelPreference.EMULATED, scale_calculation_mode, wgrad_with_hp)
        return y if emulated else backward_rules(y, "torchao/mxfp8", m=m, k=k, n=n)

    return _to_mxfp8_then_scaled_mm


def fake_nvfp4_linear(calls: list | None = None):
    """torchao 0.18's `nvfp4_linear(input_hp, weight_hp, bias=None, *, sign_vector, kernel_preference=TRITON,
    sr_seed=None)` (prototype/moe_training/nvfp4_training/nvfp4_linear.py): TRITON only, M = input_hp.shape[-2],
    the "torchao/nvfp4" shape rules; computed by Overdrive's NVFP4 emulation in bf16."""
    from torchao.quantization.quantize_.common.kernel_preference import KernelPreference

    def nvfp4_linear(input_hp, weight_hp, bias=None, *, sign_vector, kernel_preference=KernelPreference.TRITON,
                     sr_seed=None):
        import torch

        from overdrive.convert.mx import _NVFP4EmulatedMM

        if kernel_preference != KernelPreference.TRITON:
            raise ValueError("NVFP4 training linear only supports kernel_preference=KernelPreference.TRITON")
        m, k, n = input_hp.shape[-2], input_hp.shape[-1], weight_hp.shape[0]
        enforce("torchao/nvfp4", "fprop", m=m, k=k, n=n)
        if len(tuple(sign_vector)) != 16:
            raise ValueError("rht_sign_vector must have 16 elements")
        if calls is not None:
            calls.append(tuple(input_hp.shape))
        y = _NVFP4EmulatedMM.apply(input_hp.float(), weight_hp.float()).to(torch.bfloat16)
        y = y + bias.to(y.dtype) if bias is not None else y
        return backward_rules(y, "torchao/nvfp4", m=m, k=k, n=n)

    return nvfp4_linear


def fake_scaled_mm(calls: list | None = None):
    """ATen's `torch._scaled_mm(self, mat2, scale_a, scale_b, bias=None, scale_result=None, out_dtype=None,
    use_fast_accum=False)` with `_scaled_mm_out_cuda`'s operand checks (ScaledBlas.cpp; the rule is
    `overdrive.formats.shape_rules.SCALED_MM`): float8 operands, mat1's trailing dim and both of mat2's % 16.
    Computes (mat1 * scale_a) @ (mat2 * scale_b) in fp32 (scales are the inverse scales torchao passes)."""
    import torch

    from overdrive.formats.shape_rules import SCALED_MM

    def _scaled_mm(self, mat2, scale_a, scale_b, bias=None, scale_result=None, out_dtype=None, use_fast_accum=False):
        for t, what in ((self, "mat1"), (mat2, "mat2")):
            if t.dtype not in (torch.float8_e4m3fn, torch.float8_e5m2):
                raise RuntimeError(f"Expected {what} to be Float8 matrix got {t.dtype}")
        (r1, c1), (r2, c2) = SCALED_MM["mat1"], SCALED_MM["mat2"]
        if c1 and self.shape[1] % c1:
            raise RuntimeError(f"Expected trailing dimension of mat1 to be divisible by 16 but got mat1 shape: "
                               f"({self.shape[0]}x{self.shape[1]}).")
        if mat2.shape[0] % r2 or mat2.shape[1] % c2:
            raise RuntimeError(f"mat2 shape ({mat2.shape[0]}x{mat2.shape[1]}) must be divisible by 16")
        if calls is not None:
            calls.append((tuple(self.shape), tuple(mat2.shape)))
        y = (self.float() * scale_a) @ (mat2.float() * scale_b)
        y = y + bias.float() if bias is not None else y
        return y.to(out_dtype or self.dtype)

    return _scaled_mm


def fake_liger_norms():
    """LigerRMSNorm and LigerLayerNorm (liger_kernel/transformers/rms_norm.py, layer_norm.py, 0.8.5) with
    their real signatures and asserts, computing in torch (Liger's Triton kernels need a GPU). LigerRMSNorm's
    backward with `in_place=True` (its default) writes dX into the incoming gradient's storage, as Liger's
    does (ops/rms_norm.py:555-556: `dX = dY`): a gradient tensor reused across calls is overwritten."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    class _RMSNormFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w, eps, offset, in_place):
            ctx.save_for_backward(x, w)
            ctx.eps, ctx.offset, ctx.in_place = eps, offset, in_place
            return F.rms_norm(x, (x.shape[-1],), eps=eps) * (offset + w)

        @staticmethod
        def backward(ctx, dy):
            x, w = ctx.saved_tensors
            with torch.enable_grad():
                x_, w_ = x.detach().requires_grad_(), w.detach().requires_grad_()
                y = F.rms_norm(x_, (x_.shape[-1],), eps=ctx.eps) * (ctx.offset + w_)
                dx, dw = torch.autograd.grad(y, (x_, w_), dy)
            if ctx.in_place:
                dy.copy_(dx)
                dx = dy
            return dx, dw, None, None, None

    class LigerRMSNorm(nn.Module):
        def __init__(self, hidden_size, eps=1e-06, offset=0.0, casting_mode="llama", init_fn="ones", in_place=True,
                     row_mode=None, elementwise_affine=True):
            super().__init__()
            assert init_fn in ["ones", "zeros"], f"init_fn must be either 'ones' or 'zeros', got {init_fn}"
            self.weight = nn.Parameter(torch.ones(hidden_size) if init_fn == "ones" else torch.zeros(hidden_size))
            self.variance_epsilon, self.offset, self.casting_mode, self.in_place = eps, offset, casting_mode, in_place

        def forward(self, hidden_states):
            # ops/rms_norm.py asserts the casting mode when the kernel runs
            assert self.casting_mode in ("llama", "gemma", "none"), f"Invalid casting mode: {self.casting_mode}"
            return _RMSNormFunction.apply(hidden_states, self.weight, self.variance_epsilon, self.offset,
                                          self.in_place)

    class LigerLayerNorm(nn.Module):
        def __init__(self, hidden_size, eps=1e-06, bias=False, init_fn="ones", impl=None, mode=None, backend=None):
            super().__init__()
            assert init_fn in ["ones", "zeros"], f"init_fn must be either 'ones' or 'zeros', got {init_fn}"
            self.weight = nn.Parameter(torch.ones(hidden_size) if init_fn == "ones" else torch.zeros(hidden_size))
            self.bias = nn.Parameter(torch.randn(hidden_size) if bias else torch.zeros(hidden_size))
            self.variance_epsilon = eps

        def forward(self, hidden_states):
            return F.layer_norm(hidden_states, (hidden_states.shape[-1],), self.weight, self.bias,
                                self.variance_epsilon)

    for cls in (LigerRMSNorm, LigerLayerNorm):
        cls.__module__ = "liger_kernel.transformers"
    return LigerRMSNorm, LigerLayerNorm
