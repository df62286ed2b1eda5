"""Blackwell block-scaled formats: MXFP8 and NVFP4 linears, from the engine that runs them here.

Formats (what the GEMM operands hold):
- MXFP8: E4M3 values, one power-of-two (E8M0) scale per 32 consecutive values along the
  reduction dim (OCP MX 1.0). Scale = 2^ceil(log2(amax/448)) ("RCEIL", cuBLAS's rule).
- NVFP4: E2M1 values (+-{0, .5, 1, 1.5, 2, 3, 4, 6}), one E4M3 scale per 16 values, and one fp32
  scale per tensor (amax / (6 * 448)) so the E4M3 block scales use their whole range.

Engines, per `resolve`: Transformer Engine (te.Linear under MXFP8BlockScaling / NVFP4BlockScaling),
torchao 0.18 (MXFP8Linear configured from `MXFP8TrainingOpConfig`; NVFP4Linear from
`NVFP4TrainingConfig`, Triton, SM 10.x), or emulation here (numerics only, never faster):
- MXFP8 emulated: torchao's MXFP8_EMULATED_RCEIL recipe, all three GEMMs (forward, grad-input,
  grad-weight) on dequantised MXFP8 operands.
- NVFP4 emulated: our `NVFP4EmulatedLinear`, all three GEMMs on dequantised NVFP4 operands (1x16
  blocks along each GEMM's reduction dim, round to nearest even; the quantiser matches torchao's
  `NVFP4Tensor` bit for bit and needs no engine).
  NVIDIA's recipe also applies a random Hadamard transform to the wgrad inputs, stochastic rounding
  to gradients and 16x16 weight blocks; the emulation has none of these, so its loss gap is an
  upper bound on the real recipe's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from overdrive.convert.padding import new_like, token_padded
from overdrive.formats import EMULATED, TORCHAO, Engine, Format, get_format

__all__ = ["mxfp8_fake_quantize", "nvfp4_fake_quantize", "NVFP4EmulatedLinear", "mx_factory", "MX_FACTORIES"]


def _along(t: torch.Tensor, dim: int, block: int, fn) -> torch.Tensor:
    """Apply a last-dim block quantiser `fn` along `dim` (zero-padded to a multiple of `block`)."""
    x = t.movedim(dim, -1)
    shape = x.shape
    x = x.reshape(-1, shape[-1])
    pad = (-shape[-1]) % block
    if pad:
        x = F.pad(x, (0, pad))  # zeros never raise a block's amax
    y = fn(x.contiguous())[:, :shape[-1]]
    return y.reshape(shape).movedim(-1, dim)


def mxfp8_fake_quantize(t: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Quantise to MXFP8 (E4M3, 32-element blocks along `dim`, RCEIL E8M0 scales) and back, in t's dtype."""
    from torchao.prototype.mx_formats.config import ScaleCalculationMode
    from torchao.prototype.mx_formats.mx_tensor import MXTensor
    from torchao.quantization.quantize_.common.kernel_preference import KernelPreference

    def q(x):
        return MXTensor.to_mx(x, torch.float8_e4m3fn, 32, scaling_mode=ScaleCalculationMode.RCEIL,
                              kernel_preference=KernelPreference.EMULATED).dequantize(x.dtype)

    return _along(t, dim, 32, q)


def _round_e2m1(a: torch.Tensor) -> torch.Tensor:
    """|v| in [0, 6] to the nearest E2M1 magnitude {0, .5, 1, 1.5, 2, 3, 4, 6}, ties to even mantissa.

    The grid spacing is 0.5 below 2, 1 in [2, 4), 2 in [4, 6]; torch.round rounds half to even, which
    is the even-mantissa tie rule on each segment (e.g. 2.5 -> 2, 5 -> 4, 0.25 -> 0)."""
    return torch.where(a < 2, torch.round(a * 2) / 2, torch.where(a < 4, torch.round(a), torch.round(a / 2) * 2))


