"""The one worker protocol: a candidate in its own process, driven step-batch by step-batch by the
parent so every candidate advances in interleaved rounds. Bench and tune are policies over it: each
gives a `Program` (what its tasks are, and any extra one-shot commands), nothing else.

Messages over a multiprocessing Pipe (tuples; every reply is a dict):
    ("setup", spec)       -> {"ok", "setup_s", **task.setup_reply()}    task = program.build(spec)
    ("run", n, *args)     -> {"ok", "steps": [task.step(*args), ... n], "wall_s", **task.run_reply()}
    ("finish",)           -> {"ok", **task.finish()}                     and the worker ends
    (command, spec)       -> {"ok", **program.commands[command](spec)}   and the worker ends
A failure is {"error", "kind": "user" | "oom" | "backend", "trace"} and ends the worker: "user" means
the user's own code (a model factory, batch or loss function) failed or returned the wrong thing;
"oom" CUDA's "out of memory" or the CPU allocator's "can't allocate memory"; "backend" the rest.
`LocalConn` speaks the same protocol inside the calling process (tests: no process start-up).

The worker-side `Task` base sets up what every task shares: torch's threads, the parent's machine
report, the one clock and the memory baseline, so a task's own peak is its own.
"""

from __future__ import annotations

import os
import resource
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

from overdrive.errors import UserError
from overdrive.measure.rounds import Clock

__all__ = ["Program", "Task", "worker_main", "handle", "LocalConn", "classify", "failure_reply", "UserCodeError",
           "user_call", "process_memory", "rss_mb"]


@dataclass(frozen=True)
class Program:
    """What a policy's workers run. Module-level functions only: it travels to each worker by pickle."""

    build: Callable[[dict], object]
    """spec -> the task (a `Task`, or anything with its four methods)."""
    commands: dict[str, Callable[[dict], dict]] = field(default_factory=dict)
    """Extra one-shot commands: name -> fn(spec) -> reply fields (tune's "fp8_filter")."""


class UserCodeError(Exception):
    """The user's factory/batch/loss raised: reported as theirs ("user"), not the recipe's."""


def user_call(what: str, fn, *args):
    """`fn(*args)`, with any exception it raises reported as the user's code's, in one line."""
    try:
        return fn(*args)
    except UserError:
        raise
    except Exception as e:
        msg = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
        raise UserCodeError(f"{what} raised {type(e).__name__}: {msg}") from None


def rss_mb() -> float:
    try:
        import psutil

        return psutil.Process().memory_info().rss / 2**20
    except Exception:
        return 0.0


def _peak_rss_mb() -> float:
    """This process image's peak RSS. /proc's VmHWM belongs to the current address space; getrusage's
    ru_maxrss does not: Linux carries the pre-exec high-water mark over exec, so a spawned worker would
    report its parent's RSS at fork (the bench's own ~400 MB, or a long test session's GBs) as its floor."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux, where /proc is missing


def process_memory(cuda: bool, rss0: float) -> dict:
    """This process's peak: CUDA max allocated, or peak RSS above the RSS at set-up."""
    if cuda:
        import torch

        return {"kind": "cuda_max_allocated", "peak_mb": torch.cuda.max_memory_allocated() / 2**20}
    return {"kind": "cpu_peak_rss", "peak_mb": _peak_rss_mb() - rss0, "rss_at_start_mb": rss0,
            "peak_rss_mb": _peak_rss_mb()}


class Task:
    """One candidate inside its worker: set up from `spec`, then `step(*args)` until told to finish.
    Subclasses add their own set-up and `step`; the reply hooks default to nothing extra."""

    def __init__(self, spec: dict) -> None:
        import torch

        from overdrive.env import build_report, set_env

        if spec.get("threads"):
            torch.set_num_threads(spec["threads"])
        env = build_report(spec["env_facts"])
        set_env(env)
        self.env = env
        self.device = env.device
        self.cuda = self.device == "cuda"
        self.clock = Clock(self.cuda)
        self.rss0 = rss_mb()
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()

    def step(self, *args) -> dict:
        raise NotImplementedError

    def setup_reply(self) -> dict:
        return {}

    def run_reply(self) -> dict:
        return {}

    def finish(self) -> dict:
        return {"memory": self.memory()}

    def memory(self) -> dict:
        return process_memory(self.cuda, self.rss0)


