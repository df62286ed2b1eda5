"""Refuse, before the first step, a batch that cannot fit: the kernel's OOM killer gives no message.

A lower bound, so that it never refuses a run that would fit: fp32 eager activations of the
reference GPT kept for backward, per token, about 16·d per layer (norm inputs, q/k/v, attention and
projection outputs, the 4·d MLP hidden before and after GELU) plus 3·V for the logits, their
log-softmax and its gradient; plus 16 bytes per parameter (weights, gradients, AdamW's two moments).
"""

from __future__ import annotations

__all__ = ["estimate_bytes", "free_bytes", "check_fits"]


def estimate_bytes(*, n_params: int, n_layer: int, n_embd: int, vocab: int, micro_batch: int, seq_len: int,
                   shards: int = 1) -> tuple[float, float]:
    """(activation bytes of one micro-batch, parameter + gradient + optimizer bytes on one rank)."""
    act = 4.0 * micro_batch * seq_len * (16 * n_layer * n_embd + 3 * vocab)
    return act, 16.0 * n_params / shards


def free_bytes(device: str) -> float | None:
    """Memory this process could still get: free device memory on GPU, available RAM on CPU."""
    try:
        if device == "cuda":
            import torch

            return float(torch.cuda.mem_get_info()[0])
        import psutil

        return float(psutil.virtual_memory().available)
    except Exception:  # no probe, no refusal: the estimate is a guard, not a gate
        return None


def check_fits(*, act: float, state: float, free: float | None, micro_batch: int, seq_len: int) -> None:
    if free is None or act + state <= free:
        return
    gib = 2.0 ** 30
    raise ValueError(f"train.micro_batch={micro_batch} x seq_len={seq_len} needs at least {(act + state) / gib:.1f} "
                     f"GiB (activations {act / gib:.1f}, weights+gradients+AdamW {state / gib:.1f}) but "
                     f"{free / gib:.1f} GiB is free here: lower train.micro_batch (train.global_batch is reached by "
                     "gradient accumulation)")
