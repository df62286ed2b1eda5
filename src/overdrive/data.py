"""Token data for benchmarks and training: a built-in deterministic stream, or a user's text file.

The built-in stream is a seeded Markov source over 48 symbols: 70% of next symbols follow the
previous one (4 successors with Zipf-like probabilities), 30% the previous two. A small model learns
the bigram part within a hundred steps (the loss falls from ln(256)≈5.5 below ln(48)≈3.9); the
trigram part takes more capacity, which is what a larger teacher brings to a distilled student.
Nothing is downloaded.
"""

from __future__ import annotations

import os

import numpy as np
import torch

__all__ = ["builtin_tokens", "file_tokens", "Batches", "VOCAB_SIZE", "DataError"]

VOCAB_SIZE = 256  # byte-level: the built-in stream and user text share one vocabulary


class DataError(ValueError):
    """A data file that cannot be used; the message says why and what to do."""


def builtin_tokens(n: int = 1 << 20, *, seed: int = 1234, alphabet: int = 48, fanout: int = 4,
                   order2: float = 0.3) -> np.ndarray:
    rng = np.random.default_rng(seed)
    symbols = rng.choice(np.arange(32, 32 + 96), size=alphabet, replace=False).astype(np.uint8)
    nxt1 = rng.integers(0, alphabet, size=(alphabet, fanout))             # bigram successors
    nxt2 = rng.integers(0, alphabet, size=(alphabet, alphabet, fanout))   # trigram successors
    probs = 1.0 / np.arange(1, fanout + 1) ** 1.5
    probs /= probs.sum()
    choice = rng.choice(fanout, size=n, p=probs)
    use2 = rng.random(n) < order2
    out = np.empty(n, dtype=np.int64)
    a, b = 0, 1
    for i in range(n):  # ~1 s per million tokens
        c = nxt2[a, b, choice[i]] if use2[i] else nxt1[b, choice[i]]
        out[i] = c
        a, b = b, c
    return symbols[out]


def file_tokens(path: str | os.PathLike) -> np.ndarray:
    """Bytes of a text file as tokens (vocabulary 256)."""
    p = os.fspath(path)
    if not os.path.exists(p):
        raise DataError(f"data file {p} does not exist: pass a readable text file to --data")
    if os.path.isdir(p):
        raise DataError(f"data path {p} is a directory: pass a text file to --data")
    data = np.fromfile(p, dtype=np.uint8)
    if data.size < 1024:
        raise DataError(f"data file {p} has {data.size} bytes: need at least 1024 (a few paragraphs of text)")
    return data


class Batches:
    """Deterministic (x, y) batches: batch i is the same for every configuration with the same seed."""

    def __init__(self, tokens: np.ndarray, *, batch: int, seq: int, seed: int = 0) -> None:
        if tokens.size < seq + 2:
            raise DataError(f"{tokens.size} tokens are fewer than one sequence of {seq + 1}: use more data or "
                            "a shorter sequence")
        self.tokens = torch.from_numpy(tokens.astype(np.int64))
        self.batch, self.seq, self.seed = batch, seq, seed

    def get(self, i: int, device: str | torch.device = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
        starts = torch.randint(0, self.tokens.numel() - self.seq - 1, (self.batch,), generator=g)
        idx = starts[:, None] + torch.arange(self.seq + 1)
        chunk = self.tokens[idx]  # (B, T+1)
        return chunk[:, :-1].to(device), chunk[:, 1:].to(device)
