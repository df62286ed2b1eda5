"""A DLRM-style click model (Naumov et al. 2019): dense features → bottom MLP; each categorical
feature → an embedding table pooled over its bag; pairwise dot-product interaction of the 27
vectors; top MLP → click logit. The embedding lookups are the hot path, so they are pluggable:

  "embedding"     nn.Embedding gathers every row of every bag, then a per-bag sum (index_add_):
                  the naive baseline, which materialises (nnz, D) before reducing;
  "embeddingbag"  nn.EmbeddingBag(mode="sum") gathers and reduces in one fused kernel;
                  sparse=True gives sparse gradients (only the looked-up rows) for SparseAdam/Adagrad;
  "torchrec"      TorchRec's EmbeddingBagCollection over one KeyedJaggedTensor (when torchrec and
                  FBGEMM are installed for this torch; sharding it with DistributedModelParallel on
                  GPUs is what brings FBGEMM's fused table-batched kernels).

"embedding" and "embeddingbag" store their tables as `tables.{i}.weight`, so their state_dicts are
interchangeable; "torchrec" keeps TorchRec's own keys (`ebc.embedding_bags.t{i}.weight`).
"""

from __future__ import annotations

import torch
from torch import nn

from overdrive.recsys.data import ClickBatch, CriteoSpec

__all__ = ["DLRM", "DLRMServing", "EMBEDDING_IMPLS", "padded_ids"]

EMBEDDING_IMPLS = ("embedding", "embeddingbag", "torchrec")


def _mlp(sizes: list[int], last_act: bool) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(nn.Linear(a, b))
        if last_act or i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class DLRM(nn.Module):
    def __init__(self, spec: CriteoSpec = CriteoSpec(), *, dim: int = 16, bottom: tuple[int, ...] = (64, 32),
                 top: tuple[int, ...] = (64, 32), embedding: str = "embeddingbag", sparse: bool = False) -> None:
        super().__init__()
        if embedding not in EMBEDDING_IMPLS:
            raise ValueError(f"embedding={embedding!r}: use one of {', '.join(EMBEDDING_IMPLS)}")
        if embedding == "embedding" and sparse:
            raise ValueError("sparse gradients need embedding='embeddingbag' (or nn.Embedding(sparse=True) "
                             "with a per-bag reduction, which is the naive path)")
        self.spec, self.dim, self.impl = spec, dim, embedding
        self.bottom = _mlp([spec.n_dense, *bottom, dim], last_act=True)
        if embedding == "torchrec":
            import torchrec

            if sparse:
                raise ValueError("sparse=True is for nn.EmbeddingBag; TorchRec fuses its optimizer into the lookup "
                                 "when sharded")
            self.ebc = torchrec.EmbeddingBagCollection(tables=[torchrec.EmbeddingBagConfig(
                name=f"t{i}", embedding_dim=dim, num_embeddings=n, feature_names=[f"f{i}"])
                for i, n in enumerate(spec.table_sizes)], device=torch.device("cpu"))
            # A plain list (not registered): the parameters live under `ebc` only, once in the state_dict.
            self.tables = [self.ebc.embedding_bags[f"t{i}"] for i in range(spec.n_cat)]
        elif embedding == "embeddingbag":
            self.tables = nn.ModuleList(nn.EmbeddingBag(n, dim, mode="sum", sparse=sparse) for n in spec.table_sizes)
        else:
            self.tables = nn.ModuleList(nn.Embedding(n, dim) for n in spec.table_sizes)
        n_vec = spec.n_cat + 1
        self.n_pairs = n_vec * (n_vec - 1) // 2  # 27 vectors → 351 dot products
        self.top = _mlp([dim + self.n_pairs, *top, 1], last_act=False)
        for t in self.tables:  # small init: pooled sums of several rows stay O(1)
            nn.init.uniform_(t.weight, -1 / dim**0.5, 1 / dim**0.5)
        iu = torch.triu_indices(n_vec, n_vec, offset=1)
        self.register_buffer("_iu", iu, persistent=False)

    def pooled(self, b: ClickBatch) -> list[torch.Tensor]:
        """One (B, D) sum-pooled vector per categorical feature."""
        B = b.labels.numel()
        if self.impl == "torchrec":
            import torchrec

            keys = [f"f{i}" for i in range(self.spec.n_cat)]
            kjt = torchrec.KeyedJaggedTensor.from_lengths_sync(
                keys=keys, values=torch.cat(b.values), lengths=torch.cat([o[1:] - o[:-1] for o in b.offsets]))
            d = self.ebc(kjt).to_dict()
            return [d[k] for k in keys]
        out = []
        for t, v, o in zip(self.tables, b.values, b.offsets):
            if self.impl == "embeddingbag":
                out.append(t(v, o[:-1]))
            else:
                rows = t(v)                                               # (nnz, D): every row materialised
                bag = torch.repeat_interleave(torch.arange(B, device=v.device), o[1:] - o[:-1])
                out.append(torch.zeros(B, self.dim, device=v.device, dtype=rows.dtype).index_add_(0, bag, rows))
        return out

    def forward(self, b: ClickBatch) -> torch.Tensor:
        x = self.bottom(b.dense)                                          # (B, D)
        T = torch.stack([x, *[p.to(x.dtype) for p in self.pooled(b)]], 1)  # (B, 27, D)
        Z = torch.bmm(T, T.transpose(1, 2))                               # (B, 27, 27)
        inter = Z[:, self._iu[0], self._iu[1]]                            # (B, 351)
        return self.top(torch.cat([x, inter], 1)).squeeze(1)              # (B,) logits


class DLRMServing(nn.Module):
    """The click model with plain tensor inputs, as a server feeds it (and torch.export / ONNX want):

        dense (B, 13) float32 — log1p of the counts;  ids (B, 26, L) int64 — each feature's bag,
        padded with -1 to L ids.  Returns click probabilities (B,).

    It reads the same table weights as the training model (sum pooling over the real ids).
    """

    def __init__(self, model: DLRM) -> None:
        super().__init__()
        self.model = model

    def forward(self, dense: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        m = self.model
        x = m.bottom(dense)                                              # (B, D)
        mask = (ids >= 0).unsqueeze(-1).to(x.dtype)                      # (B, 26, L, 1)
        safe = ids.clamp(min=0)
        pooled = [(torch.nn.functional.embedding(safe[:, f], t.weight).to(x.dtype) * mask[:, f]).sum(1)
                  for f, t in enumerate(m.tables)]                       # 26 x (B, D)
        T = torch.stack([x, *pooled], 1)
        Z = torch.bmm(T, T.transpose(1, 2))
        inter = Z[:, m._iu[0], m._iu[1]]
        return torch.sigmoid(m.top(torch.cat([x, inter], 1)).squeeze(1))


def padded_ids(b: ClickBatch, bag: int) -> torch.Tensor:
    """(B, 26, bag) ids padded with -1 (bags longer than `bag` are truncated) from a ClickBatch."""
    B = b.labels.numel()
    out = torch.full((B, len(b.values), bag), -1, dtype=torch.int64)
    for f, (v, o) in enumerate(zip(b.values, b.offsets)):
        row = torch.repeat_interleave(torch.arange(B), o[1:] - o[:-1])
        pos = torch.arange(v.numel()) - torch.repeat_interleave(o[:-1], o[1:] - o[:-1])
        keep = pos < bag
        out[row[keep], f, pos[keep]] = v[keep]
    return out
