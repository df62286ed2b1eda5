"""The trainer: one process or many under torchrun (FSDP2), recipe-driven, distillation-capable,
crash-safe. `train(cfg)` is what `overdrive train CONFIG` runs: `_setup` builds the run (folder,
lock, data, model, optimizer, resume), then `loop.loop` steps it, with evaluation and checkpoints
at their intervals.

Under torchrun (WORLD_SIZE > 1) each block and the root are wrapped with `fully_shard`, with a
MixedPrecisionPolicy taken from the recipe (bf16/fp16 parameters in compute, fp32 reductions);
gloo on CPU, nccl on GPU. Every rank reads its own slice of the global batch; rank 0 logs.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections.abc import Callable

import torch

from overdrive.checkpoint import (clean_partial_saves, latest_checkpoint, load_model_weights, resume_checkpoint,
                                  set_rng_state)
from overdrive.convert import Applied, apply_recipe
from overdrive.convert.apply import prepare_teacher
from overdrive.convert.for_model import resolve_for_model
from overdrive.data import TokenData, load_tokens
from overdrive.env import get_env
from overdrive.io import check_writable, write_atomic
from overdrive.models import GPT
from overdrive.optim import build_adamw
from overdrive.recipes import Recipe, ResolvedRecipe, get_recipe, resolve
from overdrive.train.config import TrainConfig, micro_batch_from_accum
from overdrive.train.identity import RunMismatch, check_identity, run_identity
from overdrive.train.loop import Run, TrainHooks, TrainingDiverged, TrainingInterrupted, TrainResult, loop
from overdrive.train.memory import check_fits, estimate_bytes, free_bytes
from overdrive.train.metrics import MetricsLog
from overdrive.train.rundir import claim_for_ranks
from overdrive.train.runtime import Heartbeat, dist_setup
from overdrive.train.signals import StopRequest
from overdrive.train.step import TrainStep
from overdrive.train.weights import build_model, export_weights, load_exported

__all__ = ["train", "TrainingDiverged", "TrainingInterrupted", "RunMismatch", "TrainResult", "TrainHooks",
           "build_model", "export_weights", "load_exported", "run_identity"]


def _prepare(model: GPT, recipe: Recipe, cfg: TrainConfig, world: int, device: str, fsdp: bool) -> Applied:
    """The recipe on the model through the one applier `accelerate()` uses; the config's checkpointing
    fields join the recipe (its name kept), and every override is a Decision in the result."""
    res = resolve(recipe.replace(name=recipe.name, activation_checkpointing=cfg.train.activation_checkpointing,
                                 checkpoint_every=cfg.train.checkpoint_every_k), get_env())
    res, layer_filter = resolve_for_model(model, res)  # accelerate()'s checks: own checkpointing, tuned FP8 shapes
    return apply_recipe(model, res, module_filter_fn=layer_filter, fsdp=fsdp, world=world)


def _sayer(rank: int, quiet: bool, notes: list[str]) -> Callable[[str], None]:
    def say(msg: str) -> None:
        if rank == 0:
            notes.append(msg)
            if not quiet:
                print(f"overdrive: {msg}", file=sys.stderr, flush=True)
    return say


def _setup(cfg: TrainConfig, *, resume: bool, overwrite: bool, quiet: bool, hooks: TrainHooks,
           allow_changes: bool = False, report_to=None) -> Run:
    t, o = cfg.train, cfg.optimizer
    rank, world, device = dist_setup(force=t.fsdp == "on", timeout_s=t.dist_timeout_s)
    cfg, fsdp = _layout(cfg, world)
    t = cfg.train
    d = cfg.data
    tokens, vocab = load_tokens(d.train, fmt=d.format, vocab_size=d.vocab_size, builtin_n=d.builtin_tokens)
    data = TokenData(tokens, seq_len=t.seq_len, val_fraction=d.val_fraction, seed=t.seed)
    _check_memory(cfg, vocab, world if fsdp else 1, device)
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
        run = Run(cfg=cfg, rank=rank, world=world, device=device, run_dir=run_dir, run_id=run_id, folder=folder,
                   log=log, data=data, model=model, opt=opt, scaler=scaler, stepper=stepper,
                   identity=run_identity(cfg, model), applied=applied, teacher=teacher, hooks=hooks,
                   heartbeat=Heartbeat(rank, world), quiet=quiet, notes=notes, allow_changes=allow_changes)
        if resume:
            _resume(run, say)
        if rank == 0:
            _write_run_files(run_dir, {"run_id": run_id, **cfg.to_dict()}, res, applied)
        return run
    except BaseException:
        if log is not None:
            log.close()  # a tracker run already started ends FAILED
        if folder is not None:
            folder.lock.release()
        raise


def _layout(cfg: TrainConfig, world: int) -> tuple[TrainConfig, bool]:
    """(the config with its micro-batch settled, whether FSDP shards): the batch checked against the ranks."""
    t = cfg.train
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
    return cfg, fsdp


def _check_memory(cfg: TrainConfig, vocab: int, shards: int, device: str) -> None:
    """Refuse a model and batch that cannot fit in the free memory, before anything is allocated."""
    t = cfg.train
    with torch.device("meta"):  # sizes only: no memory, no RNG
        shape = build_model(cfg, vocab)
    act, state = estimate_bytes(n_params=sum(p.numel() for p in shape.parameters()), n_layer=shape.config.n_layer,
                                n_embd=shape.config.n_embd, vocab=vocab, micro_batch=t.micro_batch,
                                seq_len=t.seq_len, shards=shards)
    check_fits(act=act, state=state, free=free_bytes(device), micro_batch=t.micro_batch, seq_len=t.seq_len)


def _write_run_files(run_dir: str, config: dict, res: ResolvedRecipe, applied: Applied) -> None:
    """config.json, recipe.json (what ran) and conversions.json (per layer) in the run folder."""
    write_atomic(os.path.join(run_dir, "config.json"), json.dumps(config, indent=1))
    write_atomic(os.path.join(run_dir, "recipe.json"), json.dumps(res.to_dict(), indent=1))
    write_atomic(os.path.join(run_dir, "conversions.json"), json.dumps(
        {"conversions": {k: [vars(d) for d in v] for k, v in applied.conversions.items()},
         "checkpointed": applied.checkpointed, "sharded": applied.sharded}, indent=1))


def _resume(run: Run, say: Callable[[str], None]) -> None:
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
            return loop(run)
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
