"""How tune starts its worker processes: forked from a server that has only imported torch and
Overdrive, and without re-running the caller's script."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import sys

from overdrive.tune.workload import Workload

__all__ = ["main_not_rerun", "worker_context"]


@contextlib.contextmanager
def main_not_rerun(wl: Workload):
    """A new process re-runs the caller's script to rebuild `__main__` (multiprocessing's rule), so a
    script calling tune() without an `if __name__ == "__main__":` guard would start tune again in
    every worker. The workers need `__main__` only when a function of the workload lives there;
    otherwise the script's path is hidden while the worker starts, as for an interactive session."""
    main = sys.modules.get("__main__")
    fns = (wl.model_fn, wl.batch_fn, wl.loss_fn)
    if main is None or any(getattr(f, "__module__", None) == "__main__" for f in fns) \
            or "__file__" not in vars(main):
        yield
        return
    path = main.__dict__.pop("__file__")
    try:
        yield
    finally:
        main.__file__ = path


def worker_context():
    """Workers fork from a fork server that has only imported torch and Overdrive (no tensor op,
    no thread pool, no compile cache yet): each candidate starts as clean as a fresh interpreter,
    without paying torch's import (11 s measured on a loaded 2-core host) once per candidate."""
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    # torchao (FP8, emulated on CPU) is imported too where installed; a missing one is skipped.
    ctx.set_forkserver_preload(["torch", "overdrive.accelerate", "overdrive.tune.worker", "torchao.float8"])
    return ctx
