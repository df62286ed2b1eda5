"""`accelerate(model, recipe)`: the user's model, made fast with what works here, every choice explained.

    acc = overdrive.accelerate(model, recipe="auto", optimizer=opt, scheduler=sched, grad_accum_steps=4)
    for x, y in batches:
        loss = loss_fn(acc.model(x), y)   # the forward already runs under the recipe's autocast
        acc.backward(loss)                # scaled (fp16) and divided by grad_accum_steps
        acc.step()                        # every 4th call: unscale, clip, step, scaler, scheduler
    print(acc.report())

`accelerate(model, recipe, **options)` is `Accelerated(model, recipe, AccelerateOptions(**options))`:
one path, whoever calls (the user, tune's and bench's workers), through `resolve_for_model`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os

import torch
import torch.nn.functional as F
from torch import nn

from overdrive.accelerate_options import AccelerateOptions
from overdrive.convert import Applied, LayerDecision, apply_recipe, wrap_forward_in
from overdrive.convert.for_model import resolve_for_model
from overdrive.distributed import ProcessHelpers
from overdrive.env import get_env
from overdrive.errors import UserError
from overdrive.optim import build_adamw
from overdrive.recipes import Decision, Recipe, ResolvedRecipe
from overdrive.train.step import TrainStep

__all__ = ["accelerate", "Accelerated", "AccelerateOptions"]

# Where our AdamW defaults differ from torch's (weight_decay=0.01, betas=(0.9, 0.999), no clipping):
# nanoGPT / GPT-3 / Llama pre-training values. Said in report(); every one is a keyword.
_DEFAULTS_NOTE = "weight decay 0.1, betas (0.9, 0.95) (GPT-3/Llama values; torch's are 0.01, (0.9, 0.999))"


def accelerate(model: nn.Module, recipe: str | Recipe | ResolvedRecipe = "auto", **options) -> Accelerated:
    """Resolve `recipe` on this machine and apply it to `model` in place; `options` are AccelerateOptions'
    fields (lr, optimizer, scheduler, grad_accum_steps, distributed, dataloader, report_to, ...).

    optimizer: yours (an Optimizer over model.parameters(), or `lambda params: Optimizer`); else AdamW
    with lr/weight_decay/betas (3e-4, 0.1, (0.9, 0.95) when not given). scheduler: an LR scheduler or
    `lambda opt: Scheduler(opt, ...)`, stepped by acc.step() after each optimizer step.
    grad_accum_steps=N: acc.backward divides the loss by N; acc.step() steps every N-th call
    (gradient_accumulation_steps=N, Accelerate's and TrainingArguments' name, is the same setting).
    recipe also takes Lightning's precision strings ("bf16-mixed", "16-mixed", "32-true",
    "transformer-engine"); report() says the Overdrive recipe they ran as.
    report_to="mlflow,wandb,tensorboard": acc.log({...}, step=...) sends metrics there, with the recipe
    and the machine as the run's parameters (run_name names the run; local stores go in logging_dir);
    acc.end_training() closes the runs.
    distributed="fsdp": FSDP2 under torchrun (each repeated block, then the root); "ddp":
    DistributedDataParallel (a replica per rank; no all-reduce on accumulation micro-steps).
    dataloader: a torch DataLoader, prepared as acc.dataloader (sharded, on the device, resumable);
    acc.prepare_dataloader(loader) prepares more.
    autocast_forward: acc.model's forward runs under the recipe's autocast (False: use acc.autocast()).
    recipe="tuned" applies the winner `overdrive tune` cached for this model (parameter names and
    shapes) on this machine; with none cached it runs "auto" and says so (a FALLBACK line in report()).
    strict=True raises RecipeUnavailable instead of falling back. `module_filter_fn(module, fqn)`
    decides which nn.Linear layers go to FP8 (instead of the size and head rules).
    """
    return Accelerated(model, recipe, AccelerateOptions.from_keywords("accelerate()", options))


class Accelerated(ProcessHelpers):
    """A model converted per a recipe, with its optimizer, scheduler, scaler and autocast."""

    def __init__(self, model: nn.Module, recipe: str | Recipe | ResolvedRecipe = "auto",
                 options: AccelerateOptions | None = None) -> None:
        o = self.options = options or AccelerateOptions()
        resolved, module_filter_fn = resolve_for_model(model, recipe, o.env, strict=o.strict,
                                                       module_filter_fn=o.module_filter_fn)
        world = _init_distributed(o.distributed) if o.distributed else 1
        self.distributed = o.distributed
        self.device = torch.device(resolved.device)
        self.grad_clip = o.grad_clip
        self.grad_accum_steps = o.grad_accum_steps
        names = {id(p): n for n, p in model.named_parameters()}  # to re-point a user optimizer after sharding
        self.applied: Applied = apply_recipe(model, resolved, module_filter_fn=module_filter_fn,
                                             fsdp=o.distributed == "fsdp", world=world)
        self.resolved = self.applied.resolved
        self.conversions: dict[str, list[LayerDecision]] = self.applied.conversions
        self.checkpointed = self.applied.checkpointed
        self.model = model
        if o.autocast_forward:
            wrap_forward_in(model, self.applied.autocast)
        self.user_optimizer = o.optimizer is not None
        self._under_trainer = False  # set by trainer_kwargs(): the Trainer then clips, accumulates and schedules
        # Whether the user chose the optimizer's settings (optimizer=, or lr/weight_decay/betas): under
        # transformers.Trainer only then does ours run; otherwise the Trainer's own arguments decide.
        self.optimizer_chosen = o.optimizer is not None or any(v is not None for v in (o.lr, o.weight_decay, o.betas))
        self.optimizer, self._opt_note = self._build_optimizer(model, names)
        self.scheduler = _scheduler(o.scheduler, self.optimizer)
        self._micro = 0
        if o.distributed == "ddp":  # after the swaps and the optimizer: DDP shares the user's Parameters
            self._wrap_ddp(world)
        self.dataloaders: list = []
        self.dataloader = self.prepare_dataloader(o.dataloader) if o.dataloader is not None else None
        self.scaler = self.applied.grad_scaler()
        self._flce = None
        self.steps = 0
        self._skipped = torch.zeros((), dtype=torch.int64, device=self.device)  # summed on device: no sync
        from overdrive.step_flops import StepFlops

        self._flops = StepFlops(model, device=self.device, enabled=o.distributed is None)  # for report()'s TFLOP/s
        if o.report_to:
            from overdrive.track import accelerate_trackers

            self.trackers = accelerate_trackers(self, o.env or get_env(), o.report_to, logging_dir=o.logging_dir,
                                                run_name=o.run_name)

    def _build_optimizer(self, model: nn.Module, names: dict[int, str]) -> tuple[torch.optim.Optimizer | None, str]:
        """The user's optimizer (re-pointed at the live parameters), else our AdamW, else none; and its note."""
        o = self.options
        if o.optimizer is not None:
            opt = o.optimizer(list(model.parameters())) if callable(o.optimizer) and \
                not isinstance(o.optimizer, torch.optim.Optimizer) else _repoint(o.optimizer, names, model)
            return opt, _describe_optimizer(opt)
        if not o.build_optimizer:
            return None, "none built (build_optimizer=False)"
        lr = 3e-4 if o.lr is None else o.lr
        weight_decay = 0.1 if o.weight_decay is None else o.weight_decay
        betas = (0.9, 0.95) if o.betas is None else tuple(o.betas)
        opt = build_adamw(model, self.resolved.optimizer, lr=lr, betas=betas, weight_decay=weight_decay)
        return opt, f"AdamW {self.resolved.optimizer}, lr {lr:g}, " + (
            _DEFAULTS_NOTE if (weight_decay, betas) == (0.1, (0.9, 0.95))
            else f"weight decay {weight_decay:g}, betas {betas}")

    def _wrap_ddp(self, world: int) -> None:
        """DistributedDataParallel over the converted model, said as a decision."""
        from overdrive.distributed import BUCKET_MB, wrap_ddp

        n = self.grad_accum_steps
        self.model = wrap_ddp(self.model, self.device)
        self._ddp_sync_next()
        self.resolved = dataclasses.replace(self.resolved, decisions=self.resolved.decisions + (Decision(
            field="ddp", requested="ddp", chosen=f"DistributedDataParallel x{world}",
            reason=f"a replica per rank, gradients averaged in {BUCKET_MB} MB buckets during the backward"
            + (f"; no all-reduce on the first {n - 1} of every {n} micro-steps (no_sync)" if n > 1 else "")),))

    # -- the training-loop API -------------------------------------------------------------
    def autocast(self) -> contextlib.AbstractContextManager:
        """Explicit forward context (acc.model's forward already enters it unless autocast_forward=False)."""
        return self.applied.autocast()

    @property
    def skipped_steps(self) -> int:
        """Optimizer steps skipped for inf/nan gradients (the GradScaler's, or acc.step's own). Reading it syncs."""
        return int(self._skipped)

    def backward(self, loss: torch.Tensor) -> None:
        """loss / grad_accum_steps, scaled under fp16; under FSDP and DDP gradients sync on the last micro-step
        only (DDP: one forward per backward, as it decides at the forward)."""
        if self.scaler is not None and self.optimizer is None:
            raise UserError("amp-fp16 scales the loss by the GradScaler's factor (65536 at first): pass your "
                            "optimizer to accelerate(..., optimizer=opt) so acc.step() unscales before stepping")
        last = self._micro % self.grad_accum_steps == self.grad_accum_steps - 1
        with self._flops.backward():
            self._stepper().backward(loss, last=last)
        self._micro += 1
        self._ddp_sync_next()

    def _ddp_sync_next(self) -> None:
        """DDP decides in the forward whether the coming backward all-reduces: set what `no_sync()` sets
        (require_backward_grad_sync) for the next micro-step's forward, True on the last one only."""
        if self.distributed == "ddp":
            self.model.require_backward_grad_sync = self._micro % self.grad_accum_steps == self.grad_accum_steps - 1

    def _stepper(self) -> TrainStep:
        """The one training step (train/step.py), over this object's current optimizer and scaler."""
        return TrainStep(self.model, self.optimizer or [], scaler=self.scaler, applied=self.applied,
                         grad_clip=self.grad_clip, accum=self.grad_accum_steps, fsdp=self.applied.fsdp,
                         measure_norm=self.scaler is None)

    def step(self) -> dict:
        """On the last micro-step: unscale (fp16), clip, optimizer step, scaler update, scheduler step,
        zero_grad. Returns tensors, not floats (a float() per step is a host sync on GPU):
        {"stepped", "skipped", "grad_norm", "scale"}."""
        if self.optimizer is None:
            raise UserError("accelerate(..., build_optimizer=False) has no optimizer to step: pass yours with "
                            "accelerate(..., optimizer=opt) and call acc.step()")
        if self._micro % self.grad_accum_steps:
            return {"stepped": False, "skipped": False, "grad_norm": None, "scale": None}
        s = self._stepper().step(skip_non_finite=self.scaler is None)  # no GradScaler to skip NaN/inf gradients
        if not s.stepped:
            self._skipped += 1
            logging.getLogger("overdrive").warning("acc.step(): the gradients hold NaN/inf (a non-finite loss?): this "
                                                   "optimizer step was skipped, the parameters are unchanged")
            return {"stepped": False, "skipped": True, "grad_norm": None, "scale": None}
        if self.scaler is not None:
            self._skipped += s.skipped.to(self._skipped.device, torch.int64)
        if self.scheduler is not None:
            self.scheduler.step()
        self.steps += 1
        self._flops.mark_step()
        return {"stepped": True, "skipped": s.skipped, "grad_norm": s.grad_norm, "scale": s.scale}

    def lm_loss(self, hidden: torch.Tensor, head_weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Cross-entropy of `hidden @ head_weight.T` against targets; fused (Liger) when resolved so."""
        h = hidden.reshape(-1, hidden.size(-1))
        if self.resolved.loss == "fused-linear-cross-entropy":
            if self._flce is None:
                from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

                self._flce = LigerFusedLinearCrossEntropyLoss()
            return self._flce(head_weight, h, targets.reshape(-1))
        return F.cross_entropy(F.linear(h, head_weight).float(), targets.reshape(-1))

    # -- experiment trackers (accelerate(..., report_to=...)) ---------------------------------
    trackers = None

    def log(self, metrics: dict, step: int | None = None) -> None:
        """Send the numbers in `metrics` (tensors are read: one sync) to the trackers of report_to=, at
        `step` (default: the optimizer steps so far). Without report_to it does nothing."""
        if self.trackers:
            self.trackers.log(metrics, self.steps if step is None else step)

    def end_training(self) -> None:
        """Finish the trackers' runs (MLflow FINISHED, W&B synced or closed offline)."""
        if self.trackers:
            self.trackers.close(True)

    # -- checkpoints (torch.distributed.checkpoint: sharded under FSDP, reshardable) ----------
    def save(self, path: str) -> str:
        """Model, optimizer, scheduler, scaler, step counters and each rank's RNG state into the folder
        `path`, atomically (written to path.tmp and renamed only when every rank is done) with a SHA-256
        manifest. Loads on any number of ranks. `path` is replaced only if an earlier save wrote it."""
        from overdrive.checkpoint.accel import save_state

        return save_state(path, self)

    def load(self, path: str) -> None:
        """Restore what `save` wrote, verified (resharded to this run's ranks; a 2-rank save loads on 1):
        the next step continues bit-exactly where the saved run would have."""
        from overdrive.checkpoint.accel import load_state

        for note in load_state(path, self):  # what could not be restored exactly (another world size)
            logging.getLogger("overdrive").warning("acc.load(%s): %s", path, note)

    # -- Hugging Face Trainer --------------------------------------------------------------
    def trainer_kwargs(self) -> dict:
        """`Trainer(args=TrainingArguments(..., **acc.training_args_kwargs()), **acc.trainer_kwargs(), ...)`:
        the converted model, this optimizer/scheduler, and a callback that refuses arguments that would
        undo the recipe (a precision flag that disagrees with it)."""
        from overdrive.hf_trainer import trainer_kwargs

        if self.distributed == "ddp":
            raise UserError("the HF Trainer wraps the model in DDP itself under torchrun: use accelerate(..., "
                            "distributed=None) with the Trainer")
        return trainer_kwargs(self)

    def training_args_kwargs(self) -> dict:
        """The TrainingArguments fields the recipe decides: bf16/fp16, max_grad_norm, accumulation."""
        from overdrive.hf_trainer import training_args_kwargs

        return training_args_kwargs(self)

    # -- explanations ----------------------------------------------------------------------
    def report(self) -> str:
        r = self.resolved
        lines = [f"Overdrive recipe '{r.recipe.name}' on {r.device}: precision {r.precision}"
                 + (f" ({r.fp8_backend}, {r.fp8_scaling})" if r.fp8_backend else "")
                 + (f", autocast {r.autocast_dtype}" if r.autocast_dtype else "")
                 + (f", {type(self.scaler).__name__}" if self.scaler else "")]
        for d in r.decisions:
            if d.field == "optimizer" and (self.user_optimizer or self.optimizer is None):
                continue  # the recipe's AdamW choice: not what runs when the optimizer is the user's (or none)
            tag = "FALLBACK " if d.fallback else ""
            lines.append(f"  {tag}{d.field}: {d.chosen}  — {d.reason}")
        if r.emulated:
            fmt = {"mxfp8": "MXFP8", "nvfp4": "NVFP4"}.get(r.fp8_scaling, "FP8")
            lines.append(f"  NOTE: {fmt} is emulated: it shows {fmt} numerics, it is not faster.")
        if self._under_trainer:
            lines.append(f"  optimizer: {self._opt_note}; clipping, accumulation and the LR schedule: the Trainer's "
                         "(TrainingArguments max_grad_norm, gradient_accumulation_steps, lr_scheduler_type)")
        else:
            lines.append(f"  optimizer: {self._opt_note}; gradient clipping "
                         + (f"at {self.grad_clip:g} (grad_clip=None turns it off)" if self.grad_clip else "off")
                         + (f"; scheduler {type(self.scheduler).__name__} (lr now {self._lr_now():g})"
                            if self.scheduler is not None and self.optimizer is not None else "")
                         + (f"; gradients accumulated over {self.grad_accum_steps} micro-steps"
                            if self.grad_accum_steps > 1 else ""))
        for what, decs in self.conversions.items():
            conv = [d for d in decs if d.converted]
            lines.append(f"  {what} swaps: {len(conv)} of {len(decs)} layers converted")
            # Group the skips by reason so a 96-layer model reads in a few lines.
            by_reason: dict[str, list[str]] = {}
            for d in decs:
                if not d.converted:
                    by_reason.setdefault(d.reason, []).append(d.fqn)
            for reason, fqns in by_reason.items():
                shown = ", ".join(fqns[:4]) + (f" and {len(fqns) - 4} more" if len(fqns) > 4 else "")
                lines.append(f"    skipped {shown}: {reason}")
        lines.append(self._flops.line(accum=self.grad_accum_steps, precision=r.precision, emulated=r.emulated))
        if self.checkpointed:
            lines.append(f"  activation checkpointing on {len(self.checkpointed)} blocks: "
                         + ", ".join(self.checkpointed[:6]) + (" ..." if len(self.checkpointed) > 6 else ""))
        return "\n".join(lines)

    def _lr_now(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"]) if self.optimizer.param_groups else 0.0

    def to_dict(self) -> dict:
        return {"resolved": self.resolved.to_dict(),
                "conversions": {k: [vars(d) for d in v] for k, v in self.conversions.items()},
                "checkpointed": self.checkpointed, "sharded": self.applied.sharded,
                "optimizer": self._opt_note, "grad_clip": self.grad_clip, "grad_accum_steps": self.grad_accum_steps,
                "distributed": self.distributed, "dataloaders": [d.state_dict() for d in self.dataloaders],
                "flops": self._flops.report(accum=self.grad_accum_steps, precision=self.resolved.precision,
                                            emulated=self.resolved.emulated)}


def _scheduler(scheduler, optimizer):
    """The user's scheduler, or the one `scheduler(optimizer)` builds (as optimizer= takes a factory)."""
    if scheduler is None or callable(getattr(scheduler, "step", None)):
        return scheduler
    if not callable(scheduler):
        raise UserError(f"scheduler={type(scheduler).__name__}: pass an LR scheduler (with .step()) or "
                        "`lambda opt: torch.optim.lr_scheduler.X(opt, ...)`")
    if optimizer is None:
        raise UserError("scheduler=<factory> needs an optimizer to build on: drop build_optimizer=False or "
                        "pass optimizer=")
    built = scheduler(optimizer)
    if not callable(getattr(built, "step", None)):
        raise UserError(f"scheduler=<factory> returned {type(built).__name__}, not an LR scheduler: return "
                        "e.g. torch.optim.lr_scheduler.LambdaLR(opt, fn)")
    return built


def _describe_optimizer(opt: torch.optim.Optimizer) -> str:
    """The user's optimizer as it will run: class, implementation flags, the first group's settings."""
    g = opt.param_groups[0] if opt.param_groups else {}
    parts = []
    for k in ("lr", "momentum", "nesterov", "betas", "weight_decay", "eps"):
        # An LR scheduler moves g["lr"] at once (a warm-up's is 0) and keeps what the user set in initial_lr.
        v = g.get("initial_lr", g.get(k)) if k == "lr" else g.get(k)
        if v is None or (k in ("momentum", "nesterov", "weight_decay") and not v):
            continue  # SGD's momentum 0 / no weight decay: nothing to say
        if isinstance(v, (tuple, list)):
            parts.append(f"{k} ({', '.join(f'{float(b):g}' for b in v)})")
        else:
            parts.append(f"{k} {v}" if isinstance(v, bool) else f"{k} {float(v):g}")
    impl = [k for k in ("fused", "foreach") if g.get(k)]
    n = sum(p.numel() for gr in opt.param_groups for p in gr["params"])
    groups = len(opt.param_groups)
    return (f"your optimizer: {type(opt).__name__}" + (f" ({', '.join(impl)})" if impl else "")
            + "".join(f", {p}" for p in parts) + f", {groups} param group{'s' * (groups != 1)} over {n:,} "
            "parameters (the recipe's AdamW choice does not apply)")


def _init_distributed(kind: str = "fsdp") -> int:
    """The world size under torchrun, initialising the default process group if needed."""
    import torch.distributed as dist

    if not dist.is_initialized():
        if "MASTER_ADDR" not in os.environ:
            raise UserError(f"distributed={kind!r} needs torchrun (it sets MASTER_ADDR, RANK, WORLD_SIZE): "
                            "torchrun --nproc_per_node=N your_script.py")
        cuda = torch.cuda.is_available()
        if cuda:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl" if cuda else "gloo")
    return dist.get_world_size()


def _repoint(opt: torch.optim.Optimizer, names: dict[int, str], model: nn.Module) -> torch.optim.Optimizer:
    """Point a user optimizer built on the original parameters at the live ones (FSDP2 replaces each
    parameter by a sharded DTensor one); module swaps keep the user's Parameters, so usually a no-op."""
    live = dict(model.named_parameters())
    if all(id(p) in {id(q) for q in live.values()} for g in opt.param_groups for p in g["params"]):
        return opt
    if any(opt.state.values()):
        raise UserError("your optimizer already holds state for the original parameters: build it after "
                        "accelerate() on acc.model.parameters(), or pass optimizer=lambda params: ...")
    for g in opt.param_groups:
        new = []
        for p in g["params"]:
            n = names.get(id(p))
            if n is None or n not in live:
                raise UserError("your optimizer holds parameters that are not the model's: build it on "
                                "model.parameters() (or pass optimizer=lambda params: ...)")
            new.append(live[n])
        g["params"] = new
    return opt


