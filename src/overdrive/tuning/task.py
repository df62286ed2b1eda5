"""One tune candidate inside its worker (the protocol and the launcher are the measurement core's,
`overdrive.measure.worker` and `overdrive.measure.launch`): the user's model under one recipe,
applied by `overdrive.accelerate` (the one applier), driven step-batch by step-batch by the parent.

`("run", n, with_grad_norm)` steps it n times; the setup reply carries the conversions and the model's
signature, every run reply the memory so far. One extra command, `("fp8_filter", spec)`, measures the
per-layer FP8 filter on the user's model. A failure of the user's own code (factory, batch or loss
function) is reported with kind "user".
"""

from __future__ import annotations

from overdrive.errors import UserError
from overdrive.measure.worker import Program, Task
from overdrive.measure.worker import user_call as _user

__all__ = ["TuneTask", "PROGRAM", "fp8_filter"]


class TuneTask(Task):
    """The user's model under one recipe; the set-up (threads, env, clock, memory baseline) is the
    measurement core's `Task`."""

    def __init__(self, spec: dict) -> None:
        import torch
        from torch import nn

        from overdrive.accelerated import accelerate
        from overdrive.recipes import Recipe
        from overdrive.tuning.workload import check_batch

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

    def setup_reply(self) -> dict:
        import torch

        # the threads it really steps with: a model factory may set its own (torch.set_num_threads(7))
        return {"conversions": self.conversions, "signature": self.signature, "threads": torch.get_num_threads()}

    def run_reply(self) -> dict:
        return {"memory": self.memory()}

    def step(self, grad_norm: bool) -> dict:
        import torch

        from overdrive.tuning.workload import compute_loss, to_device

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


def fp8_filter(spec: dict) -> dict:
    """Measure the per-layer FP8 filter on the user's model (its real token counts)."""
    import torch

    from overdrive.env import build_report
    from overdrive.tuning.fp8_filter import bench_linear, linear_sites, measure_filter
    from overdrive.tuning.workload import compute_loss, to_device

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
        min_gain=spec.get("min_gain", 1.05), convert_head=spec.get("convert_head", False),
        fmt=spec["scaling"] if spec["scaling"] in ("mxfp8", "nvfp4") else "fp8", backend=spec["backend"])
    return {"shapes": res.shapes, "layers": res.layers, "summary": res.summary()}


PROGRAM = Program(build=TuneTask, commands={"fp8_filter": fp8_filter})
