"""The shape rules of every low-precision GEMM Overdrive calls, each beside the engine line that enforces it.

One table, read by everyone who needs it, so they cannot drift apart; each `formats.Engine` holds its
format's rules from here:
- `convert.padding.pad_tokens` pads the token count M to `formats.tokens_multiple(fmt, backend)`;
- `convert.policy` keeps layers whose K or N break `formats.dims_multiple(fmt, backend)` in high precision;
- the fake engines of tests/fake_engines.py raise where `EngineRules.broken(...)` says the real engine
  raises, forward and backward, so a CPU test fails where the GPU would.

A Linear y = x @ W.T with x (M, K) (M = tokens, all leading dims flattened), W (N, K) runs three GEMMs:
  fprop  y (M, N)  = x (M, K)    @ W.T (K, N)
  dgrad  dx (M, K) = dy (M, N)   @ W (N, K)
  wgrad  dW (N, K) = dy.T (N, M) @ x (M, K)      <- M is the reduction dim here: the FP8 GEMMs'
                                                    leading-dimension rules land on the token count.
Sources: Transformer Engine v2.18 (NVIDIA/TransformerEngine, tag v2.18), torchao 0.18.0 (pytorch/ao),
PyTorch's ATen `_scaled_mm` (aten/src/ATen/native/cuda/ScaledBlas.cpp, `_scaled_mm_out_cuda`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["Rule", "EngineRules", "SHAPE_RULES", "SCALED_MM"]

GEMMS = ("fprop", "dgrad", "wgrad")


@dataclass(frozen=True, kw_only=True)
class Rule:
    gemm: str
    """Which call checks it: "fprop" (forward), "dgrad" or "wgrad" (backward)."""
    dim: str
    """"M" (tokens), "K" (in_features) or "N" (out_features)."""
    multiple: int
    error: str
    """The exception the engine raises: "AssertionError" | "ValueError" | "RuntimeError"."""
    message: str
    """The engine's own message (a fake raises it, so tests can match the real text)."""
    source: str
    """file:line of the check in the engine release the table names."""


@dataclass(frozen=True, kw_only=True)
class EngineRules:
    name: str
    rules: tuple[Rule, ...]

    def multiple(self, dim: str) -> int:
        """What `dim` must be a multiple of for every GEMM to run (1: no rule)."""
        return math.lcm(1, *(r.multiple for r in self.rules if r.dim == dim))

    def broken(self, gemm: str, *, m: int, k: int, n: int) -> list[Rule]:
        """The rules a `gemm` call on an (M, K) x (N, K) Linear breaks, in table order."""
        size = {"M": m, "K": k, "N": n}
        return [r for r in self.rules if r.gemm == gemm and size[r.dim] % r.multiple]


def _rules(gemm_dims: dict[str, tuple[tuple[str, int], ...]], *, error: str, message: str,
           source: str) -> tuple[Rule, ...]:
    return tuple(Rule(gemm=g, dim=d, multiple=mult, error=error, message=message, source=source)
                 for g, dims in gemm_dims.items() for d, mult in dims)


# -- ATen `torch._scaled_mm` (what torchao float8 calls for every GEMM, tensorwise and rowwise) ----------
SCALED_MM = {"mat1": (None, 16), "mat2": (16, 16)}
"""Operand rule of `_scaled_mm(mat1 (a, b), mat2 (b, c))`: ScaledBlas.cpp `_scaled_mm_out_cuda` checks
`mat1.sizes()[1] % 16` ("Expected trailing dimension of mat1 to be divisible by 16") and
`mat2.sizes()[0] % 16 && mat2.sizes()[1] % 16` ("mat2 shape (..) must be divisible by 16")."""
_SCALED_MM_SRC = "aten/src/ATen/native/cuda/ScaledBlas.cpp _scaled_mm_out_cuda (TORCH_CHECK mat1.sizes()[1] % 16, " \
                 "mat2.sizes()[0] % 16 && mat2.sizes()[1] % 16)"
# torchao 0.18 float8/float8_linear.py: fprop torch.mm(input, weight.t()) -> _scaled_mm(x (M,K), W.T (K,N));
# dgrad torch.mm(grad_output, weight) -> (M,N) @ (N,K); wgrad (:197-200) torch.mm(grad_output.t(), input) ->
# (N,M) @ (M,K). SCALED_MM on those operands: mat1's columns and both of mat2's dims.
_AO_FLOAT8 = _rules({"fprop": (("K", 16), ("N", 16)), "dgrad": (("N", 16), ("K", 16)),
                     "wgrad": (("M", 16), ("K", 16))},
                    error="RuntimeError", message="_scaled_mm operands must be divisible by 16",
                    source=_SCALED_MM_SRC + "; operands from torchao float8/float8_linear.py:197-200 (wgrad "
                    "grad_output.t() @ input); torchao pads nothing unless pad_inner_dim (float8/config.py:231, "
                    "default False)")

# -- Transformer Engine v2.18 ----------------------------------------------------------------------------
_TE_DIMS_MSG = ("FP8 execution requires the product of all dimensions except the last to be divisible by 8 and "
                "the last dimension to be divisible by 16")
