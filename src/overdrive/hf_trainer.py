"""A recipe under `transformers.Trainer`: two extra lines, and a callback that refuses to lose it.

    acc = overdrive.accelerate(model, "amp-bf16")
    args = TrainingArguments(output_dir="out", **acc.training_args_kwargs())
    Trainer(args=args, train_dataset=ds, **acc.trainer_kwargs()).train()

The model's modules are already converted (FP8 linears, fused norms, Liger patches, checkpointing)
and its forward runs under the recipe's autocast; Trainer does the backward and the steps, with the
precision flags, clipping and accumulation the recipe asks for.
"""

from __future__ import annotations

from overdrive.errors import UserError

__all__ = ["training_args_kwargs", "trainer_kwargs", "recipe_callback"]


def _flags(acc) -> dict:
    dt = acc.resolved.autocast_dtype
    return {"bf16": dt == "bfloat16", "fp16": dt == "float16"}


def training_args_kwargs(acc) -> dict:
    """TrainingArguments fields the recipe decides (on a CPU, use_cpu: Trainer refuses bf16 there without it)."""
    kw = {**_flags(acc), "max_grad_norm": float(acc.grad_clip or 0.0),
          "gradient_accumulation_steps": acc.grad_accum_steps}
    if acc.resolved.device == "cpu":
        kw["use_cpu"] = True
    return kw


def recipe_callback(acc):
    """A TrainerCallback that checks, when training begins, that the arguments keep the recipe."""
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
            model = kwargs.get("model")
            if model is not None and model is not acc.model and getattr(model, "module", None) is not acc.model:
                raise UserError("Trainer got another model than acc.model: pass **acc.trainer_kwargs() to Trainer")

    return OverdriveRecipeCallback()


def trainer_kwargs(acc) -> dict:
    """Trainer(...) keywords: the converted model, this optimizer and scheduler, the recipe callback."""
    if acc.optimizer is None:
        raise UserError("accelerate(..., build_optimizer=False) has no optimizer for Trainer: drop "
                        "build_optimizer=False or pass optimizer=")
    return {"model": acc.model, "optimizers": (acc.optimizer, acc.scheduler), "callbacks": [recipe_callback(acc)]}
