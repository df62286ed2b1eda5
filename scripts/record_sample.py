"""Run a bench command and record what a README sample must carry beside its results.json: the
machine (CPU model and kind: AVX2 only, AVX-512 bf16 or AMX), the host's load while it ran, the wall
time and the date. Writes OUT/sample.json; the bench itself writes OUT/results.json.

    python scripts/record_sample.py benchmarks/results/cpu/2026-12-01-xeon-amx -- overdrive bench
    (the bench's own --out is appended: OUT)

tests/unit/test_readme_figures.py checks that the README's sample and its caption quote these files.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shlex
import subprocess
import sys
import threading
import time


def cpu_kind(flags: set[str]) -> str:
    """The three kinds of CPU the bench meets, by what runs bf16 matmuls."""
    if "amx_bf16" in flags:
        return "AMX"
    if "avx512_bf16" in flags:
        return "AVX-512 bf16"
    return "AVX2 only"


def _cpu() -> tuple[str, set[str]]:
    model, flags = "unknown", set()
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name") and model == "unknown":
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
    return model, flags


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: record_sample.py OUT -- overdrive bench [ARGS]", file=sys.stderr)
        return 2
    out, cmd = argv[0], argv[2:]
    os.makedirs(out, exist_ok=True)
    loads: list[float] = []
    done = threading.Event()

    def sample() -> None:  # the 1-minute load average every 10 s while the bench runs
        while not done.is_set():
            loads.append(os.getloadavg()[0])
            done.wait(10)

    model, flags = _cpu()
    started = dt.datetime.now(dt.timezone.utc)
    threading.Thread(target=sample, daemon=True).start()
    t0 = time.monotonic()
    real = [sys.executable, "-m", "overdrive", *cmd[1:]] if cmd[0] == "overdrive" else cmd
    rc = subprocess.call([*real, "--out", out])
    wall = time.monotonic() - t0
    done.set()
    rec = {"command": shlex.join([*cmd, "--out", out]), "exit_code": rc, "wall_s": round(wall, 1),
           "started": started.isoformat(timespec="seconds"), "cpu_model": model, "cpu_kind": cpu_kind(flags),
           "cores": os.cpu_count(), "load_1min": {"min": min(loads), "max": max(loads),
                                                  "mean": round(sum(loads) / len(loads), 1), "samples": len(loads)}}
    tmp = os.path.join(out, "sample.json.tmp")
    with open(tmp, "w") as f:
        json.dump(rec, f, indent=1)
    os.replace(tmp, os.path.join(out, "sample.json"))
    print(json.dumps(rec))
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
