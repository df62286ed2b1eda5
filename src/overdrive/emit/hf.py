"""The winner as Hugging Face's own configuration: an Accelerate config file (what `accelerate launch
--config_file` reads into the Accelerator) and `TrainingArguments` keyword arguments.

Read from accelerate (commands/config/config_args.py, utils/launch.py, utils/dataclasses.py
TERecipeKwargs/AORecipeKwargs, utils/constants.py TORCH_DYNAMO_MODES) and transformers
(training_args.py: bf16, fp16, optim, torch_compile*, gradient_checkpointing, use_liger_kernel,
liger_kernel_config). Every field that stack cannot express comes back as one line.
"""

from __future__ import annotations

from overdrive.emit.target import Target
from overdrive.formats import get_format

__all__ = ["accelerate_config", "training_args", "optimizer_line"]

# Accelerate's dynamo modes (TORCH_DYNAMO_MODES); "max-autotune" there turns CUDA graphs on.
_DYNAMO_MODES = ("default", "reduce-overhead", "max-autotune")
# What Overdrive's TE recipe uses (convert/fp8.py te_fp8_recipe): HYBRID, 16-step history, max.
TE_DELAYED = {"fp8_format": "HYBRID", "amax_history_len": 16, "amax_compute_algo": "max"}


def optimizer_line(ran: dict, stack: str) -> str | None:
    opt = ran.get("optimizer")
    how = {"torch-fused": "torch.optim.AdamW(params, fused=True)", "foreach": "torch.optim.AdamW(params, foreach=True)",
           "for-loop": "torch.optim.AdamW(params, foreach=False)", "apex": "apex.optimizers.FusedAdam(params)"}.get(opt)
    return None if how is None else f"optimizer {opt}: {stack} takes the optimizer you build: {how}"


def _common_lines(t: Target, stack: str, *, norm: bool = True, loss: bool = True) -> list[str]:
    ran, out = t.ran, []
    if norm and ran.get("norm") in ("liger", "apex", "transformer_engine"):
        out.append(f"norm {ran['norm']}: {stack} has no switch for fused norm kernels; accelerate(model, recipe) swaps "
                   "them, or swap the norms in your model")
    if loss and ran.get("loss") == "fused-linear-cross-entropy":
        out.append(f"loss fused-linear-cross-entropy: {stack} has no switch for it; use Liger's "
                   "LigerFusedLinearCrossEntropyLoss in your loss (acc.lm_loss does)")
    return out


def accelerate_config(t: Target) -> tuple[dict, list[str]]:
    """(the Accelerate config file's content, what it cannot say)."""
    ran, notes = t.ran, []
    p = ran.get("precision")
    cfg: dict = {"compute_environment": "LOCAL_MACHINE", "distributed_type": "NO", "num_machines": 1,
                 "num_processes": 1, "machine_rank": 0, "downcast_bf16": "no",
                 "mixed_precision": {"fp32": "no", "bf16": "bf16", "fp16": "fp16"}.get(p, "bf16")}
    if ran.get("device") == "cpu":
        cfg["use_cpu"] = True  # it ran on a CPU
    if t.fp8:
        backend, scaling = ran["fp8_backend"], ran.get("fp8_scaling")
        fmt = get_format(scaling or "tensorwise")
        if backend == "emulated":
            notes.append("FP8 ran emulated (numerics only, no FP8 hardware): Accelerate has no emulation; the config "
                         "says bf16")
        elif fmt.bits == "fp4":
            notes.append(f"{fmt.label}: Accelerate's FP8 backends have no FP4 recipe; the config says bf16")
        elif backend == "torchao":
            cfg["mixed_precision"] = "fp8"
            cfg["fp8_config"] = {"backend": "AO"}
            if scaling != "tensorwise":
                notes.append(f"torchao {scaling} scaling: the config file builds torchao's default (tensorwise) "
                             f"Float8LinearConfig; pass AORecipeKwargs(config=Float8LinearConfig.from_recipe_name("
                             f"{scaling!r})) to Accelerator(kwargs_handlers=[...]) for {scaling}")
        else:  # Transformer Engine
            cfg["mixed_precision"] = "fp8"
            cfg["fp8_config"] = {"backend": "TE", **TE_DELAYED, "margin": 0, "interval": 1,
                                 "override_linear_precision": [False, False, False], "use_autocast_during_eval": False}
            if fmt.accelerate_te_flag:
                cfg["fp8_config"][fmt.accelerate_te_flag] = True
            elif scaling != "delayed":
                notes.append(f"TE {scaling} (current) scaling: Accelerate's TE recipe is DelayedScaling (or MXFP8) "
                             "only; this config runs DelayedScaling (HYBRID, history 16, max)")
        if cfg["mixed_precision"] == "fp8":
            if t.recipe.fp8_shapes:
                keep = ", ".join(t.fp8_convert_fqns) or t.recipe.fp8_shapes
                notes.append(f"the measured per-layer FP8 filter (only {keep}): a config file cannot carry it; "
                             "torchao: AORecipeKwargs(module_filter_func=...); TE: Accelerate converts every Linear")
            else:
                notes.append(f"the FP8 size rule (Linears under {t.recipe.fp8_min_dim} features stay high precision): "
                             "Accelerate's own filter converts every Linear with dims divisible by 16 but the first "
                             "and last")
    c = ran.get("compile", "off")
    if c != "off":
        mode = c if c in _DYNAMO_MODES and c != "max-autotune" else "default"
        cfg["dynamo_config"] = {"dynamo_backend": "INDUCTOR", "dynamo_mode": mode, "dynamo_use_fullgraph": False,
                                "dynamo_use_dynamic": False}
        if mode != c:
            notes.append(f"compile {c}: Accelerate's dynamo modes are {', '.join(_DYNAMO_MODES)} (its max-autotune "
                         "replays CUDA graphs, unsafe across training steps); this config compiles with default")
    if ran.get("activation_checkpointing", "none") != "none":
        notes.append(f"activation checkpointing ({ran['activation_checkpointing']}): Accelerate's config has it only "
                     "under FSDP; call model.gradient_checkpointing_enable() (transformers) or checkpoint the blocks")
    line = optimizer_line(ran, "Accelerate")
    if line:
        notes.append(line)
    return cfg, notes + _common_lines(t, "Accelerate")


