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


def fake_te_linear():
    """te.Linear as `fake_te()` fakes it (real signature, TE's dim checks under its FP8 autocast, dynamo
    disabled on forward); tests subclass it to check how the applier drives it."""
    return fake_te()[0]["transformer_engine.pytorch"].Linear


# -- Fake engines that hold the real ones' contracts ---------------------------------------------------
# Each fake has the real signature (tests/unit/test_engine_contracts.py compares them with the installed
# torchao and liger-kernel and with tests/te_api.py for Transformer Engine) and asserts what the real
# engine asserts, so a caller that would crash on the GPU crashes here too.

TE_FAKE_VERSIONS = ("2.8.0", "2.9.0", "2.18.0")
"""The Transformer Engine releases the fake modules can claim to be (te.Linear's signature is the same
from 2.6 to 2.18; `te.autocast` exists from 2.9)."""


def _te_dims_check(recipe, t, what: str) -> None:
    """What TE checks on a GEMM operand under its FP8 autocast, per recipe (sources in tests/te_api.py's
    repository): per-tensor FP8 `assert_dim_for_fp8_exec` (pytorch/utils.py): prod(shape[:-1]) % 8 and
    shape[-1] % 16; MXFP8 (pytorch/csrc/quantizer.cpp, NVTE_CHECK): both % 32; NVFP4
    (tensor/nvfp4_tensor.py is_quantizable): both % 16."""
    import math

    name = type(recipe).__name__
    rows, last = math.prod(t.shape[:-1]), t.shape[-1]
    if name in ("DelayedScaling", "Float8CurrentScaling"):
        assert rows % 8 == 0 and last % 16 == 0, (
            "FP8 execution requires the product of all dimensions except the last to be divisible by 8 and "
            f"the last dimension to be divisible by 16, but got tensor with dims={list(t.shape)} ({what})")
    elif name == "MXFP8BlockScaling":
        if rows % 32 or last % 32:
            raise RuntimeError(f"MXFP8 requires tensor dims that are divisible by 32 (got shape={list(t.shape)}, "
                               f"{what})")
    elif name == "NVFP4BlockScaling":
        if rows % 16 or last % 16:
            raise RuntimeError(f"NVFP4 requires tensor dims that are divisible by 16 (got shape={list(t.shape)}, "
                               f"{what})")
    else:
        raise TypeError(f"not a Transformer Engine recipe: {name}")


def fake_te(version: str = "2.9.0"):
    """(modules, state): fake `transformer_engine`, `.pytorch`, `.common`, `.common.recipe` modules for
    `sys.modules`, as TE `version` defines them, and a state dict (autocast depth, recipes entered, te.Linear
    calls with whether they ran in FP8). te.Linear.forward is torch._dynamo.disable'd, as TE's
    `@no_torch_dynamo()` makes it; under the FP8 autocast it checks the dims TE checks."""
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
            if recipe is not None:
                _te_dims_check(recipe, inp, "input")
                _te_dims_check(recipe, self.weight, "weight")
            state["calls"].append({"fp8": recipe is not None, "tokens": inp.numel() // inp.shape[-1],
                                   "compiling": torch.compiler.is_compiling()})
            # TE casts the input to the activation dtype: torch autocast's, else the parameters'.
            dt = torch.get_autocast_dtype(inp.device.type) if torch.is_autocast_enabled(inp.device.type) \
                else self.weight.dtype
            b = self.bias.to(dt) if self.bias is not None else None
            return F.linear(inp.to(dt), self.weight.to(dt), b)

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
    scale_calculation_mode, wgrad_with_hp=False)` (prototype/moe_training/mxfp8_linear.py) with its real
    kernels' asserts: `triton_to_mxfp8_dim0` wants bf16, contiguous, K % 32 (mx_formats/kernels.py:861),
    `mxfp8_quantize_cuda` rows and cols % 32 (kernels.py:1052) for M, K and N; then torchao's own
    emulated MXFP8 path computes it, in bf16 as the real GEMM returns."""
    from torchao.prototype.moe_training import mxfp8_linear
    from torchao.quantization.quantize_.common.kernel_preference import KernelPreference

    real = mxfp8_linear._to_mxfp8_then_scaled_mm

    def _to_mxfp8_then_scaled_mm(input_hp, weight_hp, kernel_preference, scale_calculation_mode,
                                 wgrad_with_hp=False):
        import torch

        if kernel_preference != KernelPreference.EMULATED:
            for t, what in ((input_hp, "input"), (weight_hp, "weight")):
                assert t.dtype == torch.bfloat16, f"only bfloat16 inputs are supported, got {t.dtype} ({what})"
            m, k = input_hp.numel() // input_hp.shape[-1], input_hp.shape[-1]
            n = weight_hp.shape[0]
            assert m % 32 == 0, "rows must be a multiple of 32"
            assert k % 32 == 0 and n % 32 == 0, "cols must be a multiple of 32"
        if calls is not None:
            calls.append((tuple(input_hp.shape), input_hp.dtype, weight_hp.dtype))
        return real(input_hp, weight_hp, KernelPreference.EMULATED, scale_calculation_mode, wgrad_with_hp)

    return _to_mxfp8_then_scaled_mm


def fake_nvfp4_linear(calls: list | None = None):
    """torchao 0.18's `nvfp4_linear(input_hp, weight_hp, bias=None, *, sign_vector, kernel_preference=TRITON,
    sr_seed=None)` (prototype/moe_training/nvfp4_training/nvfp4_linear.py) with `nvfp4_mm_triton`'s checks:
    TRITON only, M = input_hp.shape[-2], M, K and N % 128; computed by Overdrive's NVFP4 emulation in bf16."""
    from torchao.quantization.quantize_.common.kernel_preference import KernelPreference

    def nvfp4_linear(input_hp, weight_hp, bias=None, *, sign_vector, kernel_preference=KernelPreference.TRITON,
                     sr_seed=None):
        import torch

        from overdrive.convert.mx import _NVFP4EmulatedMM

        if kernel_preference != KernelPreference.TRITON:
            raise ValueError("NVFP4 training linear only supports kernel_preference=KernelPreference.TRITON")
        m, k, n = input_hp.shape[-2], input_hp.shape[-1], weight_hp.shape[0]
        if m % 128 or k % 128 or n % 128:
            raise ValueError(f"nvfp4_mm_triton requires M, K, N all divisible by 128; got M={m}, K={k}, N={n}")
        if len(tuple(sign_vector)) != 16:
            raise ValueError("rht_sign_vector must have 16 elements")
        if calls is not None:
            calls.append(tuple(input_hp.shape))
        y = _NVFP4EmulatedMM.apply(input_hp.float(), weight_hp.float()).to(torch.bfloat16)
        return y + bias.to(y.dtype) if bias is not None else y

    return nvfp4_linear


def fake_liger_norms():
    """LigerRMSNorm and LigerLayerNorm (liger_kernel/transformers/rms_norm.py, layer_norm.py, 0.8.5) with
    their real signatures and asserts, computing in torch (Liger's Triton kernels need a GPU)."""
    import torch
    import torch.nn.functional as F
    from torch import nn

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
            return F.rms_norm(hidden_states, (hidden_states.shape[-1],), eps=self.variance_epsilon) * \
                (self.offset + self.weight)

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
