"""FLOPs per token and MFU, as nanoGPT and torchtitan count them.

Training FLOPs per token = 6·N + 12·L·H·Q·T
  6·N: forward (2 FLOPs per multiply-add per parameter) plus backward (twice the forward), with N
       the non-embedding parameters that take part in matmuls (the tied head counts; the
       position table does not) — Kaplan et al. 2020, PaLM appendix B, nanoGPT estimate_mfu;
  12·L·H·Q·T: attention scores and values, QK^T and AV, each 2·T·Q per head per token forward,
       times 3 for forward + backward, over L layers and H heads (Q head dim, T sequence).
Causal masking would halve the attention term, but the convention (and torchtitan) keeps it.
"""

from __future__ import annotations

__all__ = ["flops_per_token", "achieved_tflops", "mfu"]


def flops_per_token(n_params: int, n_layer: int, n_head: int, head_dim: int, seq_len: int) -> int:
    return 6 * n_params + 12 * n_layer * n_head * head_dim * seq_len


def achieved_tflops(tokens_per_s: float, flops_tok: int) -> float:
    return tokens_per_s * flops_tok / 1e12


def mfu(tokens_per_s: float, flops_tok: int, peak_tflops: float | None) -> float | None:
    """Model FLOPs utilisation in [0, 1]: achieved over the device's dense peak."""
    if not peak_tflops:
        return None
    return achieved_tflops(tokens_per_s, flops_tok) / peak_tflops
