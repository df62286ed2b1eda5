"""Embedding-heavy click-through models: data (synthetic and Criteo TSV), a DLRM-style model with
pluggable embedding lookups, dense and sparse optimizers, AUC/log-loss."""

from overdrive.recsys.data import ClickBatch, CriteoSpec, TsvStats, read_criteo_tsv, synthetic_clicks
from overdrive.recsys.model import DLRM, EMBEDDING_IMPLS, DLRMServing, padded_ids
from overdrive.recsys.train import OPTIMIZERS, auc, build_optimizers, evaluate, train_step

__all__ = ["ClickBatch", "CriteoSpec", "TsvStats", "read_criteo_tsv", "synthetic_clicks", "DLRM", "DLRMServing", "padded_ids", "EMBEDDING_IMPLS",
           "OPTIMIZERS", "auc", "build_optimizers", "evaluate", "train_step"]
