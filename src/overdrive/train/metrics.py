"""metrics.jsonl (and TensorBoard when installed), written by rank 0; its path is checked at start."""

from __future__ import annotations

import json
import os

from overdrive.io import check_writable

__all__ = ["MetricsLog"]


class MetricsLog:
    def __init__(self, run_dir: str, rank: int, quiet: bool) -> None:
        self.rank, self.quiet = rank, quiet
        self.path = os.path.join(run_dir, "metrics.jsonl")
        self.tb = None
        if rank == 0:
            check_writable(self.path, flag="train.out_dir", kind="file")  # now, not at the first log line
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(os.path.join(run_dir, "tb"))
            except Exception:  # TensorBoard is optional
                self.tb = None

    def __call__(self, rec: dict) -> None:
        if self.rank != 0:
            return
        with open(self.path, "a") as f:
            f.write(json.dumps(rec) + "\n")
        if self.tb:
            for k, v in rec.items():
                if isinstance(v, (int, float)) and k != "step":
                    self.tb.add_scalar(k, v, rec["step"])
        if not self.quiet:
            print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in rec.items()),
                  flush=True)
