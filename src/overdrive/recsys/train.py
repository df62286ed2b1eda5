"""Training and evaluation for the click model: dense AdamW, or sparse optimizers for the tables.

  "dense-adamw"     AdamW on every parameter; the tables get dense gradients (every row touched).
  "sparse-adam"     torch.optim.SparseAdam on the tables (sparse gradients: only looked-up rows
                    change) + AdamW on the MLPs.
  "sparse-adagrad"  torch.optim.Adagrad on the tables (sparse gradients; element-wise, where
                    FBGEMM's is row-wise) + AdamW on the MLPs.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from overdrive.recsys.data import ClickBatch
from overdrive.recsys.model import DLRM
from overdrive.train.step import TrainStep

__all__ = ["OPTIMIZERS", "build_optimizers", "train_step", "evaluate", "auc"]

OPTIMIZERS = ("dense-adamw", "sparse-adam", "sparse-adagrad")


def build_optimizers(model: DLRM, kind: str, *, lr: float = 1e-3, table_lr: float = 0.05
                     ) -> list[torch.optim.Optimizer]:
    if kind not in OPTIMIZERS:
        raise ValueError(f"optimizer {kind!r}: use one of {', '.join(OPTIMIZERS)}")
    if kind == "dense-adamw":
        return [torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)]
    if not all(getattr(t, "sparse", False) for t in model.tables):
        raise ValueError(f"{kind} needs sparse gradients: build DLRM(embedding='embeddingbag', sparse=True)")
    tables = [p for t in model.tables for p in t.parameters()]
    ids = {id(p) for p in tables}
    mlps = [p for p in model.parameters() if id(p) not in ids]
    sparse = torch.optim.SparseAdam(tables, lr=lr) if kind == "sparse-adam" else \
        torch.optim.Adagrad(tables, lr=table_lr)
    return [sparse, torch.optim.AdamW(mlps, lr=lr, weight_decay=0.0)]


def train_step(model: DLRM, opts: list[torch.optim.Optimizer], b: ClickBatch, *, amp_dtype=None) -> float:
    """One step; `amp_dtype` runs the MLPs and the interaction under autocast (tables stay fp32)."""
    ctx = torch.autocast(b.dense.device.type, dtype=amp_dtype) if amp_dtype else \
        torch.autocast(b.dense.device.type, enabled=False)
    with ctx:
        logits = model(b)
    loss = F.binary_cross_entropy_with_logits(logits.float(), b.labels)
    stepper = TrainStep(model, opts)  # the one training step: backward, every optimizer, zero_grad
    stepper.backward(loss)
    stepper.step()
    return float(loss.detach())


def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Area under the ROC curve via the rank-sum (Mann-Whitney U) statistic, ties averaged."""
    scores, labels = np.asarray(scores, dtype=np.float64), np.asarray(labels)
    pos, neg = labels == 1, labels == 0
    n_pos, n_neg = int(pos.sum()), int(neg.sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores))
    s = scores[order]
    i = 0
    while i < len(s):  # average ranks over ties
        j = i
        while j + 1 < len(s) and s[j + 1] == s[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


@torch.no_grad()
def evaluate(model: DLRM, b: ClickBatch, *, batch: int = 4096) -> dict:
    model.eval()
    logits = torch.cat([model(b.slice(i, min(i + batch, len(b)))).float() for i in range(0, len(b), batch)])
    model.train()
    ll = float(F.binary_cross_entropy_with_logits(logits, b.labels))
    p = b.labels.mean().clamp(1e-6, 1 - 1e-6)
    base = float(-(p * torch.log(p) + (1 - p) * torch.log(1 - p)))  # predicting the mean CTR
    return {"logloss": ll, "auc": auc(torch.sigmoid(logits).cpu().numpy(), b.labels.cpu().numpy()),
            "logloss_constant": base, "n": len(b), "finite": math.isfinite(ll)}
