"""Token data for benchmarks and training: one loader and one batcher.

Sources: a built-in deterministic stream, a user's text file (bytes as tokens), or a pre-tokenized
.bin of uint16/uint32 ids. Files are memory-mapped in their own dtype (uint8/16/32), never copied
to int64: a 50 MB text file costs each bench worker shared page cache, not 400 MB of private
memory. Only a batch is widened to int64, when it is cut.

The built-in stream is a seeded Markov source over 48 symbols: 70% of next symbols follow the
previous one (4 successors with Zipf-like probabilities), 30% the previous two. A small model learns
the bigram part within a hundred steps (the loss falls from ln(256)≈5.5 below ln(48)≈3.9); the
trigram part takes more capacity, which is what a larger teacher brings to a distilled student.
Nothing is downloaded.

Batches depend only on (seed, step, split): any world size sees the same global batch (each rank
its own slice), and a resumed run continues on exactly the data it would have seen.
"""

from __future__ import annotations

import os

import numpy as np
import torch

__all__ = ["builtin_tokens", "file_tokens", "load_tokens", "TokenData", "VOCAB_SIZE", "DataError"]

VOCAB_SIZE = 256  # byte-level: the built-in stream and user text share one vocabulary
# Without data.vocab_size a .bin's vocabulary is its largest id + 1. Real tokenizers stay below ~1M
# ids; one corrupt or mis-typed id of 4e9 would silently ask for a 4e9-row embedding table.
MAX_AUTO_VOCAB = 1 << 22


class DataError(ValueError):
    """A data file that cannot be used; the message says why and what to do."""


def builtin_tokens(n: int = 1 << 20, *, seed: int = 1234, alphabet: int = 48, fanout: int = 4,
                   order2: float = 0.3) -> np.ndarray:
    """n uint8 tokens of the built-in stream (deterministic for a seed)."""
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


def _check_file(p: str, what: str) -> None:
    if not os.path.exists(p):
        raise DataError(f"data file {p} does not exist: {what}")
    if os.path.isdir(p):
        raise DataError(f"data path {p} is a directory: {what}")
    if os.path.getsize(p) == 0:
        raise DataError(f"data file {p} is empty: it needs at least a few thousand tokens")


def file_tokens(path: str | os.PathLike) -> np.ndarray:
    """Bytes of a text file as tokens (vocabulary 256), memory-mapped read-only as uint8."""
    p = os.fspath(path)
    _check_file(p, "pass a readable text file to --data")
    data = np.memmap(p, dtype=np.uint8, mode="r")
    if data.size < 1024:
        raise DataError(f"data file {p} has {data.size} bytes: need at least 1024 (a few paragraphs of text)")
    return data


def load_tokens(source: str, *, fmt: str = "auto", vocab_size: int | None = None,
                builtin_n: int = 1 << 19) -> tuple[np.ndarray, int]:
    """(tokens, vocab_size) for "builtin", a text file, or a .bin of uint16/uint32 token ids."""
    if source != "builtin":
        _check_file(source, "set data.train to a text file, a .bin of token ids, or \"builtin\"")
    if fmt == "auto":
        fmt = "uint16" if source.endswith(".bin") else "text"
    if source == "builtin":
        toks, top, need = builtin_tokens(builtin_n), None, VOCAB_SIZE
    elif fmt == "text":
        toks, top = np.memmap(source, dtype=np.uint8, mode="r"), None
        need = VOCAB_SIZE
    else:
        dt = np.dtype(np.uint16 if fmt == "uint16" else np.uint32)
        size = os.path.getsize(source)
        if size % dt.itemsize:
            raise DataError(f"{source}: size {size} is not a multiple of {dt.itemsize} bytes: is it really {fmt}? "
                            "(set data.format)")
        toks = np.memmap(source, dtype=dt, mode="r")
        top = int(toks.max())
        need = top + 1
        if vocab_size is None and need > MAX_AUTO_VOCAB:
            big = np.flatnonzero(toks >= MAX_AUTO_VOCAB)
            where = ", ".join(str(int(i)) for i in big[:5]) + (f" and {big.size - 5} more" if big.size > 5 else "")
            raise DataError(f"{source}: {big.size} token id{'s' if big.size != 1 else ''} >= {MAX_AUTO_VOCAB:,} "
                            f"(largest {top:,}) at token position{'s' if big.size != 1 else ''} {where}: is it "
                            f"really {fmt}? Set data.format, or data.vocab_size if ids that large are meant")
    if vocab_size is not None and vocab_size < need:
        src = f"its largest token id is {top}" if top is not None else "its tokens are bytes (ids 0-255)"
        raise DataError(f"data.vocab_size = {vocab_size} is too small for {source}: {src}; set data.vocab_size "
                        f">= {need} or leave it unset")
    return toks, vocab_size or need


class TokenData:
    """Deterministic (x, y) batches from a token array, with an optional held-out tail for evaluation.

    The tokens stay in their own dtype (and memory map); `get` widens only the batch it cuts.
    """

    def __init__(self, tokens: np.ndarray, *, seq_len: int, val_fraction: float = 0.0, seed: int = 0) -> None:
        n_val = int(len(tokens) * val_fraction)
        if len(tokens) - n_val < 4 * (seq_len + 1) or (val_fraction > 0 and n_val < seq_len + 1):
            split = f" with a {val_fraction:.0%} validation split" if val_fraction else ""
            raise DataError(f"{len(tokens)} tokens are too few for sequences of {seq_len}{split}: use more data or "
                            "a shorter sequence")
        self.train, self.val = tokens[: len(tokens) - n_val], tokens[len(tokens) - n_val:]
        self.seq, self.seed = seq_len, seed

    def _src(self, split: str) -> np.ndarray:
        return self.train if split == "train" else self.val

    def global_starts(self, step: int, global_batch: int, split: str = "train") -> torch.Tensor:
        src = self._src(split)
        g = torch.Generator().manual_seed((self.seed + 1) * 1_000_003 + step * (1 if split == "train" else -7))
        return torch.randint(0, len(src) - self.seq - 1, (global_batch,), generator=g)

    def _take(self, src: np.ndarray, starts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        idx = starts.numpy()[:, None] + np.arange(self.seq + 1)
        chunk = torch.from_numpy(np.asarray(src[idx], dtype=np.int64))  # (B, T+1)
        return chunk[:, :-1], chunk[:, 1:]

    def get(self, step: int, batch: int, device: str | torch.device = "cpu",
            split: str = "train") -> tuple[torch.Tensor, torch.Tensor]:
        """Step `step`'s whole batch of `batch` sequences: x (B, T) and y = x shifted by one."""
        x, y = self._take(self._src(split), self.global_starts(step, batch, split))
        return x.to(device), y.to(device)

    def rank_micro_batches(self, step: int, global_batch: int, rank: int, world: int, micro: int,
                           split: str = "train") -> list[tuple[torch.Tensor, torch.Tensor]]:
        """This rank's slice of step `step`'s global batch, as micro-batches."""
        starts = self.global_starts(step, global_batch, split)
        per_rank = global_batch // world
        mine = starts[rank * per_rank:(rank + 1) * per_rank]
        src = self._src(split)
        return [self._take(src, mine[i:i + micro]) for i in range(0, per_rank, micro)]
