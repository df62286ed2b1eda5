"""The steps of a training run: each optimizer step (`_step`), evaluation and checkpoint at their
intervals, and the stop checks, over the `Run` that `trainer._setup` builds.

Steps are counted as the log counts them: step 1 is the first optimizer step, and checkpoint
step_0000010 holds the model after 10 steps.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from overdrive.checkpoint import latest_checkpoint, rng_state, save_checkpoint, verify_checkpoint
from overdrive.convert import Applied
from overdrive.data import TokenData
from overdrive.losses import distill_loss
from overdrive.models import GPT
from overdrive.train.config import TrainConfig
from overdrive.train.metrics import MetricsLog
from overdrive.train.rundir import RunDir
from overdrive.train.runtime import Heartbeat, RankTimeout, is_timeout
from overdrive.train.signals import StopRequest
from overdrive.train.step import TrainStep

__all__ = ["Run", "loop", "TrainingDiverged", "TrainingInterrupted", "TrainResult", "TrainHooks"]


class TrainingDiverged(RuntimeError):
    """The loss or the gradient norm became NaN/inf outside fp16 (where the scaler would skip the step)."""


class TrainingInterrupted(RuntimeError):
    """SIGTERM/SIGINT: the run saved a checkpoint at the step boundary and stopped."""

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.signum = signum


@dataclass
class TrainResult:
    losses: list[float]
    val_losses: dict[int, float]
    final_val_loss: float | None
    run_dir: str
    resumed_from: int | None
    notes: list[str] = field(default_factory=list)
    """What the run said about its folder, lock and checkpoints (also printed unless quiet)."""


@dataclass(frozen=True, kw_only=True)
class TrainHooks:
    """Faults that tests inject, passed to `train(hooks=...)`; never read from the environment."""

    nan_loss_at: int | None = None
    """The step (counted as the log counts) whose loss is made NaN."""
    nan_grad_at: int | None = None
    """The step whose gradients get a NaN while the loss stays finite."""
    stall: tuple[int, int, float] | None = None
    """(rank, step, seconds): that rank stops answering for that long at the start of that step."""
    on_checkpoint_written: Callable[[str], None] | None = None
    """Called with the .tmp folder once this rank's checkpoint files are written, before the rename."""
    on_step: Callable[[int], None] | None = None
    """Called with the step number (as logged) after each step's work, before the stop check (tests
    send the process a signal there)."""


def _lr_at(step: int, cfg: TrainConfig) -> float:
    o, n = cfg.optimizer, cfg.train.steps
    if step < o.warmup_steps:
        return o.lr * (step + 1) / o.warmup_steps
    frac = (step - o.warmup_steps) / max(1, n - o.warmup_steps)
    return o.min_lr + 0.5 * (o.lr - o.min_lr) * (1 + math.cos(math.pi * min(1.0, frac)))


