"""metrics.jsonl (and TensorBoard when installed), written by rank 0; its path is checked at start.
With `report_to` (train --report-to mlflow,wandb,tensorboard) the same records go to those trackers
(overdrive.track), with the recipe and the machine as the run's params."""

from __future__ import annotations

import importlib.util
import json
import os
import sys

from overdrive.io import check_writable, refuse_links

__all__ = ["MetricsLog"]


class MetricsLog:
    def __init__(self, run_dir: str, rank: int, quiet: bool, report_to=None) -> None:
        from overdrive.track import Trackers, parse_report_to

        self.rank, self.quiet, self.run_dir = rank, quiet, run_dir
        self.path = os.path.join(run_dir, "metrics.jsonl")
        self.names = parse_report_to(report_to) if rank == 0 else []
        self.trackers = Trackers([])
        if rank == 0:
            refuse_links(run_dir, ["metrics.jsonl"], flag="train.out_dir")  # appending would write through it
            check_writable(self.path, flag="train.out_dir", kind="file")  # now, not at the first log line

    def start(self, params: dict, run_name: str) -> list[str]:
        """Open the trackers (rank 0) once the recipe is resolved; returns where each writes."""
        from overdrive.track import Trackers, _TensorBoard, open_trackers

        if self.rank != 0:
            return []
        self.trackers = open_trackers(self.names, out_dir=self.run_dir, run_name=run_name, params=params)
        if "tensorboard" not in self.names and importlib.util.find_spec("tensorboard") is not None:
            try:  # TensorBoard as before, when installed and not asked for: optional, never fatal
                self.trackers = Trackers(self.trackers.trackers + [_TensorBoard(self.run_dir, run_name, params)])
            except Exception:
                pass
        return [w for w, t in zip(self.trackers.where, self.trackers.trackers)
                if type(t).__name__ != "_TensorBoard" or "tensorboard" in self.names]

    def __call__(self, rec: dict) -> None:
        if self.rank != 0:
            return
        # O_NOFOLLOW: a metrics.jsonl swapped for a link mid-run is never appended through
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o666)
        with os.fdopen(fd, "a") as f:
            f.write(json.dumps(rec) + "\n")
        if self.trackers:
            self.trackers.log({k: v for k, v in rec.items() if k != "step"}, rec["step"])
        if not self.quiet:
            print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in rec.items()),
                  flush=True)

    def close(self) -> None:
        """Finish the trackers' runs: FAILED while an exception is on its way out, else FINISHED."""
        self.trackers.close(ok=sys.exc_info()[0] is None)
