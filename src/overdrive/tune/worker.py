"""One tune candidate in its own process: the user's model under one recipe, applied by
`overdrive.accelerate` (the one applier), driven step-batch by step-batch by the parent.

Protocol over a Pipe: ("setup", spec) -> ("run", n, with_grad_norm) ... -> ("finish",); also
("fp8_filter", spec) to measure the per-layer FP8 filter. Replies are dicts; a failure is
{"error", "kind": "user" | "oom" | "backend"} and ends the worker. "user" means the user's
own code (factory, batch or loss function) failed or returned the wrong thing.
"""

from __future__ import annotations

import os
import time
import traceback

from overdrive.bench.workloads.base import Task
from overdrive.errors import UserError

__all__ = ["worker_main", "TuneTask"]


class _UserCode(Exception):
    """The user's factory/batch/loss raised: reported as theirs, not the recipe's."""


def _user(what: str, fn, *args):
    try:
        return fn(*args)
    except UserError:
        raise
    except Exception as e:
        msg = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
        raise _UserCode(f"{what} raised {type(e).__name__}: {msg}") from None


class TuneTask(Task):
    """The user's model under one recipe; the set-up (threads, env, clock, memory baseline) is the
    bench's `Task`."""

    def __init__(self, spec: dict) -> None:
        import torch
        from torch import nn

        from overdrive.accelerate import accelerate
        from overdrive.recipes import Recipe
        from overdrive.tune.workload import check_batch

        super().__init__(spec)
        self.wl = spec["workload"]
        self.seed = spec["seed"]
        torch.manual_seed(self.seed)
        model = _user("the model factory", self.wl.model_fn)
        if not isinstance(model, nn.Module):
            raise UserError(f"the model factory returned {type(model).__name__}, not a torch.nn.Module: "
                            "return a fresh model")
        check_batch(_user("the batch function", self.wl.batch_fn, 0))
        from overdrive.recipes.tuned import model_signature

        self.signature = model_signature(model)  # before any swap: what accelerate(recipe="tuned") sees
        recipe = Recipe(**spec["recipe"])
        self.acc = accelerate(model, recipe, env=self.env, lr=spec["lr"], grad_clip=None)
        self.model = self.acc.model
        self.conversions = {k: [vars(d) for d in v] for k, v in self.acc.conversions.items()}
        self.step_i = 0

    def step(self, grad_norm: bool) -> dict:
        import torch

        from overdrive.tune.workload import compute_loss, to_device

        torch.manual_seed(self.seed + 1_000_003 * (self.step_i + 1))  # same batch and dropout draws in every worker
        batch = to_device(_user("the batch function", self.wl.batch_fn, self.step_i), self.device)
        acc = self.acc
        self.clock.sync()
        t0 = self.clock.mark()
        with acc.autocast():
            loss = compute_loss(self.model, batch, self.wl.loss_fn)
        acc.backward(loss)
        gn = _grad_norm(self.model, acc.scaler) if grad_norm else None
        acc.step()
        t1 = self.clock.mark()
        self.clock.sync()
        self.step_i += 1
        return {"ms": self.clock.elapsed_ms(t0, t1), "loss": float(loss.detach().float()), "gnorm": gn}

    def memory(self) -> dict:
        import torch

        out = super().memory()
        if self.cuda:  # the card's size: tune adds checkpointing candidates when memory is the limit
            out["total_mb"] = torch.cuda.get_device_properties(0).total_memory / 2**20
        return out


def _grad_norm(model, scaler) -> float:
    import torch

    grads = [p.grad.detach().float() for p in model.parameters() if p.grad is not None]
    if not grads:
        return 0.0
    norm = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])))
    return norm / scaler.get_scale() if scaler is not None else norm


def _fp8_filter(spec: dict) -> dict:
    """Measure the per-layer FP8 filter on the user's model (its real token counts)."""
    import torch

    from overdrive.env import build_report
    from overdrive.tune.fp8_filter import bench_linear, linear_sites, measure_filter
    from overdrive.tune.workload import compute_loss, to_device

    env = build_report(spec["env_facts"])
    dev = env.device
    wl = spec["workload"]
    torch.manual_seed(spec["seed"])
    model = _user("the model factory", wl.model_fn).to(dev)
    batch = to_device(_user("the batch function", wl.batch_fn, 0), dev)
    sites = linear_sites(model, lambda: compute_loss(model, batch, wl.loss_fn))
    del model
    res = measure_filter(sites, bench=lambda m, k, n, fp8: bench_linear(
        m, k, n, fp8, backend=spec["backend"], scaling=spec["scaling"], compile=spec["compile"], device=dev),
        min_gain=spec.get("min_gain", 1.05), convert_head=spec.get("convert_head", False))
    return {"shapes": res.shapes, "layers": res.layers, "summary": res.summary()}


def _classify(e: BaseException) -> str:
    """user | oom (CUDA's "out of memory" and the CPU allocator's "can't allocate memory", as in
    bench's worker) | backend."""
    from overdrive.bench.worker import _classify as classify_failure

    if isinstance(e, (UserError, _UserCode)):
        return "user"
    return classify_failure(e)


def worker_main(conn, compile_threads: int = 1) -> None:
    # Inductor's compile workers: the cores the parent gives this worker (measure.threads), not 1
    # everywhere (that serialises Triton compiles on a GPU box).
    os.environ["TORCHINDUCTOR_COMPILE_THREADS"] = str(max(1, compile_threads))
    task = None
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        try:
            if msg[0] == "setup":
                t0 = time.perf_counter()
                task = TuneTask(msg[1])
                conn.send({"ok": True, "setup_s": time.perf_counter() - t0, "conversions": task.conversions,
                           "signature": task.signature})
            elif msg[0] == "run":
                t0 = time.perf_counter()
                steps = [task.step(msg[2]) for _ in range(msg[1])]
                conn.send({"ok": True, "steps": steps, "wall_s": time.perf_counter() - t0, "memory": task.memory()})
            elif msg[0] == "fp8_filter":
                conn.send(dict(_fp8_filter(msg[1]), ok=True))
                return
            elif msg[0] == "finish":
                conn.send({"ok": True, "memory": task.memory() if task else None})
                return
        except BaseException as e:  # reported, and the worker ends: the parent carries on without it
            text = str(e).strip().splitlines()[0] if str(e).strip() else ""
            kind = _classify(e)
            conn.send({"error": (text if kind == "user" else f"{type(e).__name__}: {text}")[:300], "kind": kind,
                       "trace": traceback.format_exc()[-1500:]})
            return
