"""Click-log data shaped like Criteo's: 13 dense counts, 26 categorical features (some multi-hot),
Zipf-distributed ids, and a planted click function a model can learn. Plus a reader for the
Criteo TSV format (label, 13 integers, 26 hex ids) that counts malformed lines instead of crashing,
and refuses (naming the file and the lines) a count too large for float32, which would become inf.

Categorical features are kept as EmbeddingBag inputs: per feature a flat `values` tensor and
`offsets` (length B + 1) marking each example's bag.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import torch

from overdrive.data import DataError

__all__ = ["CriteoSpec", "ClickBatch", "synthetic_clicks", "read_criteo_tsv", "TsvStats"]


@dataclass(frozen=True, kw_only=True)
class CriteoSpec:
    n_dense: int = 13
    table_sizes: tuple[int, ...] = tuple([100_000, 50_000, 20_000, 10_000] + [5_000] * 6 + [1_000] * 16)
    """Rows per categorical table (26). Real Criteo tables range from a few to ~40M rows."""
    multi_hot: tuple[int, ...] = (5, 3, 3) + (1,) * 23
    """Largest bag per feature (1 = one-hot)."""
    zipf_a: float = 1.2

    @property
    def n_cat(self) -> int:
        return len(self.table_sizes)


@dataclass
class ClickBatch:
    dense: torch.Tensor          # (B, 13) float32
    values: list[torch.Tensor]   # per feature: (nnz,) int64 ids
    offsets: list[torch.Tensor]  # per feature: (B + 1,) int64
    labels: torch.Tensor         # (B,) float32 in {0, 1}

    def __len__(self) -> int:
        return self.labels.numel()

    def slice(self, i: int, j: int) -> "ClickBatch":
        vals, offs = [], []
        for v, o in zip(self.values, self.offsets):
            a, b = int(o[i]), int(o[j])
            vals.append(v[a:b])
            offs.append(o[i:j + 1] - a)
        return ClickBatch(self.dense[i:j], vals, offs, self.labels[i:j])

    def to(self, device) -> "ClickBatch":
        return ClickBatch(self.dense.to(device), [v.to(device) for v in self.values],
                          [o.to(device) for o in self.offsets], self.labels.to(device))


def synthetic_clicks(n: int, spec: CriteoSpec = CriteoSpec(), *, seed: int = 0) -> ClickBatch:
    """Deterministic click logs. The label is Bernoulli(sigmoid(logit)) with
    logit = dense · w + Σ_f effect_f[id] over four planted features − 1 (CTR about 0.5)."""
    rng = np.random.default_rng(seed)
    planted = np.random.default_rng(1234)  # the click function is the same for every seed
    dense = np.log1p(rng.lognormal(mean=1.0, sigma=1.2, size=(n, spec.n_dense))).astype(np.float32)
    w = planted.normal(0, 0.4, spec.n_dense).astype(np.float32)
    logit = (dense - dense.mean(0)) @ w - 1.0
    values, offsets = [], []
    for f, (rows, maxbag) in enumerate(zip(spec.table_sizes, spec.multi_hot)):
        perm = planted.permutation(rows)  # which ids are hot differs per table
        bag = rng.integers(1, maxbag + 1, size=n) if maxbag > 1 else np.ones(n, dtype=np.int64)
        nnz = int(bag.sum())
        ids = perm[(rng.zipf(spec.zipf_a, size=nnz) - 1) % rows]
        off = np.concatenate([[0], np.cumsum(bag)])
        if f < 4:  # planted: each id of these tables nudges the click probability
            effect = planted.normal(0, 1.0, rows).astype(np.float32)
            logit += np.add.reduceat(effect[ids], off[:-1]) / np.sqrt(bag)
        values.append(torch.from_numpy(ids.astype(np.int64)))
        offsets.append(torch.from_numpy(off.astype(np.int64)))
    p = 1 / (1 + np.exp(-logit))
    labels = (rng.random(n) < p).astype(np.float32)
    return ClickBatch(torch.from_numpy(dense), values, offsets, torch.from_numpy(labels))


# The dense counts become float32 before log1p: a count above float32's largest finite value (a
# 39-digit number) would be inf and poison every loss. Criteo's real counts stay below 1e7.
_F32_MAX = float(np.finfo(np.float32).max)


def _overflow_error(path: str, lines: list[int], n: int) -> DataError:
    shown = ", ".join(str(i) for i in lines) + (f" and {n - len(lines)} more" if n > len(lines) else "")
    return DataError(f"{path}: {n} line{'s' if n != 1 else ''} with a dense count too large for float32 (> "
                     f"{_F32_MAX:.3g}, it would become inf) on line{'s' if n != 1 else ''} {shown}: fix or remove "
                     "those lines (Criteo counts are small integers)")


@dataclass
class TsvStats:
    lines: int = 0
    good: int = 0
    malformed: Counter = field(default_factory=Counter)

    def summary(self) -> str:
        bad = sum(self.malformed.values())
        why = ", ".join(f"{k}: {v}" for k, v in self.malformed.most_common())
        return f"{self.lines} lines, {self.good} read, {bad} malformed" + (f" ({why})" if bad else "")


def read_criteo_tsv(path: str, spec: CriteoSpec = CriteoSpec(), *, max_lines: int | None = None
                    ) -> tuple[ClickBatch, TsvStats]:
    """Criteo display-ads format: label \\t I1..I13 (integers, may be empty) \\t C1..C26 (hex, may be empty).
    Ids are hashed into each table (id mod rows); an empty field is id 0 / count 0. A malformed line
    is counted by reason and skipped; a dense count beyond float32 (it would become inf) is a DataError
    naming the file and the lines, raised once the file is read."""
    st = TsvStats()
    overflow: list[int] = []  # first few line numbers (1-based) with an overflowing count
    n_overflow = 0
    labels, dense, cats = [], [], [[] for _ in range(spec.n_cat)]
    with open(path, "rb") as fh:
        for raw in fh:
            if max_lines is not None and st.lines >= max_lines:
                break
            st.lines += 1
            try:
                line = raw.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError:
                st.malformed["not UTF-8"] += 1
                continue
            parts = line.split("\t")
            if len(parts) != 1 + spec.n_dense + spec.n_cat:
                st.malformed[f"{len(parts)} fields, expected {1 + spec.n_dense + spec.n_cat}"] += 1
                continue
            if parts[0] not in ("0", "1"):
                st.malformed["label not 0/1"] += 1
                continue
            try:
                d = [max(0, int(x)) if x else 0 for x in parts[1:1 + spec.n_dense]]
            except ValueError:
                st.malformed["dense value not an integer"] += 1
                continue
            if any(v > _F32_MAX for v in d):
                n_overflow += 1
                if len(overflow) < 5:
                    overflow.append(st.lines)
                continue
            try:
                c = [int(x, 16) % rows if x else 0
                     for x, rows in zip(parts[1 + spec.n_dense:], spec.table_sizes)]
            except ValueError:
                st.malformed["categorical value not hex"] += 1
                continue
            labels.append(float(parts[0]))
            dense.append(d)
            for f, v in enumerate(c):
                cats[f].append(v)
            st.good += 1
    if n_overflow:
        raise _overflow_error(path, overflow, n_overflow)
    n = len(labels)
    dense_t = torch.log1p(torch.tensor(dense, dtype=torch.float32).reshape(n, spec.n_dense))
    values = [torch.tensor(c, dtype=torch.int64) for c in cats]
    offsets = [torch.arange(n + 1, dtype=torch.int64) for _ in cats]  # one id per feature per line
    return ClickBatch(dense_t, values, offsets, torch.tensor(labels, dtype=torch.float32)), st