def _nvfp4_rows(x: torch.Tensor) -> torch.Tensor:
    """(R, C) with C % 16 == 0 -> NVFP4-rounded (R, C) in fp32. Same numerics as torchao's
    NVFP4Tensor.to_nvfp4(x, per_tensor_scale=amax/(6*448)).dequantize() (tests check it), in a
    handful of whole-tensor ops: emulated training spends most of its time here."""
    x = x.float()
    amax = x.abs().amax()
    if amax == 0:
        return x
    # Divisors are tensors on x's device: CUDA divides by a Python float as a multiply by its reciprocal
    # (BinaryDivTrueKernel.cu, a CPU scalar operand), CPU truly divides, and ~23% of fp32 quotients then differ
    # by 1 ulp between the two. A tensor / tensor division is IEEE-exact on both, so CPU and CUDA agree.
    six, e4m3_max = x.new_tensor(6.0), x.new_tensor(448.0)
    tensor_scale = amax / (six * e4m3_max)                        # fp32 level: block scales use E4M3's range
    xb = x.reshape(x.shape[0], -1, 16)                            # (R, C/16, 16)
    block = (xb.abs().amax(-1, keepdim=True) / six) / tensor_scale
    # E4M3 block scales; the floor is E4M3's smallest normal (2^-6), as torchao clamps.
    block = block.clamp(min=torch.finfo(torch.float8_e4m3fn).tiny, max=448.0).to(torch.float8_e4m3fn).float()
    scaled = xb * ((1.0 / tensor_scale) / block)                   # reciprocal first, as torchao/MSLK round
    q = _round_e2m1(scaled.abs().clamp(max=6.0)) * torch.sign(xb)
    return (q * (block * tensor_scale)).reshape(x.shape)


