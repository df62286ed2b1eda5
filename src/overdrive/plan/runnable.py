"""What of a planned configuration Overdrive itself runs: the recipe name and the accelerate(...) call, and
each remaining part named as another stack's feature (never recommended as if Overdrive ran it).

Every recipe name written here parses with `overdrive.recipes.get_recipe` (accelerate() and `overdrive train`
take the same names); tests/unit/test_plan_runnable.py checks that for every option the planner can pick.
"""

from __future__ import annotations

from overdrive.formats import FORMATS, find_format
from overdrive.plan.choices import EIGHT_BIT, OPTIMIZER_NAMES

__all__ = ["how_to_run", "PRECISION_PRESET", "not_in_overdrive"]

PRECISION_PRESET = {"fp32": "fp32", "bf16": "amp-bf16", "fp16": "amp-fp16",
                    **{f.preset: f.preset for f in FORMATS.values()}}
"""Planner precision -> the recipe preset that trains that way."""
_CKPT_KNOB = {"none": "", "selective": "+ckpt-selective", "full": "+ckpt", "selective-op": "+ckpt-selective"}
_OTHER_OPTIMIZER = {"lion": "lion-pytorch's Lion", "sgd": "torch.optim.SGD(momentum=0.9)",
                    "sgd-nomomentum": "torch.optim.SGD (momentum 0)", "adafactor": "transformers' Adafactor"}


def not_in_overdrive(c: dict) -> list[str]:
    """The parts of a planned configuration (a plan() candidate dict) no Overdrive recipe runs, each with whose
    feature it is and, where there is one, the nearest Overdrive setting."""
    out = []
    if c.get("stack") == "megatron":
        out.append("--stack megatron plans Megatron-Core/NeMo with Transformer Engine, another stack: run it there")
    if c.get("deepspeed_pipeline"):
        out.append("--deepspeed-pipeline plans DeepSpeed's PipelineEngine (Megatron-DeepSpeed), another stack: run "
                   "it there")
    if c.get("zero_broadcast") and c.get("grad_dtype") == "bf16":
        out.append("--zero-broadcast plans InternLM's Hybrid ZeRO trainer, another stack: run it there")
    elif c.get("zero_broadcast"):
        out.append("--zero-broadcast with fp32 gradients plans torch's ZeroRedundancyOptimizer beside DDP, not an "
                   "Overdrive recipe: pass it as accelerate(optimizer=...) with distributed=\"ddp\"")
    if c.get("zero_sliced"):
        out.append("--zero-sliced plans nanotron's ZeRO-1 (its own trainer), another stack: run it there")
    sh = c.get("sharding", "fsdp")
    if sh in ("zero1", "zero2") and not (c.get("zero_broadcast") or c.get("zero_sliced")):
        out.append(f"{sh} (a sharded optimizer without sharded weights) is Megatron-Core's distributed optimizer "
                   "or DeepSpeed's ZeRO, not Overdrive's: distributed=\"fsdp\" is the nearest (it also shards "
                   "the weights)")
    if sh == "zero3":
        out.append("zero3 is DeepSpeed's ZeRO stage 3 (weights gathered module by module), another stack: "
                   "distributed=\"fsdp\" (FSDP2, block by block) is Overdrive's nearest")
    if sh == "hsdp":
        out.append("hsdp (FSDP within a node, replicas across) is FSDP2's 2-D mesh in torchtitan, not accelerate()'s:"
                   " distributed=\"fsdp\" shards over every GPU")
    for k, who in (("tp", "tensor parallelism"), ("pp", "pipeline parallelism"), ("cp", "context parallelism")):
        if (c.get(k) or 1) > 1:
            out.append(f"{k} {c[k]}: {who} is Megatron-Core's or torchtitan's, not Overdrive's")
    if c.get("checkpointing") == "selective-op":
        out.append("selective-op checkpointing is torchtitan's per-op policy: Overdrive's nearest is "
                   "+ckpt-selective (every 2nd block)")
    o = c.get("optimizer", "adamw")
    if c.get("optimizer_dtype") == "8bit":
        out.append(f"8-bit {OPTIMIZER_NAMES[o]} states: no Overdrive recipe; pass {EIGHT_BIT[o]} as "
                   "accelerate(optimizer=lambda params: ...)")
    elif c.get("optimizer_dtype") == "bf16" and c.get("master_weights") != "none":   # pure bf16: said below
        out.append(f"bf16 {OPTIMIZER_NAMES[o]} states: no Overdrive recipe (an optimizer that keeps them in bf16, "
                   "e.g. torchao.optim's AdamW with bf16 states, passed as accelerate(optimizer=...))")
    if c.get("optimizer") == "none":
        out.append("no optimizer step: a forward-and-backward benchmark under no_sync, not training; the recipes "
                   "build AdamW and step it")
    if c.get("optimizer") in _OTHER_OPTIMIZER:
        out.append(f"{c['optimizer']}: pass {_OTHER_OPTIMIZER[c['optimizer']]} as accelerate(optimizer=...); the "
                   "recipes build AdamW")
    if c.get("master_weights") == "none":
        out.append("pure bf16 (no fp32 master weights) is llm-foundry's PURE / torchtune's bf16 dtype, not an "
                   "Overdrive recipe: the amp-bf16 recipe keeps fp32 weights")
    elif c.get("master_weights") == "remainder":
        out.append("master remainders are Apex's / Transformer Engine's FusedAdam(store_param_remainders), not "
                   "an Overdrive recipe")
    for key, text in (("optimizer_in_backward", "optimizer in backward is torchtune's optimizer_in_bwd"),
                      ("lora_rank", "LoRA is PEFT's or torchtune's"),
                      ("recompute_layers", "--recompute-layers is Megatron's block recompute"),
                      ("recompute_modules", "--recompute-modules is Megatron's selective recompute"),
                      ("offload_activations", "activation offload is Megatron's/Transformer Engine's")):
        if c.get(key):
            out.append(f"{text}, not an Overdrive recipe")
    if c.get("offload", "none") != "none":
        out.append(f"offload {c['offload']} is FSDP2's CPUOffloadPolicy or DeepSpeed's, not accelerate()'s")
    return out