_TE_FP8 = (
    # linear.py:336 calls assert_dim_for_fp8_exec(inputmat, weight) (utils.py:613-623): for x (M, K) and W (N, K),
    # prod(shape[:-1]) % 8 and shape[-1] % 16. An AssertionError up to v2.14, a ValueError from v2.15.
    *_rules({"fprop": (("M", 8), ("K", 16), ("N", 8))}, error="ValueError", message=_TE_DIMS_MSG,
            source="transformer_engine/pytorch/utils.py:613-623 assert_dim_for_fp8_exec, from module/linear.py:336"),
    # cuBLASLt FP8 on Hopper is TN only: common/gemm/cublaslt_gemm.cu takes the transposed copy of each
    # operand (lda = k, :143), so its leading dim is the GEMM's reduction dim, and checks lda % 16 (:161) and
    # ldb % 16 (:252), "Caller must pad". dgrad general_gemm(weight, grad_output, layout="NN")
    # (linear.py:1024-1027) reduces over N; wgrad general_gemm(x, dy, layout="NT") (linear.py:1184-1220)
    # reduces over M. TE's autocast docstring says as much (pytorch/quantization.py:972-975: "both dimensions
    # divisible by 16 ... padding sequence length"). Blackwell runs non-TN FP8 and drops the M rule; we pad
    # everywhere (zero rows cost nothing when M % 16 == 0).
    *_rules({"fprop": (("K", 16),), "dgrad": (("N", 16),), "wgrad": (("M", 16),)}, error="RuntimeError",
            message="Leading dimension requirement on A for FP8 GEMM. Caller must pad.",
            source="transformer_engine/common/gemm/cublaslt_gemm.cu:161,252 (lda/ldb % 16); module/linear.py:1024-1027 "
                   "dgrad layout NN, :1184-1220 wgrad layout NT"),
)
_TE_MXFP8 = _rules({"fprop": (("M", 32), ("K", 32), ("N", 32)), "dgrad": (("M", 32), ("N", 32))},
                   error="RuntimeError", message="MXFP8 requires tensor dims that are divisible by 32",
                   source="transformer_engine/pytorch/csrc/quantizer.cpp:1492-1494 (MXFP8Quantizer: flat first and "
                          "last dims % 32, on x (M,K), W (N,K) and dy (M,N))")
_TE_NVFP4 = (
    *_rules({"fprop": (("M", 16), ("K", 16), ("N", 16))}, error="RuntimeError",
            message="First dim for NVFP4 must be divisible by 16",
            source="transformer_engine/pytorch/csrc/quantizer.cpp:1957-1961 (NVFP4Quantizer: flat dims % 16)"),
    # The wgrad operands (x and dy) are quantised with their transpose (columnwise usage), by a TMA kernel.
    *_rules({"wgrad": (("M", 32), ("K", 32), ("N", 32))}, error="RuntimeError",
            message="Number of tensor rows must be a multiple of 32",
            source="transformer_engine/common/cast/nvfp4/quantize_transpose_nvfp4.cuh:1403-1406 (rows % 32, "
                   "cols % 32: 16-byte TMA alignment)"),
)

# -- torchao 0.18.0 prototype kernels ----------------------------------------------------------------------
# prototype/moe_training/mxfp8_linear.py mx_mm: fprop casts x (M,K) and W (N,K) along dim 0; dgrad casts dy
# (M,N) along dim 0 and W along dim 1; wgrad casts dy and x along dim 1.
_AO_MXFP8 = (
    *_rules({"fprop": (("K", 32),), "dgrad": (("N", 32),)}, error="AssertionError",
            message="columns must be divisible by inner block size",
            source="torchao/prototype/mx_formats/kernels.py:873-875 (triton_to_mxfp8_dim0: cols % 32)"),
    *_rules({"dgrad": (("N", 32), ("K", 32)), "wgrad": (("M", 32), ("K", 32), ("N", 32))}, error="AssertionError",
            message="rows must be a multiple of 32",
            source="torchao/prototype/mx_formats/kernels.py:1052-1053 (mxfp8_quantize_cuda, the dim-1 cast: "
                   "rows % 32, cols % 32)"),
)
# nvfp4_mm_triton takes M = input_hp.shape[-2] (the sequence of a (B, T, K) input): Overdrive flattens the
# input to (M, K) before the call, so M is the token count here too.
_AO_NVFP4 = _rules({"fprop": (("M", 128), ("K", 128), ("N", 128))}, error="ValueError",
                   message="nvfp4_mm_triton requires M, K, N all divisible by 128",
                   source="torchao/prototype/moe_training/nvfp4_training/nvfp4_linear.py:94-98")

# -- Emulation (numerics only): no GEMM rule, tokens any. K and N follow the real engine's block so the
# emulated run converts the layers the real one would (MXFP8 32-blocks; NVFP4 16-blocks; FP8 cuBLAS 16).
_EMU_NOTE = "Overdrive emulation: mirrors the format's block so the same layers convert"


def _emulated(mult: int) -> tuple[Rule, ...]:
    return _rules({"fprop": (("K", mult), ("N", mult))}, error="ValueError", message="", source=_EMU_NOTE)


SHAPE_RULES: dict[str, EngineRules] = {r.name: r for r in (
    EngineRules(name="transformer_engine/fp8", rules=_TE_FP8),
    EngineRules(name="transformer_engine/mxfp8", rules=_TE_MXFP8),
    EngineRules(name="transformer_engine/nvfp4", rules=_TE_NVFP4),
    EngineRules(name="torchao/fp8", rules=_AO_FLOAT8),
    EngineRules(name="torchao/mxfp8", rules=_AO_MXFP8),
    EngineRules(name="torchao/nvfp4", rules=_AO_NVFP4),
    EngineRules(name="emulated/fp8", rules=_emulated(16)),
    EngineRules(name="emulated/mxfp8", rules=_emulated(32)),
    EngineRules(name="emulated/nvfp4", rules=_emulated(16)),
)}