def training_args(t: Target) -> tuple[dict, list[str]]:
    """(TrainingArguments keyword arguments, what they cannot say)."""
    ran, notes = t.ran, []
    p = ran.get("precision")
    kw: dict = {"bf16": p in ("bf16", "fp8", "fp4"), "fp16": p == "fp16"}
    if ran.get("device") == "cpu":
        kw["use_cpu"] = True  # it ran on a CPU (and TrainingArguments refuses bf16 on a CPU without it)
    if p in ("fp8", "fp4"):
        notes.append(f"{'NVFP4' if p == 'fp4' else 'FP8'}: TrainingArguments has no FP8 switch; bf16 is set for the "
                     "rest, and FP8 comes from `accelerate launch --config_file accelerate_config.yaml` (--emit "
                     "accelerate) or accelerate(model, recipe) before the Trainer")
    opt = {"torch-fused": "adamw_torch_fused", "foreach": "adamw_torch", "apex": "adamw_apex_fused"}.get(
        ran.get("optimizer"))
    if opt:
        kw["optim"] = opt
    else:
        kw["optim"] = "adamw_torch"
        notes.append(f"optimizer {ran.get('optimizer')}: TrainingArguments' optim has no for-loop AdamW; adamw_torch "
                     "(torch's default foreach) is set")
    c = ran.get("compile", "off")
    kw["torch_compile"] = c != "off"
    if c != "off":
        kw["torch_compile_backend"] = "inductor"
        kw["torch_compile_mode"] = c
    ac = ran.get("activation_checkpointing", "none")
    kw["gradient_checkpointing"] = ac != "none"
    if ac == "selective":
        every = ran.get("checkpoint_every", 2)
        notes.append(f"selective checkpointing (every {every}th block): gradient_checkpointing checkpoints every "
                     "block of a transformers model; set to full")
    norm, flce = ran.get("norm") == "liger", ran.get("loss") == "fused-linear-cross-entropy"
    if norm or flce:
        kw["use_liger_kernel"] = True
        # Liger's apply_liger_kernel_to_<model> turns every kernel on by default: name what the recipe ran, only.
        kw["liger_kernel_config"] = {"rope": False, "swiglu": False, "geglu": False, "cross_entropy": False,
                                     "fused_linear_cross_entropy": flce, "rms_norm": norm, "layer_norm": norm}
    return kw, notes + _common_lines(t, "TrainingArguments", norm=ran.get("norm") != "liger",
                                     loss=ran.get("loss") != "fused-linear-cross-entropy")