def classify(e: BaseException) -> str:
    """user | oom | backend."""
    if isinstance(e, (UserError, UserCodeError)):
        return "user"
    msg = str(e).lower()
    # CUDA says "out of memory"; the CPU allocator "can't allocate memory ... (Cannot allocate memory)".
    oom = ("out of memory", "can't allocate memory", "cannot allocate memory")
    return "oom" if (any(s in msg for s in oom) or isinstance(e, MemoryError)) else "backend"


def failure_reply(e: BaseException) -> dict:
    """The reply for a failure: one line (the user's own words for theirs), its kind, the trace's end."""
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    kind = classify(e)
    return {"error": (text if kind == "user" else f"{type(e).__name__}: {text}")[:300], "kind": kind,
            "trace": traceback.format_exc()[-1500:]}


class _State:
    def __init__(self, program: Program) -> None:
        self.program = program
        self.task = None


def _step(task, args: tuple) -> dict:
    """One step and the CPU time this process spent in it (`cpu_ms`, all its threads): the work done,
    which the host's other load does not stretch as it stretches the wall time (the warm-up rule,
    `measure.session.warmup_stop`, reads both)."""
    c0 = time.process_time()
    out = task.step(*args)
    if isinstance(out, dict):
        out.setdefault("cpu_ms", (time.process_time() - c0) * 1e3)
    return out


def handle(st: _State, msg: tuple) -> dict:
    """The reply to one message."""
    cmd = msg[0]
    try:
        if cmd == "setup":
            t0 = time.perf_counter()
            st.task = st.program.build(msg[1])
            return {"ok": True, "setup_s": time.perf_counter() - t0, **st.task.setup_reply()}
        if cmd == "run":
            t0 = time.perf_counter()
            steps = [_step(st.task, msg[2:]) for _ in range(msg[1])]
            return {"ok": True, "steps": steps, "wall_s": time.perf_counter() - t0, **st.task.run_reply()}
        if cmd == "finish":
            return {"ok": True, **(st.task.finish() if st.task is not None else {"memory": None})}
        if cmd in st.program.commands:
            return {"ok": True, **st.program.commands[cmd](msg[1])}
        raise ValueError(f"unknown worker command {cmd!r}")
    except BaseException as e:  # record and end: the parent goes on with the other candidates
        return failure_reply(e)


def _ends(st: _State, msg: tuple, reply: dict) -> bool:
    return msg[0] == "finish" or msg[0] in st.program.commands or "error" in reply


def worker_main(conn, program: Program, compile_threads: int = 1) -> None:
    """The worker process: serve `program` over `conn` until finish, a one-shot command or a failure."""
    # Inductor's compile workers: the cores the parent gives this worker (measure.threads), not 1
    # everywhere (that serialises Triton compiles on a GPU box). An explicit setting in the environment wins.
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", str(max(1, compile_threads)))
    st = _State(program)
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        reply = handle(st, msg)
        conn.send(reply)
        if _ends(st, msg, reply):
            return


class LocalConn:
    """The worker protocol run synchronously in this process (same replies, no isolation)."""

    def __init__(self, program: Program) -> None:
        self._st, self._reply = _State(program), None

    def send(self, msg: tuple) -> None:
        self._reply = handle(self._st, msg)

    def poll(self, timeout: float | None = None) -> bool:
        return self._reply is not None

    def recv(self) -> dict:
        r, self._reply = self._reply, None
        if r is None:
            raise EOFError
        return r