def nvfp4_fake_quantize(t: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Quantise to NVFP4 (E2M1, 16-element blocks along `dim`, E4M3 block scales, fp32 tensor scale) and back."""
    dtype = t.dtype
    return _along(t, dim, 16, lambda x: _nvfp4_rows(x).to(dtype))


class _NVFP4EmulatedMM(torch.autograd.Function):
    """y = x @ W.T with every GEMM operand NVFP4-quantised along that GEMM's reduction dim."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, w)
        x2 = x.reshape(-1, x.shape[-1])                                           # (M, K)
        y = nvfp4_fake_quantize(x2, -1) @ nvfp4_fake_quantize(w, -1).t()          # fprop: reduce over K
        return y.reshape(*x.shape[:-1], w.shape[0])

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        x, w = ctx.saved_tensors
        x2, dy2 = x.reshape(-1, x.shape[-1]), dy.reshape(-1, dy.shape[-1])       # (M, K), (M, N)
        dx = nvfp4_fake_quantize(dy2, -1) @ nvfp4_fake_quantize(w, 0)             # dgrad: reduce over N
        dw = nvfp4_fake_quantize(dy2, 0).t() @ nvfp4_fake_quantize(x2, 0)         # wgrad: reduce over M (tokens)
        return dx.reshape(x.shape), dw


class NVFP4EmulatedLinear(nn.Linear):
    """nn.Linear whose three GEMMs run on NVFP4-rounded operands (numerics only: slower than fp32)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = _NVFP4EmulatedMM.apply(x, self.weight.to(x.dtype))
        return y + self.bias.to(y.dtype) if self.bias is not None else y


# torchao's MXFP8 Triton dim-0 cast (`triton_to_mxfp8_dim0`) asserts bf16 input ("only bfloat16 inputs
# are supported") and `MXFP8Linear.forward` hands it `self.weight` as stored: fp32 master weights
# crash on the first forward. Both GEMM operands go in as bf16 (the weight's cast is differentiable,
# so the fp32 master weight still gets its gradient); the emulated recipe takes any float dtype.
_MX_HP = torch.bfloat16


_BF16: dict[type, type] = {}


def _mxfp8_bf16(cls: type) -> type:
    """torchao's MXFP8Linear with both operands cast to bf16 before its kernels (see _MX_HP)."""
    if cls in _BF16:
        return _BF16[cls]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torchao.prototype.moe_training import mxfp8_linear
        from torchao.quantization.quantize_.common.kernel_preference import KernelPreference

        if self.kernel_preference == KernelPreference.EMULATED:
            return cls.forward(self, x)
        y = mxfp8_linear._to_mxfp8_then_scaled_mm(x.to(_MX_HP), self.weight.to(_MX_HP),
                                                  kernel_preference=self.kernel_preference,
                                                  scale_calculation_mode=self.scale_calculation_mode,
                                                  wgrad_with_hp=self.wgrad_with_hp)
        return y + self.bias.to(y.dtype) if self.bias is not None else y

    _BF16[cls] = type(f"BF16{cls.__name__}", (cls,), {"forward": forward, "__module__": cls.__module__})
    return _BF16[cls]


def _ao_mxfp8(fmt: Format, eng: Engine):
    from torchao.prototype.moe_training.config import MXFP8TrainingOpConfig, MXFP8TrainingRecipe
    from torchao.prototype.moe_training.mxfp8_linear import MXFP8Linear

    emulated = eng.backend == EMULATED
    recipe = "MXFP8_EMULATED_RCEIL" if emulated else fmt.engine(TORCHAO).api  # MXFP8_RCEIL: cuBLAS's scale rule
    cfg = MXFP8TrainingOpConfig.from_recipe(getattr(MXFP8TrainingRecipe, recipe))
    # torchao's own entry point for this config, quantize_(model, cfg), wraps each weight in
    # MXFP8TrainingWeightWrapperTensor, whose F.linear override drops the bias (torchao 0.18:
    # output off by the bias, 3.8 dB SQNR on a Linear with bias 0.5). MXFP8Linear runs the same
    # mx_mm autograd function with the config's settings and adds the bias.
    cls = token_padded(MXFP8Linear if emulated else _mxfp8_bf16(MXFP8Linear),
                       fmt.engine(TORCHAO).rules.multiple("M"))  # emulated too: it runs the same padded M
    return lambda m, fqn: new_like(cls, m, kernel_preference=cfg.kernel_preference,
                                   scale_calculation_mode=cfg.scale_calculation_mode, wgrad_with_hp=cfg.wgrad_with_hp)


def _ao_nvfp4(fmt: Format, eng: Engine):
    from torchao.prototype.moe_training.nvfp4_training.nvfp4_training import NVFP4Linear, NVFP4TrainingConfig

    cfg = NVFP4TrainingConfig()
    cls = token_padded(NVFP4Linear, eng.rules.multiple("M"))  # M = input.shape[-2] % 128

    def ao_nvfp4(m: nn.Linear, fqn: str) -> nn.Module:
        new = cls.from_linear(m, kernel_preference=cfg.kernel_preference, rht_sign_vector=cfg.rht_sign_vector)
        # Its stochastic-rounding seed and Hadamard sign vector are per-run randomness: kept out of
        # the state_dict so checkpoints stay interchangeable with the plain model (torchao notes a
        # new sign vector is harmless for convergence).
        new._non_persistent_buffers_set.update({"_sr_seed", "_rht_sign_vector"})
        return new

    return ao_nvfp4


MX_FACTORIES = {
    "torchao-mxfp8": _ao_mxfp8,
    "torchao-nvfp4": _ao_nvfp4,
    "nvfp4-emulated": lambda fmt, eng: (lambda m, fqn: new_like(NVFP4EmulatedLinear, m)),
}
"""`Engine.converter` -> `build(format, engine)` -> `factory(module, fqn) -> new module`."""


def mx_factory(fmt: str, backend: str):
    """`factory(module, fqn) -> new module` for the block-scaled format `fmt` on torchao or emulated."""
    f = get_format(fmt)
    eng = f.engine(backend)
    if eng is None or eng.converter not in MX_FACTORIES:
        raise ValueError(f"no {fmt} linear for backend {backend!r}")
    return MX_FACTORIES[eng.converter](f, eng)
