"""One benchmark configuration in its own process: a teacher and a distilled student, trained
side by side under one recipe. The parent (runner.py) drives it step-batch by step-batch so all
configurations advance in interleaved rounds; this process reports its own peak memory.

Protocol over a multiprocessing Pipe: ("setup", spec) → ("run", n) ... → ("finish",).
Every reply is a dict; a failure is {"error": ..., "kind": "oom" | "backend"} and ends the worker.
"""

from __future__ import annotations

import os
import resource
import time
import traceback

from overdrive.losses import distill_loss

__all__ = ["worker_main", "mark", "elapsed_ms", "process_memory"]


def _rss_mb() -> float:
    try:
        import psutil

        return psutil.Process().memory_info().rss / 2**20
    except Exception:
        return 0.0


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


class _Pair:
    def __init__(self, spec: dict) -> None:
        import torch

        from overdrive.accelerate import Accelerated
        from overdrive.data import TokenData, builtin_tokens, file_tokens
        from overdrive.env import build_report, set_env
        from overdrive.models import GPT, gpt_config
        from overdrive.recipes import ResolvedRecipe

        torch.set_num_threads(spec.get("threads") or torch.get_num_threads())
        env = build_report(spec["env_facts"])
        set_env(env)
        self.device = env.device
        self.cuda = self.device == "cuda"
        self.rss0 = _rss_mb()
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
        tokens = file_tokens(spec["data"]) if spec.get("data") else builtin_tokens(spec["data_tokens"])
        self.batches = TokenData(tokens, seq_len=spec["seq"], seed=spec["seed"])
        self.batch = spec["batch"]
        resolved = ResolvedRecipe.from_dict(spec["resolved"])
        self.lr = spec["lr"] * spec.get("lr_scale", 1.0)  # lr_scale: tests inject a diverging recipe
        self.accs = {}
        for role in ("teacher", "student"):
            torch.manual_seed(spec["seed"] + (0 if role == "teacher" else 1))
            model = GPT(gpt_config(spec[role], block_size=spec["seq"]))
            self.accs[role] = Accelerated(model, resolved, lr=self.lr, weight_decay=0.1, betas=(0.9, 0.95),
                                          grad_clip=1.0, module_filter_fn=None, build_optimizer=True)
        if spec.get("alloc_mb"):  # tests: a transient allocation only this process's peak may show
            blob = torch.ones(spec["alloc_mb"] * 2**18, device=self.device)  # 4-byte floats
            del blob
        self.fail_at = spec.get("fail_at_step")  # tests inject a backend failure
        self.step_i = 0

    def _timer(self):
        return mark(self.cuda)

    def _elapsed_ms(self, a, b) -> float:
        return elapsed_ms(self.cuda, a, b)

    def step(self) -> dict:
        import torch

        if self.fail_at is not None and self.step_i >= self.fail_at:
            raise RuntimeError("injected backend failure (test)")
        x, y = self.batches.get(self.step_i, self.batch, self.device)
        t, s = self.accs["teacher"], self.accs["student"]
        e0 = self._timer()
        with t.autocast():
            t_logits, t_loss = t.model(x, y)
        t.backward(t_loss)
        t.step()
        e1 = self._timer()
        with s.autocast():
            s_logits, _ = s.model(x)
            loss = distill_loss(s_logits, t_logits.detach(), y)
        s.backward(loss)
        s.step()
        e2 = self._timer()
        if self.cuda:
            torch.cuda.synchronize()  # read the events; one sync per step, after all its work
        self.step_i += 1
        return {"teacher_ms": self._elapsed_ms(e0, e1), "student_ms": self._elapsed_ms(e1, e2),
                "teacher_loss": t_loss.item(), "student_loss": loss.item()}

    def memory(self) -> dict:
        return process_memory(self.cuda, self.rss0)


def mark(cuda: bool):
    """A point in time: a recorded CUDA event on GPU (no sync), the monotonic clock elsewhere."""
    import torch

    if cuda:
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev
    return time.perf_counter()


def elapsed_ms(cuda: bool, a, b) -> float:
    return a.elapsed_time(b) if cuda else (b - a) * 1e3


def process_memory(cuda: bool, rss0: float) -> dict:
    """This process's peak: CUDA max allocated, or peak RSS above the RSS at set-up."""
    import torch

    if cuda:
        return {"kind": "cuda_max_allocated", "peak_mb": torch.cuda.max_memory_allocated() / 2**20}
    return {"kind": "cpu_peak_rss", "peak_mb": _peak_rss_mb() - rss0, "rss_at_start_mb": rss0,
            "peak_rss_mb": _peak_rss_mb()}


def _make_task(spec: dict):
    """The workload this worker runs: the GPT teacher/student pair, or another task by name."""
    if spec.get("task", "gpt") == "gpt":
        return _Pair(spec)
    if spec["task"] == "recsys":
        from overdrive.recsys.bench import RecsysTask

        return RecsysTask(spec)
    raise ValueError(f"unknown bench task {spec['task']!r}")


def _classify(e: BaseException) -> str:
    msg = str(e).lower()
    # CUDA says "out of memory"; the CPU allocator "can't allocate memory ... (Cannot allocate memory)".
    oom = ("out of memory", "can't allocate memory", "cannot allocate memory")
    return "oom" if (any(s in msg for s in oom) or isinstance(e, MemoryError)) else "backend"


def worker_main(conn) -> None:
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    pair = None
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        cmd = msg[0]
        try:
            if cmd == "setup":
                t0 = time.perf_counter()
                pair = _make_task(msg[1])
                conn.send({"ok": True, "setup_s": time.perf_counter() - t0})
            elif cmd == "run":
                out, t0 = [], time.perf_counter()
                for _ in range(msg[1]):
                    out.append(pair.step())
                conn.send({"ok": True, "steps": out, "wall_s": time.perf_counter() - t0})
            elif cmd == "finish":
                final = pair.final() if pair is not None and hasattr(pair, "final") else None
                conn.send({"ok": True, "memory": pair.memory() if pair else None, "final": final})
                return
        except BaseException as e:  # record and end: the parent goes on with the other configurations
            conn.send({"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300],
                       "kind": _classify(e), "trace": traceback.format_exc()[-1500:]})
            return
