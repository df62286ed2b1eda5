"""Training data: token streams (built-in, text, or pre-tokenized .bin memmaps), a train/val split,
and batches that depend only on (seed, step) — so any world size sees the same global batch, each
rank its own slice, and a resumed run continues on exactly the data it would have seen."""

from __future__ import annotations

import os

import numpy as np
import torch

from overdrive.data import DataError, builtin_tokens
from overdrive.train.config import DataCfg

__all__ = ["TokenData", "load_tokens", "DataError"]


def load_tokens(cfg: DataCfg) -> tuple[np.ndarray, int]:
    """(tokens, vocab_size)."""
    if cfg.train == "builtin":
        return builtin_tokens(cfg.builtin_tokens), 256
    p = cfg.train
    if not os.path.exists(p):
        raise DataError(f"data file {p} does not exist: set data.train to a text file, a .bin of token ids, "
                        "or \"builtin\"")
    if os.path.getsize(p) == 0:
        raise DataError(f"data file {p} is empty: it needs at least a few thousand tokens")
    fmt = cfg.format
    if fmt == "auto":
        fmt = "uint16" if p.endswith(".bin") else "text"
    if fmt == "text":
        toks = np.fromfile(p, dtype=np.uint8)
        vocab = 256
    else:
        dt = np.uint16 if fmt == "uint16" else np.uint32
        if os.path.getsize(p) % np.dtype(dt).itemsize:
            raise DataError(f"{p}: size {os.path.getsize(p)} is not a multiple of {np.dtype(dt).itemsize} bytes: "
                            f"is it really {fmt}? (set data.format)")
        toks = np.memmap(p, dtype=dt, mode="r")
        vocab = cfg.vocab_size or int(toks.max()) + 1
    return toks, vocab


class TokenData:
    def __init__(self, tokens: np.ndarray, *, seq_len: int, val_fraction: float, seed: int) -> None:
        n_val = int(len(tokens) * val_fraction)
        if len(tokens) - n_val < 4 * (seq_len + 1) or n_val < seq_len + 1:
            raise DataError(f"{len(tokens)} tokens are too few for sequences of {seq_len} with a "
                            f"{val_fraction:.0%} validation split: use more data or a shorter train.seq_len")
        self.train, self.val = tokens[: len(tokens) - n_val], tokens[len(tokens) - n_val:]
        self.seq, self.seed = seq_len, seed

    def _take(self, src: np.ndarray, starts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        idx = starts.numpy()[:, None] + np.arange(self.seq + 1)
        chunk = torch.from_numpy(np.asarray(src[idx], dtype=np.int64))  # (B, T+1)
        return chunk[:, :-1], chunk[:, 1:]

    def global_starts(self, step: int, global_batch: int, split: str = "train") -> torch.Tensor:
        src = self.train if split == "train" else self.val
        g = torch.Generator().manual_seed((self.seed + 1) * 1_000_003 + step * (1 if split == "train" else -7))
        return torch.randint(0, len(src) - self.seq - 1, (global_batch,), generator=g)

    def rank_micro_batches(self, step: int, global_batch: int, rank: int, world: int, micro: int,
                           split: str = "train") -> list[tuple[torch.Tensor, torch.Tensor]]:
        """This rank's slice of step `step`'s global batch, as micro-batches."""
        starts = self.global_starts(step, global_batch, split)
        per_rank = global_batch // world
        mine = starts[rank * per_rank:(rank + 1) * per_rank]
        src = self.train if split == "train" else self.val
        return [self._take(src, mine[i:i + micro]) for i in range(0, per_rank, micro)]
