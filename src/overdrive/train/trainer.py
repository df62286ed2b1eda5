"""The trainer: one process or many under torchrun (FSDP2), recipe-driven, distillation-capable,
crash-safe. `train(cfg)` is what `overdrive train CONFIG` runs: `_setup` builds the run (folder,
lock, data, model, optimizer, resume), then each step is `_step`, with `_evaluate` and `_save` at
their intervals.

Under torchrun (WORLD_SIZE > 1) each block and the root are wrapped with `fully_shard`, with a
MixedPrecisionPolicy taken from the recipe (bf16/fp16 parameters in compute, fp32 reductions);
gloo on CPU, nccl on GPU. Every rank reads its own slice of the global batch; rank 0 logs.

Steps are counted as the log counts them: step 1 is the first optimizer step, and checkpoint
step_0000010 holds the model after 10 steps.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from overdrive.checkpoint import (clean_partial_saves, latest_checkpoint, load_model_weights, resume_checkpoint,
                                  rng_state, save_checkpoint, set_rng_state, verify_checkpoint)
from overdrive.convert import Applied, apply_recipe
from overdrive.convert.apply import prepare_teacher
from overdrive.data import TokenData, load_tokens
from overdrive.env import get_env
from overdrive.io import check_writable, write_atomic
from overdrive.losses import distill_loss
from overdrive.models import GPT
from overdrive.optim import build_adamw
from overdrive.recipes import Recipe, get_recipe, resolve
from overdrive.train.config import TrainConfig, micro_batch_from_accum
from overdrive.train.identity import RunMismatch, check_identity, run_identity
from overdrive.train.memory import check_fits, estimate_bytes, free_bytes
from overdrive.train.metrics import MetricsLog
from overdrive.train.rundir import RunDir, claim_for_ranks
from overdrive.train.runtime import Heartbeat, RankTimeout, dist_setup, is_timeout
from overdrive.train.signals import StopRequest
from overdrive.train.step import TrainStep
from overdrive.train.weights import build_model, export_weights, load_exported

__all__ = ["train", "TrainingDiverged", "TrainingInterrupted", "RunMismatch", "TrainResult", "TrainHooks",
           "build_model", "export_weights", "load_exported", "run_identity"]


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


def _prepare(model: GPT, recipe: Recipe, cfg: TrainConfig, world: int, device: str, fsdp: bool) -> Applied:
    """The recipe on the model through the one applier `accelerate()` uses; the config's checkpointing
    fields join the recipe (its name kept), and every override is a Decision in the result."""
    res = resolve(recipe.replace(name=recipe.name, activation_checkpointing=cfg.train.activation_checkpointing,
                                 checkpoint_every=cfg.train.checkpoint_every_k), get_env())
    return apply_recipe(model, res, fsdp=fsdp, world=world)


@dataclass
class _Run:
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


def _sayer(rank: int, quiet: bool, notes: list[str]) -> Callable[[str], None]:
    def say(msg: str) -> None:
        if rank == 0:
            notes.append(msg)
            if not quiet:
                print(f"overdrive: {msg}", file=sys.stderr, flush=True)
    return say


def _setup(cfg: TrainConfig, *, resume: bool, overwrite: bool, quiet: bool, hooks: TrainHooks,
           allow_changes: bool = False, report_to=None) -> _Run:
    t, o = cfg.train, cfg.optimizer
    rank, world, device = dist_setup(force=t.fsdp == "on", timeout_s=t.dist_timeout_s)
    fsdp = t.fsdp == "on" or (t.fsdp == "auto" and world > 1)
    if t.fsdp == "off" and world > 1:
        raise ValueError("train.fsdp = \"off\" with several ranks: each rank would train its own copy; use "
                         "fsdp = \"auto\"")
    if t.global_batch % world:
        raise ValueError(f"train.global_batch={t.global_batch} does not divide by the world size {world}: "
                         f"use a multiple of {world}")
    per_rank = t.global_batch // world
    if t.grad_accum_steps:  # the micro-batch follows from the accumulation (Accelerate's and HF's way of saying it)
        cfg = dataclasses.replace(cfg, train=(t := micro_batch_from_accum(t, world)))
    if per_rank % t.micro_batch:
        raise ValueError(f"train.global_batch / world = {per_rank} is not a multiple of train.micro_batch="
                         f"{t.micro_batch}: pick a micro-batch that divides it")
    d = cfg.data
    tokens, vocab = load_tokens(d.train, fmt=d.format, vocab_size=d.vocab_size, builtin_n=d.builtin_tokens)
    data = TokenData(tokens, seq_len=t.seq_len, val_fraction=d.val_fraction, seed=t.seed)
    with torch.device("meta"):  # sizes only: no memory, no RNG
        shape = build_model(cfg, vocab)
    act, state = estimate_bytes(n_params=sum(p.numel() for p in shape.parameters()), n_layer=shape.config.n_layer,
                                n_embd=shape.config.n_embd, vocab=vocab, micro_batch=t.micro_batch,
                                seq_len=t.seq_len, shards=world if fsdp else 1)
    check_fits(act=act, state=state, free=free_bytes(device), micro_batch=t.micro_batch, seq_len=t.seq_len)

    notes: list[str] = []
    say = _sayer(rank, quiet, notes)
    run_dir, run_id, folder = claim_for_ranks(t.out_dir, rank, world, resume=resume, overwrite=overwrite, say=say)
    log = None
    try:
        log = MetricsLog(run_dir, rank, quiet, report_to)
        if rank == 0:
            check_writable(os.path.join(run_dir, "checkpoints"), flag="train.out_dir (its checkpoints/ folder)")
            for p in clean_partial_saves(run_dir):  # we hold the lock: no save of ours is under way
                say(f"deleted {p}, left by an interrupted save")
        teacher = _teacher(cfg, run_dir, vocab, device, quiet) if cfg.teacher else None
        torch.manual_seed(t.seed)
        model = build_model(cfg, vocab)
        applied = _prepare(model, get_recipe(t.recipe), cfg, world, device, fsdp)
        res = applied.resolved
        if teacher is not None:
            say(prepare_teacher(teacher, applied))
        from overdrive.track import train_params

        for where in log.start(train_params(cfg, res, world), run_name=run_id):
            say(f"logging to {where}")
        opt = build_adamw(model, applied.optimizer, lr=o.lr, betas=(o.beta1, o.beta2), weight_decay=o.weight_decay)
        scaler = applied.grad_scaler()
        stepper = TrainStep(model, opt, scaler=scaler, applied=applied, grad_clip=o.grad_clip or None,
                            measure_norm=True, accum=t.global_batch // world // t.micro_batch, fsdp=fsdp)
        run = _Run(cfg=cfg, rank=rank, world=world, device=device, run_dir=run_dir, run_id=run_id, folder=folder,
                   log=log, data=data, model=model, opt=opt, scaler=scaler, stepper=stepper,
                   identity=run_identity(cfg, model), applied=applied, teacher=teacher, hooks=hooks,
                   heartbeat=Heartbeat(rank, world), quiet=quiet, notes=notes, allow_changes=allow_changes)
        if resume:
            _resume(run, say)
        if rank == 0:
            write_atomic(os.path.join(run_dir, "config.json"),
                         json.dumps({"run_id": run_id, **cfg.to_dict()}, indent=1))
            write_atomic(os.path.join(run_dir, "recipe.json"), json.dumps(res.to_dict(), indent=1))
            write_atomic(os.path.join(run_dir, "conversions.json"), json.dumps(
                {"conversions": {k: [vars(d) for d in v] for k, v in applied.conversions.items()},
                 "checkpointed": applied.checkpointed, "sharded": applied.sharded}, indent=1))
        return run
    except BaseException:
        if log is not None:
            log.close()  # a tracker run already started ends FAILED
        if folder is not None:
            folder.lock.release()
        raise


def _resume(run: _Run, say: Callable[[str], None]) -> None:
    check_identity(run.run_dir, run.run_id, run.identity, allow_changes=run.allow_changes, say=say)
    ck, extra = resume_checkpoint(run.run_dir, run.model, run.opt, run_id=run.run_id, rank=run.rank,
                                  world=run.world, say=say)
    if ck is None:
        root = os.path.join(run.run_dir, "checkpoints")
        if os.path.isdir(root) and any(n.startswith("step_") for n in os.listdir(root)):
            say(f"no checkpoint of this run in {root} (only other runs' or unfinished saves): starting at step 0")
        return
    run.start = run.resumed_from = int(extra["step"])
    run.last_good = ck
    if "rng" in extra:
        for what in set_rng_state(extra["rng"]):
            say(f"{ck}: {what} not restored (another device count): dropout masks differ from the saved run's")
    elif isinstance(extra.get("rng_cpu"), torch.Tensor):  # an older checkpoint: the CPU generator only
        torch.set_rng_state(extra["rng_cpu"])
    else:
        say(f"{ck}: no RNG state saved: dropout masks differ from the saved run's")
    if run.scaler is not None:
        if isinstance(extra.get("scaler"), dict) and extra["scaler"]:
            run.scaler.load_state_dict(extra["scaler"])
        elif extra.get("scale") is not None:  # an older checkpoint: the scale only, the growth count restarts
            run.scaler.load_state_dict({**run.scaler.state_dict(), "scale": float(extra["scale"]),
                                        "_growth_tracker": 0})
    if run.rank == 0 and not run.quiet:
        print(f"resumed from {ck} at step {run.start}", flush=True)


def _autocast(run: _Run):
    return run.applied.autocast()  # torch autocast and/or TE's FP8 autocast, as the recipe was applied


def _last_good(run: _Run) -> str:
    """The newest checkpoint of this run that verifies (saves never hold non-finite parameters)."""
    if run.last_good and verify_checkpoint(run.last_good) is None:
        return run.last_good
    return latest_checkpoint(run.run_dir, run_id=run.run_id, verify=True) or "none (this run saved none yet)"


def _step(run: _Run, step: int) -> tuple[float, float, float]:
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
def _evaluate(run: _Run) -> float:
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


def _params_finite(run: _Run) -> bool:
    ok = all(bool(torch.isfinite(p.to_local() if hasattr(p, "to_local") else p).all())
             for p in run.model.parameters())
    if run.world > 1:
        flag = torch.tensor([1.0 if ok else 0.0], device=run.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        ok = bool(flag.item() == 1.0)
    return ok


def _save(run: _Run, done: int) -> None:
    if not _params_finite(run):  # never write a poisoned checkpoint that a resume would trust
        raise TrainingDiverged(f"the parameters hold NaN/inf after step {done}; not saved. Last good checkpoint: "
                               f"{_last_good(run)}. Lower optimizer.lr or use grad clipping.")
    extra = {"step": done, "rng": rng_state(), "scaler": run.scaler.state_dict() if run.scaler else None,
             "world": run.world}
    run.last_good = save_checkpoint(run.run_dir, done, run.model, run.opt, extra, rank=run.rank, world=run.world,
                                    keep_last=run.cfg.train.keep_last, run_id=run.run_id,
                                    on_written=run.hooks.on_checkpoint_written, identity=run.identity)


def _loop(run: _Run) -> TrainResult:
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


def train(cfg: TrainConfig, *, resume: bool = False, overwrite: bool = False, quiet: bool = False,
          hooks: TrainHooks | None = None, allow_changes: bool = False, report_to=None) -> TrainResult:
    """Train per `cfg` in `cfg.train.out_dir` (or a fresh folder next to it when that one holds another run
    and neither `resume` nor `overwrite` is given: the result's run_dir and notes say which).

    resume: continue from the newest intact checkpoint; settings that differ from the checkpoint's run
    (model shape, recipe, seed, data, batch, optimizer) raise RunMismatch unless `allow_changes`.
    SIGTERM/SIGINT save a checkpoint at the next step boundary and raise TrainingInterrupted.
    report_to: "mlflow,wandb,tensorboard" (overdrive.track): the logged records go there too."""
    run = _setup(cfg, resume=resume, overwrite=overwrite, quiet=quiet, hooks=hooks or TrainHooks(),
                 allow_changes=allow_changes, report_to=report_to)
    try:
        with StopRequest() as run.stop:
            return _loop(run)
    finally:
        run.close()


def _teacher(cfg: TrainConfig, run_dir: str, vocab: int, device: str, quiet: bool) -> GPT:
    tc = cfg.teacher
    teacher = build_model(cfg, vocab, size=tc.size)
    if tc.checkpoint:
        load_exported(tc.checkpoint, teacher)
    elif tc.train_steps > 0:
        tdir = os.path.join(run_dir, "teacher")
        tcfg = dataclasses.replace(cfg, teacher=None, model=dataclasses.replace(cfg.model, size=tc.size, n_layer=None,
                                                                                 n_head=None, n_embd=None),
                                   train=dataclasses.replace(cfg.train, steps=tc.train_steps, out_dir=tdir,
                                                             checkpoint_every=0, eval_every=0))
        train(tcfg, resume=True, quiet=quiet)
        load_model_weights(latest_checkpoint(tdir, verify=True), teacher)
    else:
        raise ValueError("[teacher] needs checkpoint = \"path.pt\" or train_steps > 0")
    teacher.to(device).eval()
    for p in teacher.parameters():
        p.requires_grad_(False)
    return teacher