def how_to_run(c: dict, *, gpus_per_node: int = 1, nodes: int = 1, grad_accum: int = 1) -> dict:
    """{recipe, call, launch, not_in_overdrive}: the Overdrive recipe name and accelerate(...) call that train a
    planned candidate, the launch line, and what of the candidate Overdrive does not run (not_in_overdrive)."""
    from overdrive.recipes import get_recipe

    prec = c.get("precision", "bf16")
    fmt = find_format(prec)
    name = fmt.preset if fmt is not None else PRECISION_PRESET.get(prec, "amp-bf16")
    if c.get("compile", True) and c.get("stack", "pytorch") == "pytorch":
        name += "+compile"   # the plan's pytorch stack is compiled unless --no-compile
    name += _CKPT_KNOB.get(c.get("checkpointing", "none"), "")
    if c.get("loss") == "fused":
        name += "+fused-ce"
    name = get_recipe(name).name   # the registry's own spelling: what report() and train print back
    world = gpus_per_node * nodes
    sh = c.get("sharding", "fsdp")
    dist = None if world == 1 else ("ddp" if sh == "none" else "fsdp")
    args = [f'recipe="{name}"'] + ([f'distributed="{dist}"'] if dist else []) + \
        ([f"grad_accum_steps={grad_accum}"] if grad_accum > 1 else [])
    call = f"acc = overdrive.accelerate(model, {', '.join(args)})"
    launch = ("python train.py" if world == 1 else f"torchrun --nproc_per_node={gpus_per_node}"
              + (f" --nnodes={nodes}" if nodes > 1 else "") + " train.py")
    gaps = not_in_overdrive(c)
    return {"recipe": name, "call": call, "launch": launch, "micro_batch": c.get("micro_batch"),
            "seq": c.get("seq"), "not_in_overdrive": gaps, "other_stack": bool(gaps)}
