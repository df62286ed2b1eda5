"""The winner as torchtitan's and Lightning's own configuration.

torchtitan (0.2.x JobConfig, torchtitan/config/job_config.py; loaded by its ConfigManager from
`--job.config_file`): [model] converters, [quantize.linear.float8] / [quantize.linear.mx] with
filter_fqns (modules to *skip*, matched by substring: components/quantization/utils.py),
[compile], [activation_checkpoint], [training] mixed_precision_param.
Lightning (Trainer(precision=...), lightning/pytorch/trainer/connectors/accelerator_connector.py):
"32-true", "bf16-mixed", "16-mixed", "transformer-engine" (TransformerEnginePrecision with bf16
weights and TE's default DelayedScaling).
"""

from __future__ import annotations

from overdrive.emit.hf import TE_DELAYED, _common_lines, optimizer_line
from overdrive.emit.target import Target
from overdrive.formats import get_format

__all__ = ["torchtitan_config", "lightning_config"]


def torchtitan_config(t: Target) -> tuple[dict, list[str]]:
    """(the torchtitan TOML sections, what they cannot say)."""
    ran, notes = t.ran, []
    p = ran.get("precision")
    cfg: dict = {"training": {"mixed_precision_param": "float32" if p in ("fp32", "fp16") else "bfloat16"}}
    if p == "fp16":
        notes.append("fp16 autocast with a GradScaler: torchtitan's mixed precision is bf16 or fp32 (FSDP "
                     "mixed_precision_param); set to float32")
    converters = []
    if t.fp8:
        backend, scaling = ran["fp8_backend"], ran.get("fp8_scaling")
        fmt = get_format(scaling or "tensorwise")
        skip = t.fp8_skip_fqns
        if backend == "transformer_engine":
            notes.append(f"Transformer Engine FP8 ({scaling}): torchtitan runs FP8 through torchao only; use "
                         "[quantize.linear.float8] (tensorwise) for the closest torchao recipe")
        elif fmt.bits == "fp4":
            notes.append(f"{fmt.label}: torchtitan 0.2 has no FP4 linear converter")
        elif fmt.torchtitan_mx:
            converters.append("quantize.linear.mx")
            cfg["quantize"] = {"linear": {"mx": {"recipe_name": fmt.torchtitan_mx, "filter_fqns": skip or ["output"]}}}
        else:
            converters.append("quantize.linear.float8")
            f8 = {"recipe_name": scaling if scaling in ("tensorwise", "rowwise") else "tensorwise",
                  "filter_fqns": skip or ["output"], "emulate": backend == "emulated"}
            if f8["recipe_name"] == "tensorwise":  # torchtitan recommends both with tensorwise under FSDP
                f8.update(enable_fsdp_float8_all_gather=True, precompute_float8_dynamic_scale_for_fsdp=True)
            cfg["quantize"] = {"linear": {"float8": f8}}
        if converters:
            if not t.fp8_layers:
                notes.append(("the measured per-layer FP8 filter is by shape (" + t.recipe.fp8_shapes + ")"
                              if t.recipe.fp8_shapes else f"the FP8 size rule (under {t.recipe.fp8_min_dim} "
                              "features stays high precision)") + ": torchtitan filters by FQN; emit from the tune "
                             "folder for the FQN list (filter_fqns = ['output'] here)")
            clash = sorted({k for s in skip for k in t.fp8_convert_fqns if s in k})
            if clash:
                notes.append(f"torchtitan matches filter_fqns by substring: {', '.join(clash)} would be skipped too")
            notes.append("filter_fqns names the layers of the model tune measured: torchtitan's own model "
                         "definitions name theirs alike only when they are that model")
    if converters:
        cfg["model"] = {"converters": converters}
    c = ran.get("compile", "off")
    cfg["compile"] = {"enable": c != "off", "components": ["model", "loss"]}
    if c not in ("off", "default"):
        notes.append(f"compile mode {c}: torchtitan compiles each block with its default mode")
    ac = ran.get("activation_checkpointing", "none")
    cfg["activation_checkpoint"] = {"mode": ac}
    if ac == "selective":
        cfg["activation_checkpoint"]["selective_ac_option"] = str(ran.get("checkpoint_every", 2))
    impl = {"torch-fused": "fused", "foreach": "foreach", "for-loop": "for-loop"}.get(ran.get("optimizer"))
    if impl:
        cfg["optimizer"] = {"name": "AdamW", "implementation": impl}
    elif ran.get("optimizer"):
        notes.append(f"optimizer {ran['optimizer']}: torchtitan's AdamW implementations are for-loop, foreach, fused")
    return cfg, notes + _common_lines(t, "torchtitan")


def lightning_config(t: Target) -> tuple[dict, list[str]]:
    """(LightningCLI's `trainer:` section, what it cannot say)."""
    ran, notes = t.ran, []
    p = ran.get("precision")
    prec = {"fp32": "32-true", "bf16": "bf16-mixed", "fp16": "16-mixed"}.get(p, "bf16-mixed")
    if t.fp8:
        backend, scaling = ran["fp8_backend"], ran.get("fp8_scaling")
        if backend == "transformer_engine" and scaling in ("delayed", "tensorwise"):
            prec = "transformer-engine"
            notes.append("Lightning's transformer-engine keeps bf16 weights and TE's default DelayedScaling (history "
                         f"1024); for the measured recipe pass plugins=[TransformerEnginePrecision(weights_dtype="
                         f"torch.float32, recipe={TE_DELAYED})]")
            if scaling != "delayed":
                notes.append(f"TE {scaling} (current) scaling: Lightning's TE plugin takes a DelayedScaling "
                             "recipe only")
        else:
            notes.append(f"{'FP8' if p == 'fp8' else 'NVFP4'} via {backend} ({scaling}): Lightning has no precision "
                         "plugin for it; bf16-mixed is set, convert the Linears in configure_model "
                         "(torchao.float8.convert_to_float8_training)")
    if ran.get("compile", "off") != "off":
        notes.append(f"compile ({ran['compile']}): Lightning has no Trainer flag; torch.compile(model, "
                     f"mode={ran['compile']!r}) in configure_model")
    if ran.get("activation_checkpointing", "none") != "none":
        notes.append("activation checkpointing: a Trainer flag only under FSDPStrategy(activation_checkpointing_"
                     "policy=...); otherwise checkpoint the blocks in your LightningModule")
    line = optimizer_line(ran, "Lightning (configure_optimizers)")
    if line:
        notes.append(line)
    return {"trainer": {"precision": prec}}, notes + _common_lines(t, "Lightning")