def _all_mean(x: float, world: int, device: str) -> float:
    if world == 1:
        return x
    t = torch.tensor([x], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return float(t) / world


def _mean_and_stop(x: float, stop: bool, world: int, device: str) -> tuple[float, bool]:
    """The mean loss over ranks and whether any rank was asked to stop, in one all-reduce."""
    if world == 1:
        return x, stop
    t = torch.tensor([x, 1.0 if stop else 0.0], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return float(t[0]) / world, bool(t[1] > 0)


@dataclass
class Run:
    """Everything `_setup` builds and the step, eval and save use."""

    cfg: TrainConfig
    rank: int
    world: int
    device: str
    run_dir: str
    run_id: str
    folder: RunDir | None  # rank 0 holds the folder's lock
    log: MetricsLog
    data: TokenData
    model: GPT
    opt: torch.optim.Optimizer
    scaler: torch.amp.GradScaler | None
    stepper: TrainStep
    identity: dict
    applied: Applied  # the recipe as applied: forward context, post-step hook, what ran
    teacher: GPT | None
    hooks: TrainHooks
    heartbeat: Heartbeat
    quiet: bool
    notes: list[str]
    start: int = 0
    resumed_from: int | None = None
    last_good: str | None = None  # the newest checkpoint this run saved or resumed from
    allow_changes: bool = False
    stop: StopRequest | None = None

    def close(self) -> None:
        self.log.close()
        if self.folder is not None:
            self.folder.lock.release()
            self.folder = None


def _autocast(run: Run):
    return run.applied.autocast()  # torch autocast and/or TE's FP8 autocast, as the recipe was applied


def _last_good(run: Run) -> str:
    """The newest checkpoint of this run that verifies (saves never hold non-finite parameters)."""
    if run.last_good and verify_checkpoint(run.last_good) is None:
        return run.last_good
    return latest_checkpoint(run.run_dir, run_id=run.run_id, verify=True) or "none (this run saved none yet)"


def _step(run: Run, step: int) -> tuple[float, float, float]:
    """One optimizer step (0-based `step`, logged as step+1): (loss, gradient norm, lr).

    Loss and gradient norm are checked before the optimizer steps: a finite loss with a NaN
    gradient would otherwise poison the parameters, and every checkpoint after them."""
    cfg, t, h = run.cfg, run.cfg.train, run.hooks
    done = step + 1
    run.heartbeat.beat(done)
    if h.stall and h.stall[0] == run.rank and h.stall[1] == done:
        time.sleep(h.stall[2])
    lr = _lr_at(step, cfg)
    for g in run.opt.param_groups:
        g["lr"] = lr
    micro = run.data.rank_micro_batches(step, t.global_batch, run.rank, run.world, t.micro_batch)
    total = torch.zeros((), device=run.device)  # summed on device: one host sync per step, not per micro-batch
    for i, (x, y) in enumerate(micro):
        x, y = x.to(run.device), y.to(run.device)
        with _autocast(run):
            logits, loss = run.model(x, y)
            if run.teacher is not None:
                with torch.no_grad():
                    t_logits, _ = run.teacher(x)
                loss = distill_loss(logits, t_logits, y, alpha=cfg.teacher.alpha, temperature=cfg.teacher.temperature)
        if done == h.nan_loss_at:
            loss = loss * float("nan")
        run.stepper.backward(loss, last=i == len(micro) - 1, accum=len(micro))
        total += loss.detach().float() / len(micro)
    if done == h.nan_grad_at:
        next(p for p in run.model.parameters() if p.grad is not None).grad.mul_(float("nan"))
    step_loss, run.stop.seen = _mean_and_stop(float(total), run.stop.requested, run.world, run.device)
    gnorm = math.nan

    def guard(gn: torch.Tensor | None) -> None:  # before the optimizer step: nothing has changed yet
        nonlocal gnorm
        gnorm = float(gn)
        if not run.scaler and not (math.isfinite(step_loss) and math.isfinite(gnorm)):
            what = f"loss became {step_loss} at step {done}" if not math.isfinite(step_loss) else \
                f"the gradient norm became {gnorm} at step {done} (loss {step_loss:.4g})"
            raise TrainingDiverged(f"{what}; stopped before the optimizer step, nothing saved. Last good "
                                   f"checkpoint: {_last_good(run)}. Lower optimizer.lr or use grad clipping.")

    run.stepper.step(guard=guard)  # under fp16 the scaler skips a non-finite step itself
    return step_loss, gnorm, lr


@torch.no_grad()
def _evaluate(run: Run) -> float:
    t = run.cfg.train
    run.model.eval()
    tot, n = 0.0, t.eval_batches * (t.global_batch // run.world // t.micro_batch)
    for i in range(t.eval_batches):
        for x, y in run.data.rank_micro_batches(i, t.global_batch, run.rank, run.world, t.micro_batch, split="val"):
            with _autocast(run):
                _, loss = run.model(x.to(run.device), y.to(run.device))
            tot += float(loss) / n
    run.model.train()
    return _all_mean(tot, run.world, run.device)


def _params_finite(run: Run) -> bool:
    ok = all(bool(torch.isfinite(p.to_local() if hasattr(p, "to_local") else p).all())
             for p in run.model.parameters())
    if run.world > 1:
        flag = torch.tensor([1.0 if ok else 0.0], device=run.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        ok = bool(flag.item() == 1.0)
    return ok


def _save(run: Run, done: int) -> None:
    if not _params_finite(run):  # never write a poisoned checkpoint that a resume would trust
        raise TrainingDiverged(f"the parameters hold NaN/inf after step {done}; not saved. Last good checkpoint: "
                               f"{_last_good(run)}. Lower optimizer.lr or use grad clipping.")
    extra = {"step": done, "rng": rng_state(), "scaler": run.scaler.state_dict() if run.scaler else None,
             "world": run.world}
    run.last_good = save_checkpoint(run.run_dir, done, run.model, run.opt, extra, rank=run.rank, world=run.world,
                                    keep_last=run.cfg.train.keep_last, run_id=run.run_id,
                                    on_written=run.hooks.on_checkpoint_written, identity=run.identity)


def loop(run: Run) -> TrainResult:
    t = run.cfg.train
    losses, val_losses = [], {}
    t0 = time.perf_counter()
    for step in range(run.start, t.steps):
        done = step + 1
        try:
            loss, gnorm, lr = _step(run, step)
            losses.append(loss)
            if done % t.log_every == 0 or done == t.steps:
                el = time.perf_counter() - t0
                run.log({"step": done, "loss": loss, "lr": lr, "grad_norm": gnorm,
                         "tokens_per_s": (done - run.start) * t.global_batch * t.seq_len / max(el, 1e-9),
                         "step_ms": 1e3 * el / max(done - run.start, 1)})
            if t.eval_every and (done % t.eval_every == 0 or done == t.steps):
                val_losses[done] = _evaluate(run)
                run.log({"step": done, "val_loss": val_losses[done]})
            saved = (t.checkpoint_every and done % t.checkpoint_every == 0) or done == t.steps
            if saved:
                _save(run, done)
            if run.hooks.on_step:
                run.hooks.on_step(done)
            # one rank: the flag as it is now; several: as every rank saw it in this step's all-reduce
            stop = run.stop.requested if run.world == 1 else run.stop.seen
            if stop and done < t.steps:
                if not saved:
                    _save(run, done)
                raise TrainingInterrupted(f"stopped by {run.stop.name} after step {done}: saved {run.last_good}; "
                                          "continue with --resume", run.stop.signum)
        except RuntimeError as e:
            if run.world > 1 and not isinstance(e, (TrainingDiverged, TrainingInterrupted, RankTimeout)) \
                    and is_timeout(e):
                raise RankTimeout(run.heartbeat.blame(done, t.dist_timeout_s)) from None
            raise
    return TrainResult(losses=losses, val_losses=val_losses, final_val_loss=val_losses.get(t.steps),
                       run_dir=run.run_dir, resumed_from=run.resumed_from, notes=run.notes)
