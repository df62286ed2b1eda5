"""`overdrive doctor` — argument parsing and printing only; the probing is in overdrive.env."""

from __future__ import annotations

import argparse
import json
import threading
import time

__all__ = ["register", "ProbeProgress"]

# What each probe step checks, in the words the tables use.
PROBE_LABELS = {
    "platform": "platform: CPU, matmul rates, torch, toolchain",
    "gpus": "GPUs (CUDA init)",
    "compile": "torch.compile (inductor)",
    "torch_native": "fused AdamW, SDPA backends",
    "te": "Transformer Engine",
    "apex": "Apex",
    "torchao": "torchao float8",
    "liger": "Liger-Kernel",
    "triton": "Triton",
    "onnx": "ONNX Runtime",
    "torchrec": "TorchRec + FBGEMM",
}


class ProbeProgress:
    """Shows each probe as it runs, on stderr (stdout stays the report, `--json` stays parseable).

    On a terminal: a live line per probe with a spinner, gone when the report prints. Piped: one
    line when a probe starts and one when it ends, with its time.
    """

    def __init__(self, console=None):
        from rich.console import Console

        self.console = console or Console(stderr=True)
        self._lock = threading.Lock()
        self._t0: dict[str, float] = {}
        self._tasks: dict[str, int] = {}
        self._progress = None
        if self.console.is_terminal:
            from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

            self._progress = Progress(SpinnerColumn(), TextColumn("{task.description}", markup=False),
                                      TimeElapsedColumn(),
                                      console=self.console, transient=True)

    def __enter__(self) -> ProbeProgress:
        if self._progress:
            self._progress.start()
        else:
            self.console.print("overdrive doctor: probing (each engine in its own process, 5-30 s)")
        return self

    def __exit__(self, *exc) -> None:
        if self._progress:
            self._progress.stop()

    def __call__(self, name: str, state: str) -> None:
        label = PROBE_LABELS.get(name, name)
        with self._lock:
            if state == "running":
                self._t0[name] = time.perf_counter()
                if self._progress:
                    self._tasks[name] = self._progress.add_task(f"probing {label}", total=None)
                else:
                    self.console.print(f"  probing {label} ...", markup=False)
                return
            took = time.perf_counter() - self._t0.get(name, time.perf_counter())
            if self._progress:
                if name in self._tasks:
                    self._progress.update(self._tasks[name], description=f"{label}: {state}", total=1,
                                          completed=1)
            else:
                self.console.print(f"  {label}: {state} ({took:.1f} s)", markup=False)


def _cmd_doctor(args: argparse.Namespace) -> int:
    from overdrive.env import get_env

    with ProbeProgress() as progress:
        rep = get_env(refresh=True, on_probe=progress)  # the doctor always looks afresh (and refreshes the cache)
    if args.json:
        print(json.dumps(rep.to_dict(), indent=2))
    else:
        from overdrive.report.doctor import render_doctor

        render_doctor(rep)
    return 0


def register(sub) -> None:
    d = sub.add_parser("doctor", help="what this machine is and which engines really work here",
                       description="Probe the platform, GPUs and optional engines (Transformer Engine, Apex, "
                                   "torchao, Liger, Triton, torch.compile, fused AdamW, SDPA), each in its own "
                                   "process with a timeout, showing each probe on stderr as it runs. Exit code 0 "
                                   "even when engines are missing.")
    d.add_argument("--json", action="store_true", help="print the report as JSON (schema overdrive.env/1)")
    d.set_defaults(func=_cmd_doctor)
