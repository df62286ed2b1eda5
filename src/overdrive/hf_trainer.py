"""A recipe under `transformers.Trainer`: two extra lines, and a callback that refuses to lose it.

    acc = overdrive.accelerate(model, "amp-bf16")
    args = TrainingArguments(output_dir="out", learning_rate=2e-3, **acc.training_args_kwargs())
    Trainer(args=args, train_dataset=ds, **acc.trainer_kwargs()).train()

The model's modules are already converted (FP8 linears, fused norms, Liger patches, checkpointing)
and its forward runs under the recipe's autocast; Trainer does the backward and the steps, with the
precision flags the recipe asks for. The Trainer's own hyperparameters win: unless the user chose an
optimizer in accelerate() (optimizer=, or lr=/weight_decay=/betas=), the Trainer builds its optimizer
from TrainingArguments; a choice made in both places that disagrees is refused in one line.
"""

from __future__ import annotations

import dataclasses

from overdrive.errors import UserError

__all__ = ["training_args_kwargs", "trainer_kwargs", "recipe_callback"]


def _flags(acc) -> dict:
    dt = acc.resolved.autocast_dtype
    return {"bf16": dt == "bfloat16", "fp16": dt == "float16"}


def _arg_defaults() -> dict:
    from transformers import TrainingArguments

    return {f.name: f.default for f in dataclasses.fields(TrainingArguments)}


def _accel_choices(acc) -> dict:
    """TrainingArguments fields that accelerate() was told explicitly (theirs = the defaults otherwise)."""
    d = _arg_defaults()
    kw = {}
    if acc.grad_accum_steps != d["gradient_accumulation_steps"]:
        kw["gradient_accumulation_steps"] = acc.grad_accum_steps
    if float(acc.grad_clip or 0.0) != d["max_grad_norm"]:
        kw["max_grad_norm"] = float(acc.grad_clip or 0.0)
    return kw


def training_args_kwargs(acc) -> dict:
    """TrainingArguments fields the recipe decides (bf16/fp16; on a CPU use_cpu: Trainer refuses bf16 there
    without it), and accumulation/clipping only where accelerate() was given other values than the Trainer's
    defaults: a key returned here and also written by the user is Python's 'multiple values' TypeError."""
    kw = {**_flags(acc), **_accel_choices(acc)}
    if acc.resolved.device == "cpu":
        kw["use_cpu"] = True
    return kw


def _mismatches(acc, args) -> list[str]:
    """What the user set both in accelerate() and in TrainingArguments, differently."""
    d, bad = _arg_defaults(), []
    for k, v in _accel_choices(acc).items():
        if getattr(args, k) not in (v, d[k]):
            bad.append(f"TrainingArguments({k}={getattr(args, k)}) against accelerate()'s {v}")
    opt = acc.optimizer if acc.optimizer_chosen else None
    if opt is not None and opt.param_groups:
        g = opt.param_groups[0]
        lr = float(g.get("initial_lr", g["lr"]))
        if args.learning_rate != d["learning_rate"] and abs(args.learning_rate - lr) > 1e-12 * max(1.0, lr):
            bad.append(f"TrainingArguments(learning_rate={args.learning_rate:g}) against the optimizer's lr {lr:g}")
        wd = max(float(gr.get("weight_decay", 0.0)) for gr in opt.param_groups)
        if args.weight_decay != d["weight_decay"] and args.weight_decay != wd:
            bad.append(f"TrainingArguments(weight_decay={args.weight_decay:g}) against the optimizer's {wd:g}")
    return bad


def recipe_callback(acc):
    """A TrainerCallback that checks, when training begins, that the arguments keep the recipe and that no
    hyperparameter was set twice, differently (accelerate() and TrainingArguments)."""
    from transformers import TrainerCallback

    want = _flags(acc)
    name = acc.resolved.recipe.name

    class OverdriveRecipeCallback(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            got = {"bf16": bool(args.bf16), "fp16": bool(args.fp16)}
            if got != want:
                fix = ", ".join(f"{k}={v}" for k, v in want.items())
                raise UserError(f"TrainingArguments {got} disagree with recipe '{name}' ({fix}): build them with "
                                "TrainingArguments(..., **acc.training_args_kwargs())")
            bad = _mismatches(acc, args)
            if bad:
                raise UserError("; ".join(bad) + ": set each once, in TrainingArguments (the Trainer then builds "
                                "its optimizer) or in accelerate(..., optimizer=/lr=/grad_accum_steps=)")
            model = kwargs.get("model")
            if model is not None and model is not acc.model and getattr(model, "module", None) is not acc.model:
                raise UserError("Trainer got another model than acc.model: pass **acc.trainer_kwargs() to Trainer")

    return OverdriveRecipeCallback()


def trainer_kwargs(acc) -> dict:
    """Trainer(...) keywords: the converted model, the recipe callback, and the optimizer (with its scheduler)
    only when the user chose one in accelerate(); otherwise the Trainer builds its own from TrainingArguments
    (learning_rate, weight_decay, optim, lr_scheduler_type), and report() says so."""
    kw = {"model": acc.model, "callbacks": [recipe_callback(acc)]}
    acc._under_trainer = True  # report(): the Trainer clips, accumulates and schedules, by its arguments
    if acc.optimizer is not None and acc.optimizer_chosen:
        kw["optimizers"] = (acc.optimizer, acc.scheduler)
        return kw
    if acc.scheduler is not None:
        raise UserError("accelerate(..., scheduler=) without optimizer= under the Trainer: pass the optimizer too, "
                        "or set lr_scheduler_type in TrainingArguments")
    acc.optimizer = None  # never stepped: the Trainer's optimizer runs, and report() must not name ours
    acc._opt_note = ("the Trainer's own, built from TrainingArguments (learning_rate, weight_decay, optim); "
                     "the recipe's AdamW choice does not apply")
    return kw
