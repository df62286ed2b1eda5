"""One benchmark configuration in its own process. The parent (runner.py) drives it step-batch by
step-batch so all configurations advance in interleaved rounds; this process reports its own peak
memory. The task it runs comes from the workload registry (`overdrive.bench.workloads`).

Protocol over a multiprocessing Pipe: ("setup", spec) -> ("run", n) ... -> ("finish",).
Every reply is a dict; a failure is {"error": ..., "kind": "oom" | "backend"} and ends the worker.
`LocalConn` speaks the same protocol inside the calling process (tests: no process start-up).
"""

from __future__ import annotations

import os
import random
import time
import traceback

__all__ = ["worker_main", "LocalConn", "handle"]


class _State:
    def __init__(self) -> None:
        self.task = None
        self.spec: dict = {}
        self.steps = 0
        self.quality: dict | None = None
        self.rng = random.Random(0)


def _setup(st: _State, spec: dict) -> dict:
    from overdrive.bench.workloads import workload_for_task

    t0 = time.perf_counter()
    st.spec = spec
    # The injected noise (tests) differs per configuration, the A/A twin included: a twin with the
    # baseline's very noise would measure no noise at all.
    st.rng = random.Random(f"{spec.get('seed', 0)}:{spec.get('name', '')}")
    st.task = workload_for_task(spec.get("task", "gpt")).build(spec)
    return {"ok": True, "setup_s": time.perf_counter() - t0, "applied": getattr(st.task, "applied", None)}


def _step(st: _State) -> dict:
    inj = st.spec.get("inject") or {}
    if inj.get("fail_at_step") is not None and st.steps >= inj["fail_at_step"]:
        raise RuntimeError("injected backend failure (test)")
    out = st.task.step()
    if inj.get("slow") or inj.get("noise_ms"):
        # Simulated host load (tests): every step time scaled, plus random extra milliseconds. Only
        # the reported times change, never the training, so quality must not move with it.
        for k in [k for k in out if k.endswith("_ms")]:
            out[k] = out[k] * inj.get("slow", 1.0) + st.rng.expovariate(1.0) * inj.get("noise_ms", 0.0)
    st.steps += 1
    if st.steps == st.spec.get("parity_steps"):
        st.quality = st.task.quality()  # judged at the same step for every configuration
    return out


def handle(st: _State, msg: tuple) -> dict | None:
    """The reply to one message; None after "finish" (the worker ends)."""
    cmd = msg[0]
    try:
        if cmd == "setup":
            return _setup(st, msg[1])
        if cmd == "run":
            t0 = time.perf_counter()
            out = [_step(st) for _ in range(msg[1])]
            return {"ok": True, "steps": out, "wall_s": time.perf_counter() - t0}
        if cmd == "finish":
            return {"ok": True, "memory": st.task.memory() if st.task else None, "final": st.quality}
        raise ValueError(f"unknown worker command {cmd!r}")
    except BaseException as e:  # record and end: the parent goes on with the other configurations
        return {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300],
                "kind": _classify(e), "trace": traceback.format_exc()[-1500:]}


def _classify(e: BaseException) -> str:
    msg = str(e).lower()
    # CUDA says "out of memory"; the CPU allocator "can't allocate memory ... (Cannot allocate memory)".
    oom = ("out of memory", "can't allocate memory", "cannot allocate memory")
    return "oom" if (any(s in msg for s in oom) or isinstance(e, MemoryError)) else "backend"


def worker_main(conn, compile_threads: int = 1) -> None:
    # Inductor's compile workers: as many as the cores this worker may use (the parent shares the
    # machine's cores among the workers), not 1 everywhere (that serialises Triton compiles on a GPU box).
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", str(max(1, compile_threads)))
    st = _State()
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        reply = handle(st, msg)
        conn.send(reply)
        if msg[0] == "finish" or "error" in reply:
            return


class LocalConn:
    """The worker protocol run synchronously in this process (same replies, no isolation)."""

    def __init__(self) -> None:
        self._st, self._reply = _State(), None

    def send(self, msg: tuple) -> None:
        self._reply = handle(self._st, msg)

    def poll(self, timeout: float | None = None) -> bool:
        return self._reply is not None

    def recv(self) -> dict:
        r, self._reply = self._reply, None
        if r is None:
            raise EOFError
        return r
