"""Collect raw facts about this machine: cheap ones in-process, risky ones in subprocesses.

The facts dict is the probe boundary: tests replace `collect_facts` (or `run_probe`) with a
fake machine, and `overdrive.env.machine.build_report` turns any facts dict into the report.
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

__all__ = ["collect_facts", "run_probe", "PROBE_TIMEOUTS"]

# Seconds per subprocess probe. torchao and TE also run their MXFP8/NVFP4 checks (and torchao's import
# alone took 27 s on a 2-core host at load 17). torch.compile's first (cold-cache) compile on a 2-core CPU
# takes ~25 s; later runs ~4 s. A hung CUDA init is the case the timeout exists for.
PROBE_TIMEOUTS = {"gpus": 60, "te": 150, "apex": 60, "torchao": 150, "liger": 90, "triton": 90,
                  "compile": 180, "torch_native": 60}

# Python package each engine probe needs; a missing package is reported without a subprocess.
_PACKAGE_OF = {"te": "transformer_engine", "apex": "apex", "torchao": "torchao",
               "liger": "liger_kernel", "triton": "triton", "onnx": "onnxruntime",
               "torchrec": "torchrec"}


def _load_factor() -> float:
    """How oversubscribed the CPUs are now (1-minute load average / cores), at least 1, at most 4.

    A probe's limit exists for a hung import or CUDA init; on a shared host at load 20 on 2 cores a
    healthy `import torch` + fused AdamW step took over 60 s, and a timeout there must not read as
    "fused AdamW is broken". So the limit stretches with the load, up to 4x.
    """
    try:
        load = os.getloadavg()[0]
    except OSError:
        return 1.0
    return min(4.0, max(1.0, load / max(1, os.cpu_count() or 1)))


def run_probe(name: str, timeout: float | None = None) -> dict:
    """Run one `_probes` gatherer in a child interpreter; never raises."""
    timeout = (timeout or PROBE_TIMEOUTS.get(name, 60)) * _load_factor()
    env = dict(os.environ, PYTHONWARNINGS="ignore", TF_CPP_MIN_LOG_LEVEL="3", OVERDRIVE_PROBE_PARENT=str(os.getpid()))
    cmd = [sys.executable, "-m", "overdrive.env._probes", name]
    try:
        cp = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"_timeout": timeout}
    except OSError as e:
        return {"_crash": f"could not start a Python subprocess: {e}"}
    lines = [ln for ln in cp.stdout.strip().splitlines() if ln.startswith("{")]
    if cp.returncode != 0 or not lines:
        tail = (cp.stderr or cp.stdout).strip().splitlines()[-1:] or [""]
        return {"_crash": f"probe exited with code {cp.returncode}: {tail[0][:300]}"}
    try:
        return json.loads(lines[-1])
    except json.JSONDecodeError:
        return {"_crash": "probe printed unreadable output"}


def _cpu_facts() -> dict:
    flags: set[str] = set()
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags") and not flags:
                    flags = set(line.split(":", 1)[1].split())
                elif line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
    except OSError:
        pass
    wanted = ["avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_tile", "amx_fp16"]
    try:
        import psutil

        ram = int(psutil.virtual_memory().total)
    except Exception:
        ram = None
    return {"model": model, "arch": platform.machine(), "count": os.cpu_count(),
            "flags": {k: (k in flags) for k in wanted}, "ram_bytes": ram, **_cpu_matmul_rates()}


def _best_rates(fns: dict, flops: float, *, rounds: int = 7, min_s: float = 2e-3, clock=None) -> dict:
    """GFLOP/s per name: the best of `rounds` warm samples, names interleaved in each round.

    A shared host only ever slows a sample down (load, preemption), so the fastest warm sample is
    the machine's rate; a median of single ~0.3 ms calls read 174, 4.2 and 2.1 GFLOP/s on three
    consecutive runs of one busy host. Each sample repeats the call until it lasts >= `min_s`, so
    the clock's resolution and one context switch cannot decide it; interleaving keeps the fp32 vs
    bf16 ratio fair when the load changes during the probe.
    """
    import time

    clock = clock or time.perf_counter
    reps = {}
    for name, fn in fns.items():  # warm-up: the first call picks the kernel; the second sizes the sample
        fn()
        t0 = clock()
        fn()
        reps[name] = max(1, min(64, int(min_s / max(clock() - t0, 1e-7))))
    best = {name: float("inf") for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            t0 = clock()
            for _ in range(reps[name]):
                fn()
            best[name] = min(best[name], (clock() - t0) / reps[name])
    return {name: round(flops / t / 1e9, 1) for name, t in best.items()}


def _cpu_matmul_rates(n: int = 256) -> dict:
    """Measured fp32 vs bf16 matmul GFLOP/s of one core of this CPU (~1 s; see `_best_rates`).

    /proc/cpuinfo flags are not enough: a VM can list AMX yet not enable it, and oneDNN only
    uses what it can. The measurement decides whether bf16 pays off on this CPU. One thread: on a
    shared 2-core host, a 2-thread GEMM waits for its second thread to be scheduled and read
    0.8-5 GFLOP/s where one thread read 61-81.
    """
    import torch

    rates: dict = {"isa": None, "matmul_gflops": {}}
    try:
        rates["isa"] = torch.backends.cpu.get_cpu_capability()
    except Exception:
        pass
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(n, n, generator=gen), torch.randn(n, n, generator=gen)
    fns = {}
    for name, dt in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        x, y = a.to(dt), b.to(dt)
        fns[name] = lambda x=x, y=y: x @ y
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        rates["matmul_gflops"] = _best_rates(fns, 2 * n**3)
    finally:
        torch.set_num_threads(threads)
    rates["matmul_threads"] = 1
    return rates


def _torch_facts() -> dict:
    import torch

    f: dict = {"version": torch.__version__, "cuda": torch.version.cuda,
               "hip": getattr(torch.version, "hip", None), "git": getattr(torch.version, "git_version", None)}
    f["build"] = "cuda" if torch.version.cuda else ("rocm" if f["hip"] else "cpu")
    try:
        f["cudnn"] = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    except Exception:
        f["cudnn"] = None
    try:
        v = torch.cuda.nccl.version() if torch.version.cuda else None
        f["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else v
    except Exception:
        f["nccl"] = None
    return f


def _run_quiet(cmd: list[str], timeout: float = 10) -> str | None:
    try:
        cp = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        return cp.stdout if cp.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired):
        return None


def _toolchain_facts() -> dict:
    f: dict = {}
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    nvcc = shutil.which("nvcc") or (cuda_home and shutil.which("nvcc", path=os.path.join(cuda_home, "bin")))
    if not nvcc and os.path.exists("/usr/local/cuda/bin/nvcc"):
        nvcc = "/usr/local/cuda/bin/nvcc"
    f["nvcc"] = nvcc or None
    out = _run_quiet([nvcc, "--version"]) if nvcc else None
    m = re.search(r"release (\d+\.\d+)", out or "")
    f["nvcc_version"] = m.group(1) if m else None
    roots = [os.environ.get("CUDNN_PATH"), os.environ.get("CUDNN_HOME"), cuda_home, "/usr/local/cuda", "/usr"]
    dirs = [os.path.join(r, "include") for r in roots if r] + ["/usr/include/x86_64-linux-gnu"]
    spec = importlib.util.find_spec("nvidia")
    for loc in (spec.submodule_search_locations or []) if spec else []:
        dirs.append(os.path.join(loc, "cudnn", "include"))
    hdr = next((os.path.join(d, "cudnn.h") for d in dirs if os.path.exists(os.path.join(d, "cudnn.h"))), None)
    f["cudnn_header"] = hdr
    f["c_compiler"] = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
    smi = shutil.which("nvidia-smi")
    drv = _run_quiet([smi, "--query-gpu=driver_version", "--format=csv,noheader"]) if smi else None
    f["driver"] = drv.strip().splitlines()[0] if drv and drv.strip() else None
    return f


def _installed(pkg: str) -> bool:
    try:
        return importlib.util.find_spec(pkg) is not None
    except (ImportError, ValueError):
        return False


def collect_facts(*, jobs: int = 4, on_probe: Callable[[str, str], None] | None = None) -> dict:
    """Everything `build_report` needs. Subprocess probes run concurrently.

    `on_probe(name, state)` hears each step as it starts ("running") and ends ("done", "timeout",
    "crashed"), from the probing threads: the doctor shows them instead of ~25 s of silence.
    """
    tell = on_probe or (lambda name, state: None)
    tell("platform", "running")  # the in-process facts import torch and time two matmuls
    facts: dict = {
        "os": {"system": platform.system(), "release": platform.release(),
               "platform": platform.platform(terse=True)},
        "python": {"version": platform.python_version(), "executable": sys.executable},
        "cpu": _cpu_facts(), "torch": _torch_facts(), "toolchain": _toolchain_facts(),
        "installed": {name: _installed(pkg) for name, pkg in _PACKAGE_OF.items()},
    }
    tell("platform", "done")
    names = ["gpus", "compile", "torch_native"] + [n for n in _PACKAGE_OF if facts["installed"][n]]

    def probe(name: str) -> dict:
        tell(name, "running")
        r = run_probe(name)
        tell(name, "timeout" if "_timeout" in r else "crashed" if "_crash" in r else "done")
        return r

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        results = dict(zip(names, pool.map(probe, names)))
    facts["probes"] = results
    return facts
