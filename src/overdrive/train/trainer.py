"""The trainer: one process or many under torchrun (FSDP2), recipe-driven, distillation-capable,
crash-safe. `train(cfg)` is what `overdrive train CONFIG` runs.

Under torchrun (WORLD_SIZE > 1) each block and the root are wrapped with `fully_shard`, with a
MixedPrecisionPolicy taken from the recipe (bf16/fp16 parameters in compute, fp32 reductions);
gloo on CPU, nccl on GPU. Every rank reads its own slice of the global batch; rank 0 logs.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from overdrive.io import write_atomic
from overdrive.convert import apply_activation_checkpointing, convert_fp8, convert_norms
from overdrive.env import get_env
from overdrive.models import GPT, gpt_config
from overdrive.losses import distill_loss
from overdrive.optim import build_adamw
from overdrive.recipes import Recipe, get_recipe, resolve
from overdrive.train.checkpoint import (CheckpointError, latest_checkpoint, load_checkpoint, load_model_weights,
                                        save_checkpoint)
from overdrive.train.config import TrainConfig
from overdrive.train.data import TokenData, load_tokens

__all__ = ["train", "TrainingDiverged", "TrainResult", "build_model", "export_weights", "load_exported"]


class TrainingDiverged(RuntimeError):
    """The loss became NaN/inf outside fp16 (where the scaler would skip the step)."""


@dataclass
class TrainResult:
    losses: list[float]
    val_losses: dict[int, float]
    final_val_loss: float | None
    run_dir: str
    resumed_from: int | None


def _dist_setup(force: bool = False) -> tuple[int, int, str]:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if force and "MASTER_ADDR" not in os.environ:
        raise ValueError("train.fsdp = \"on\" needs torchrun (it sets MASTER_ADDR): torchrun --nproc_per_node=1 "
                         "-m overdrive train CONFIG")
    if (world > 1 or force) and not dist.is_initialized():
        dist.init_process_group("nccl" if device == "cuda" else "gloo")
        if device == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    return rank, world, device


def build_model(cfg: TrainConfig, vocab: int, size: str | None = None) -> GPT:
    m = cfg.model
    over = {k: getattr(m, k) for k in ("n_layer", "n_head", "n_embd", "norm", "tie_embeddings")
            if getattr(m, k) is not None and size is None}
    return GPT(gpt_config(size or m.size, vocab_size=vocab, block_size=cfg.train.seq_len, **over))


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


class _Log:
    def __init__(self, run_dir: str, rank: int, quiet: bool) -> None:
        self.rank, self.quiet = rank, quiet
        self.path = os.path.join(run_dir, "metrics.jsonl")
        self.tb = None
        if rank == 0:
            os.makedirs(run_dir, exist_ok=True)
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(os.path.join(run_dir, "tb"))
            except Exception:  # TensorBoard is optional
                self.tb = None

    def __call__(self, rec: dict) -> None:
        if self.rank != 0:
            return
        with open(self.path, "a") as f:
            f.write(json.dumps(rec) + "\n")
        if self.tb:
            for k, v in rec.items():
                if isinstance(v, (int, float)) and k != "step":
                    self.tb.add_scalar(k, v, rec["step"])
        if not self.quiet:
            print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in rec.items()),
                  flush=True)


def _prepare(model: GPT, recipe: Recipe, cfg: TrainConfig, world: int, device: str, fsdp: bool):
    env = get_env()
    res = resolve(recipe.replace(activation_checkpointing=cfg.train.activation_checkpointing,
                                 checkpoint_every=cfg.train.checkpoint_every_k,
                                 compile="off" if fsdp else recipe.compile), env)
    model.to(device)
    if res.norm != "torch":
        convert_norms(model, res.norm)
    if res.fp8_backend:
        convert_fp8(model, backend=res.fp8_backend, scaling=res.fp8_scaling, min_dim=res.fp8_min_dim,
                    convert_head=res.fp8_convert_head)
    apply_activation_checkpointing(model, res.activation_checkpointing, res.checkpoint_every)
    autocast = res.autocast_dtype
    if fsdp:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mp = MixedPrecisionPolicy(param_dtype=getattr(torch, autocast), reduce_dtype=torch.float32) \
            if autocast else MixedPrecisionPolicy()
        for block in model.blocks:
            fully_shard(block, mp_policy=mp)
        fully_shard(model, mp_policy=mp)
        autocast = None  # FSDP2 casts parameters itself
    # For-loop AdamW under FSDP: every implementation steps DTensors, the for-loop one on any backend.
    impl = "for-loop" if fsdp else res.optimizer
    return res, autocast, impl


def train(cfg: TrainConfig, *, resume: bool = False, quiet: bool = False) -> TrainResult:
    t = cfg.train
    rank, world, device = _dist_setup(force=t.fsdp == "on")
    fsdp = t.fsdp == "on" or (t.fsdp == "auto" and world > 1)
    if t.fsdp == "off" and world > 1:
        raise ValueError("train.fsdp = \"off\" with several ranks: each rank would train its own copy; use "
                         "fsdp = \"auto\"")
    if t.global_batch % world:
        raise ValueError(f"train.global_batch={t.global_batch} does not divide by the world size {world}: "
                         f"use a multiple of {world}")
    per_rank = t.global_batch // world
    if per_rank % t.micro_batch:
        raise ValueError(f"train.global_batch / world = {per_rank} is not a multiple of train.micro_batch="
                         f"{t.micro_batch}: pick a micro-batch that divides it")
    tokens, vocab = load_tokens(cfg.data)
    data = TokenData(tokens, seq_len=t.seq_len, val_fraction=cfg.data.val_fraction, seed=t.seed)
    run_dir = t.out_dir
    log = _Log(run_dir, rank, quiet)

    teacher = None
    if cfg.teacher:
        teacher = _teacher(cfg, data, vocab, device, rank, world, quiet)

    torch.manual_seed(t.seed)
    model = build_model(cfg, vocab)
    res, autocast, impl = _prepare(model, get_recipe(t.recipe), cfg, world, device, fsdp)
    o = cfg.optimizer
    opt = build_adamw(model, impl, lr=o.lr, betas=(o.beta1, o.beta2), weight_decay=o.weight_decay)
    scaler = torch.amp.GradScaler(device) if res.grad_scaler else None
    start, resumed_from = 0, None
    if resume:
        ck = latest_checkpoint(run_dir)
        if ck:
            extra = load_checkpoint(ck, model, opt, rank=rank, world=world)
            start = resumed_from = int(extra["step"])
            torch.set_rng_state(extra["rng_cpu"])
            if scaler and extra.get("scale") is not None:
                scaler.update(float(extra["scale"]))
            if rank == 0 and not quiet:
                print(f"resumed from {ck} at step {start}", flush=True)
    if rank == 0:
        write_atomic(os.path.join(run_dir, "config.json"), json.dumps(cfg.to_dict(), indent=1))
        write_atomic(os.path.join(run_dir, "recipe.json"), json.dumps(res.to_dict(), indent=1))

    losses, val_losses = [], {}
    inject_nan = int(os.environ.get("OVERDRIVE_INJECT_NAN_STEP", "-1"))  # tests: a diverging step
    t0 = time.perf_counter()
    for step in range(start, t.steps):
        lr = _lr_at(step, cfg)
        for g in opt.param_groups:
            g["lr"] = lr
        micro = data.rank_micro_batches(step, t.global_batch, rank, world, t.micro_batch)
        total = torch.zeros((), device=device)  # summed on device: one host sync per step, not per micro-batch
        for x, y in micro:
            x, y = x.to(device), y.to(device)
            ctx = torch.autocast(device, dtype=getattr(torch, autocast)) if autocast else torch.autocast(
                device, enabled=False)
            with ctx:
                logits, ce = model(x, y)
                loss = ce
                if teacher is not None:
                    with torch.no_grad():
                        t_logits, _ = teacher(x)
                    loss = distill_loss(logits, t_logits, y, alpha=cfg.teacher.alpha,
                                        temperature=cfg.teacher.temperature)
            if step == inject_nan:
                loss = loss * float("nan")
            scaled = loss / len(micro)
            (scaler.scale(scaled) if scaler else scaled).backward()
            total += loss.detach().float() / len(micro)
        step_loss = _all_mean(float(total), world, device)
        if not math.isfinite(step_loss) and not scaler:
            last = latest_checkpoint(run_dir)
            raise TrainingDiverged(f"loss became {step_loss} at step {step}; stopped without saving. Last good "
                                   f"checkpoint: {last or 'none'}. Lower optimizer.lr or use grad clipping.")
        if scaler:
            scaler.unscale_(opt)
        if o.grad_clip:
            gn = torch.nn.utils.clip_grad_norm_(model.parameters(), o.grad_clip)
            gnorm = float(gn.full_tensor() if hasattr(gn, "full_tensor") else gn)
        else:
            gnorm = float("nan")
        if scaler:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(step_loss)
        done = step + 1
        if done % t.log_every == 0 or done == t.steps:
            el = time.perf_counter() - t0
            log({"step": done, "loss": step_loss, "lr": lr, "grad_norm": gnorm,
                 "tokens_per_s": (done - start) * t.global_batch * t.seq_len / max(el, 1e-9)})
        if t.eval_every and (done % t.eval_every == 0 or done == t.steps):
            v = _evaluate(model, data, cfg, rank, world, device, autocast)
            val_losses[done] = v
            log({"step": done, "val_loss": v})
        if (t.checkpoint_every and done % t.checkpoint_every == 0) or done == t.steps:
            extra = {"step": done, "rng_cpu": torch.get_rng_state(),
                     "scale": scaler.get_scale() if scaler else None, "world": world}
            save_checkpoint(run_dir, done, model, opt, extra, rank=rank, world=world, keep_last=t.keep_last)
    final = val_losses.get(t.steps)
    return TrainResult(losses=losses, val_losses=val_losses, final_val_loss=final, run_dir=run_dir,
                       resumed_from=resumed_from)


@torch.no_grad()
def _evaluate(model, data: TokenData, cfg: TrainConfig, rank: int, world: int, device: str, autocast) -> float:
    model.eval()
    tot = 0.0
    t = cfg.train
    for i in range(cfg.train.eval_batches):
        for x, y in data.rank_micro_batches(i, t.global_batch, rank, world, t.micro_batch, split="val"):
            ctx = torch.autocast(device, dtype=getattr(torch, autocast)) if autocast else torch.autocast(
                device, enabled=False)
            with ctx:
                _, loss = model(x.to(device), y.to(device))
            tot += float(loss) / (cfg.train.eval_batches * (t.global_batch // world // t.micro_batch))
    model.train()
    return _all_mean(tot, world, device)


def _teacher(cfg: TrainConfig, data: TokenData, vocab: int, device: str, rank: int, world: int, quiet: bool):
    tc = cfg.teacher
    teacher = build_model(cfg, vocab, size=tc.size)
    if tc.checkpoint:
        load_exported(tc.checkpoint, teacher)
    elif tc.train_steps > 0:
        import dataclasses

        tcfg = dataclasses.replace(cfg, teacher=None, model=dataclasses.replace(cfg.model, size=tc.size, n_layer=None,
                                                                                 n_head=None, n_embd=None),
                                   train=dataclasses.replace(cfg.train, steps=tc.train_steps,
                                                             out_dir=os.path.join(cfg.train.out_dir, "teacher"),
                                                             checkpoint_every=0, eval_every=0))
        train(tcfg, resume=True, quiet=quiet)
        ck = latest_checkpoint(tcfg.train.out_dir)
        load_model_weights(ck, teacher)
    else:
        raise ValueError("[teacher] needs checkpoint = \"path.pt\" or train_steps > 0")
    teacher.to(device).eval()
    for p in teacher.parameters():
        p.requires_grad_(False)
    return teacher


def export_weights(run_dir_or_ckpt: str, cfg: TrainConfig, out_path: str) -> str:
    """One plain state_dict (for inference) from the newest checkpoint of a run."""
    ck = run_dir_or_ckpt if os.path.exists(os.path.join(run_dir_or_ckpt, ".metadata")) else \
        latest_checkpoint(run_dir_or_ckpt)
    if not ck:
        raise CheckpointError(f"no complete checkpoint under {run_dir_or_ckpt}: train first")
    _, vocab = load_tokens(cfg.data)
    model = build_model(cfg, vocab)
    load_model_weights(ck, model)
    import io

    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    write_atomic(out_path, buf.getvalue())
    return out_path


def load_exported(path: str, model: torch.nn.Module) -> torch.nn.Module:
    """Load an exported state_dict with weights_only=True (no code runs from the file)."""
    if not os.path.exists(path):
        raise CheckpointError(f"{path} not found: export one with `overdrive train CONFIG --export PATH`")
    try:
        sd = torch.load(path, map_location="cpu", weights_only=True)
        model.load_state_dict(sd)
    except Exception as e:
        raise CheckpointError(f"cannot load {path} into {type(model).__name__}: {str(e).splitlines()[0][:200]}") \
            from None
    return model
