"""What TrainSetup checks on construction: aliases resolved, every choice and count validated, contradictions
refused, each in one line that names the problem and the fix (ValueError; the CLI turns it into exit code 2).

Each function takes the frozen setup being built and sets resolved values with object.__setattr__, as a frozen
dataclass's __post_init__ has to.
"""

from __future__ import annotations

import difflib
import math

from overdrive.formats import TE, find_format, planned_format, planned_presets
from overdrive.plan.choices import (ATTENTIONS, BANDWIDTH_GBS, BLOCK_CODES, CHECKPOINTING, GATHER_DTYPES,
                                    HOST_US_RANGE, GRAD_DTYPES, LOSSES, MASTER_WEIGHTS, MAX_COUNT, MIN_EFFICIENCY,
                                    OFFLOADS, NO_STEP, OPTIMIZER_ALIASES, OPTIMIZER_DTYPES, OPTIMIZERS, PRECISIONS,
                                    RECOMPUTE_MODULES, STATELESS, EIGHT_BIT, SHARDING_ALIASES, SHARDINGS,
                                    STACK_ALIASES, STACKS, UNFUSED_OPS)

__all__ = ["validate"]


def _flag(field: str) -> str:
    """The command-line flag of a TrainSetup field (gpus_per_node is --gpus)."""
    return "--gpus" if field == "gpus_per_node" else f"--{field.replace('_', '-')}"


def _choice(name: str, value: str, allowed: tuple[str, ...], fuzzy: bool = False) -> None:
    """Refuse a value outside `allowed`; the fix: the value it differs from by case (`fuzzy`: closest spelling)."""
    if value not in allowed:
        v = str(value).strip().lower()
        near = next((a for a in allowed if a == v), None) or (
            next(iter(difflib.get_close_matches(v, allowed, 1)), None) if fuzzy else None)
        raise ValueError(f"--{name} {value!r} is not one of {', '.join(allowed)}"
                         + (f": did you mean --{name} {near}?" if near else ""))


def _set(s, field: str, value) -> None:
    object.__setattr__(s, field, value)


def stack_lacks(stack: str, precision: str) -> str:
    """Why `stack` cannot run `precision` ('' if it can): the megatron stack runs low precision in Transformer
    Engine, and the format registry says what TE lacks (fp8-rowwise: no rowwise scaling)."""
    fmt = planned_format(precision)
    te = next((e for e in fmt.engines if e.backend == TE), None) if fmt and stack == "megatron" else None
    return te.unsupported if te is not None else ""


def validate(s) -> None:
    """Every check, in the order a user meets them: names, then numbers, then how they combine."""
    _resolve_names(s)
    _check_zero_sliced(s)   # before the generic checks: their fixes would lead into this one's refusals
    _check_recompute(s)
    _check_counts(s)
    _check_rates(s)
    _check_layout(s)
    _check_precision_and_steps(s)
    _check_no_step(s)


def _check_zero_sliced(s) -> None:
    """--zero-sliced plans nanotron's ZeRO-1 as its benchmarks ran it (eager bf16/fp16 model, fp32 gradient
    accumulation, AdamW or plain SGD with fp32 states, whole-block recompute at most; trainer.py, helpers.py,
    config.py @ c252843): what nanotron does not have is refused, each with the flag the user gave and its fix."""
    if not s.zero_sliced:
        return
    what, fix = next(((w, f) for on, w, f in (
        (s.stack != "pytorch", f"--stack {s.stack}", "use --stack pytorch"),
        (s.zero_broadcast or s.deepspeed_pipeline or not s.zero_init,
         "--zero-broadcast" if s.zero_broadcast else "--deepspeed-pipeline" if s.deepspeed_pipeline
         else "--no-zero-init", "another stack's ZeRO: drop it"),
        (s.sharding != "zero1", f"--sharding {s.sharding}", "use --sharding zero1"),
        (not s.overlap_grad_reduce, "--no-overlap-grad-reduce", "Megatron's option: drop it"),
        (s.compile, "torch.compile", "nanotron runs eager: add --no-compile (and --fused-kernels for its Triton "
                                     "norms and rotary)"),
        (s.precision not in ("bf16", "fp16"), f"--precision {s.precision}",
         "its fp32 accumulator takes a 16-bit model: use --precision bf16"),
        (s.pure_bf16, "--pure-bf16", "planned with accumulate_grad_in_fp32 (its benchmarks' setting): drop it"),
        (s.master_weights != "fp32", f"--master-weights {s.master_weights}", "use --master-weights fp32"),
        (s.grad_dtype != "fp32", f"--grad-dtype {s.grad_dtype}", "planned with accumulate_grad_in_fp32 (its "
                                                                 "benchmarks' setting): use --grad-dtype fp32"),
        (s.optimizer not in ("adamw", "sgd-nomomentum", NO_STEP), f"--optimizer {s.optimizer}",
         "nanotron has AdamW and plain SGD: use --optimizer adamw"),
        (s.optimizer_dtype != "fp32", f"--optimizer-dtype {s.optimizer_dtype}", "its states are fp32: drop it"),
        (s.lora_rank, "--lora-rank", "nanotron trains the full model: drop --lora-rank"),
        (s.optimizer == NO_STEP or s.optimizer_in_backward, "--optimizer none" if s.optimizer == NO_STEP
         else "--optimizer-in-backward", "nanotron steps after the backward: drop it"),
        (s.cp > 1, f"--cp {s.cp}", "nanotron of that commit has no context parallelism: drop --cp"),
        (s.offload != "none", f"--offload {s.offload}", "nanotron does not offload: drop --offload"),
        (s.checkpointing not in ("none", "full") or s.recompute_layers or s.recompute_modules,
         f"--checkpointing {s.checkpointing}" if s.checkpointing not in ("none", "full") else "Megatron's recompute",
         "nanotron recomputes whole blocks (recompute_layer): use --checkpointing none or full")) if on), ("", ""))
    if what:
        raise ValueError(f"--zero-sliced plans nanotron's ZeRO-1, which does not run with {what}: {fix}, or drop "
                         "--zero-sliced")


def _check_no_step(s) -> None:
    """--optimizer none: a forward-and-backward benchmark under DDP's/FSDP's no_sync; nothing else skips the step."""
    if s.optimizer != NO_STEP:
        return
    what, fix = next(((w, f) for on, w, f in (
        (s.sharding not in ("none", "fsdp", "hsdp"), f"--sharding {s.sharding}",
         "DeepSpeed's ZeRO and Megatron's distributed optimizer reduce their gradients in the backward: use --sharding "
         "none, fsdp or hsdp"),
        (s.stack != "pytorch", f"--stack {s.stack}", "Megatron reduces its gradients in its own buffers: use --stack "
                                                     "pytorch"),
        (s.deepspeed_pipeline, "--deepspeed-pipeline", "DeepSpeed's PipelineEngine reduces after every flush: drop it"),
        (s.pp > 1, f"--pp {s.pp}", "pipelining syncs the gradients at the last micro-batch: drop --pp"),
        (s.offload != "none", f"--offload {s.offload}", "CPU offload plans where the states and the step live: drop it"),
        (s.optimizer_in_backward, "--optimizer-in-backward", "that steps in the backward: drop it")) if on), ("", ""))
    if what:
        raise ValueError(f"--optimizer none (forward and backward under DDP's/FSDP's no_sync, no step, no gradient "
                         f"reduction) does not run with {what}: {fix}, or name the optimizer that steps")


def _resolve_optimizer(s) -> None:
    if s.optimizer in OPTIMIZER_ALIASES:
        fam, dt = OPTIMIZER_ALIASES[s.optimizer]
        if dt and s.optimizer_dtype not in ("fp32", dt):
            raise ValueError(f"--optimizer {s.optimizer} keeps its states in {dt} but --optimizer-dtype is "
                             f"{s.optimizer_dtype}: keep one")
        _set(s, "optimizer", fam)
        if dt:
            _set(s, "optimizer_dtype", dt)
    if s.optimizer not in OPTIMIZERS:
        raise ValueError(f"--optimizer {s.optimizer!r} is not one of {', '.join(OPTIMIZERS + tuple(OPTIMIZER_ALIASES))}")
    dt = s.optimizer_dtype
    if s.optimizer in STATELESS and dt == "bf16" and s.pure_bf16:   # the dtype pure bf16 gave states there are none of
        _set(s, "optimizer_dtype", dt := "fp32")
    if s.optimizer in STATELESS and dt != "fp32" or dt == "8bit" and s.optimizer not in EIGHT_BIT:
        bits = "8 bits" if dt == "8bit" else dt
        what = (f"it keeps no state to store in {bits}" if s.optimizer in STATELESS else
                f"its factored second moment (a few millionths of the parameters) is counted as none: nothing to "
                f"store in {bits}")
        raise ValueError(f"--optimizer-dtype {dt} with --optimizer {s.optimizer}: {what}; drop --optimizer-dtype")
    _choice("master-weights", s.master_weights, MASTER_WEIGHTS)
    if s.master_weights == "none" and not s.pure_bf16:
        _set(s, "pure_bf16", True)
    elif s.pure_bf16 and s.master_weights == "remainder":
        raise ValueError("--pure-bf16 keeps no master weights and --master-weights remainder keeps their low "
                         "bits: keep one")
    elif s.pure_bf16:
        _set(s, "master_weights", "none")
    if s.pure_bf16 and s.optimizer_dtype == "fp32" and s.optimizer not in STATELESS:
        _set(s, "optimizer_dtype", "bf16")   # the states take the weights' dtype: labels say what is counted


def _resolve_names(s) -> None:
    """Aliases to their names (ddp → none, adamw-8bit → adamw + 8bit states, nemo → megatron), then each choice."""
    _set(s, "sharding", SHARDING_ALIASES.get(s.sharding, s.sharding))
    v = str(s.precision).strip().lower().replace("_", "-")
    spelled = find_format(v)   # a format's name, alias or scaling; not its bits alone ("fp4" names no format)
    if spelled is not None and spelled.plan_bytes is not None and (v != spelled.bits or v == spelled.preset):
        _set(s, "precision", spelled.preset)
    _choice("precision", s.precision, (*PRECISIONS[:3], *planned_presets()), fuzzy=True)
    _choice("sharding", s.sharding, SHARDINGS)
    _choice("checkpointing", s.checkpointing, CHECKPOINTING)
    _choice("optimizer-dtype", s.optimizer_dtype, OPTIMIZER_DTYPES)
    _resolve_optimizer(s)
    _choice("offload", s.offload, OFFLOADS)
    _choice("loss", s.loss, LOSSES)
    _set(s, "stack", STACK_ALIASES.get(s.stack, s.stack))
    if s.stack not in STACKS:
        raise ValueError(f"--stack {s.stack!r} is not one of {', '.join(STACKS)} (pytorch: FSDP2/torchtitan/"
                         "Hugging Face; megatron: Megatron-Core/NeMo with Transformer Engine)")
    if s.loss == "megatron-v07" and s.stack != "megatron":
        raise ValueError(f"--loss megatron-v07 is Megatron-Core's own cross-entropy (versions 0.1-0.7), not the "
                         f"{s.stack} stack's: add --stack megatron, or pick a --loss of {s.stack}'s")
    if s.stack == "megatron" and not s.compile:
        raise ValueError("--no-compile with --stack megatron: Megatron's kernels are fused by Transformer Engine, "
                         "there is no eager mode to plan; drop --no-compile or use --stack pytorch")
    _choice("grad-dtype", s.grad_dtype, GRAD_DTYPES)
    if s.block_code and s.block_code not in BLOCK_CODES:
        raise ValueError(f"--block-code {s.block_code!r} is not one of {', '.join(BLOCK_CODES)}")
    if s.block_code and s.stack != "pytorch":
        raise ValueError(f"--block-code {s.block_code} counts a PyTorch Llama block's activations: it needs "
                         "--stack pytorch (Megatron's blocks are Transformer Engine's)")
    _choice("attention", s.attention, ATTENTIONS)
    if s.attention == "fa3" and s.gpu.sm[0] != 9:
        raise ValueError(f"--attention fa3: FlashAttention-3's kernels are Hopper's (sm90), and {s.gpu.key} is "
                         f"sm{s.gpu.sm[0]}{s.gpu.sm[1]}: use --attention cudnn or fa2 (or flash, the stack's own)")
    if s.attention == "fa1" and s.gpu.sm[0] not in (8, 9):
        raise ValueError(f"--attention fa1: FlashAttention 1.x's kernels are Ampere's (sm80, run on Hopper as they "
                         f"are), and {s.gpu.key} is sm{s.gpu.sm[0]}{s.gpu.sm[1]}: use --attention flash (the stack's "
                         "own kernel)")
    if s.attention in ("fa1", "triton") and s.cp > 1:
        # torch's ring attention calls SDPA's kernels, Transformer Engine's context parallelism its own
        raise ValueError(f"--attention {s.attention} with --cp {s.cp}: context parallelism's ring attention calls "
                         "SDPA's or Transformer Engine's kernels, not this one: use --attention fa2 or cudnn")
    if s.attention == "triton" and s.gpu.sm[0] not in (8, 9):
        raise ValueError(f"--attention triton: FlashAttention's 2022 Triton kernel runs on the pre-MLIR Triton "
                         f"compiler, which targets Ampere/Ada (sm8x) and Hopper (sm90), and {s.gpu.key} is "
                         f"sm{s.gpu.sm[0]}{s.gpu.sm[1]}: use --attention flash (the stack's own kernel)")
    if s.gather_dtype and s.gather_dtype not in GATHER_DTYPES:
        raise ValueError(f"--gather-dtype {s.gather_dtype!r} is not one of {', '.join(GATHER_DTYPES)}")


def _check_recompute(s) -> None:
    """Megatron's recompute and offload options: named modules once each, one way to choose what to recompute."""
    if isinstance(s.recompute_modules, (list, str)):
        mods = s.recompute_modules.split(",") if isinstance(s.recompute_modules, str) else s.recompute_modules
        _set(s, "recompute_modules", tuple(x.strip() for x in mods if x.strip()))
    if len(set(s.recompute_modules)) != len(s.recompute_modules):  # "mlp,mlp": once, as Megatron does
        _set(s, "recompute_modules", tuple(dict.fromkeys(s.recompute_modules)))
    for mod in s.recompute_modules:
        _choice("recompute-modules", mod, RECOMPUTE_MODULES)
    for name in ("recompute_layers", "offload_activations"):
        v = getattr(s, name)
        if not isinstance(v, int) or v < 0:
            raise ValueError(f"--{name.replace('_', '-')} must be a number of blocks >= 0, got {v}")
    _check_unfused(s)
    if s.recompute_modules and s.checkpointing != "none":
        # Megatron recomputes either named parts of every block or whole blocks; both would count twice
        raise ValueError(f"--recompute-modules {','.join(s.recompute_modules)} and --checkpointing "
                         f"{s.checkpointing} both choose what to recompute: keep one")
    if s.recompute_layers and s.checkpointing != "none":
        raise ValueError(f"--recompute-layers {s.recompute_layers} and --checkpointing {s.checkpointing} "
                         "both choose what to recompute: keep one")
    if s.offload_activations and s.pp > 1:
        raise ValueError("--offload-activations needs --pp 1 (Megatron has no activation offload with "
                         "pipeline parallelism)")


def _check_unfused(s) -> None:
    """--unfused-ops: a comma list of UNFUSED_OPS, once each, for what pre-Transformer-Engine Megatron-LM could run."""
    ops = s.unfused_ops.split(",") if isinstance(s.unfused_ops, str) else s.unfused_ops or ()
    if isinstance(s.unfused_ops, str) and s.unfused_ops.strip() and not "".join(ops).strip():
        raise ValueError(f"--unfused-ops {s.unfused_ops!r} names no op: give a comma list of {', '.join(UNFUSED_OPS)}")
    if not isinstance(ops, (list, tuple)) or not all(isinstance(x, str) for x in ops):
        raise ValueError(f"--unfused-ops {s.unfused_ops!r}: give a comma list of {', '.join(UNFUSED_OPS)}")
    _set(s, "unfused_ops", tuple(dict.fromkeys(x.strip() for x in ops if x.strip())))
    for op in s.unfused_ops:
        if op not in UNFUSED_OPS and any(c in op for c in "; +"):
            raise ValueError(f"--unfused-ops {op!r}: separate the ops with commas, e.g. rope,swiglu,attn-layout")
        _choice("unfused-ops", op, UNFUSED_OPS, fuzzy=True)
    if not s.unfused_ops:
        return
    if s.stack != "megatron":
        raise ValueError(f"--unfused-ops {','.join(s.unfused_ops)} names Megatron-LM's eager kernels: add --stack "
                         "megatron (on --stack pytorch, eager code is --no-compile)")
    if s.low_precision or s.cp > 1:
        what = f"--precision {s.precision}" if s.low_precision else f"--cp {s.cp}"
        raise ValueError(f"--unfused-ops with {what}: Megatron-LM before Transformer Engine, whose eager kernels "
                         "--unfused-ops plans, had neither FP8 nor context parallelism; drop one of them")
    if "attn-layout" in s.unfused_ops and s.attention not in ("fa1", "fa2", "triton"):
        raise ValueError(f"--unfused-ops attn-layout is the layout copies around a flash-attn kernel called from "
                         f"Python, not --attention {s.attention}: add --attention fa1 (or fa2), or drop attn-layout")


def _check_counts(s) -> None:
    """Positive integers, each small enough that every product of them stays an exact float."""
    if s.vpp is None and isinstance(s.pp, int) and s.pp == 1:
        _set(s, "vpp", 1)   # nothing to interleave
    for name in ("gpus_per_node", "nodes", "seq", "micro_batch", "tp", "pp", "vpp", "cp"):
        v = getattr(s, name)
        if name == "vpp" and v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{_flag(name)} must be a positive integer, got {v}")
    for name in ("gpus_per_node", "nodes", "seq", "micro_batch", "global_batch", "lora_rank"):
        v = getattr(s, name)
        if v is not None and v > MAX_COUNT:
            raise ValueError(f"{_flag(name)} {v} is too large (at most {MAX_COUNT:,})")
    if not s.overlap_grad_reduce and s.offload == "params":
        raise ValueError("--no-overlap-grad-reduce plans Megatron's DDP/distributed optimizer, --offload params needs "
                         "FSDP: drop one of them (--offload optimizer goes with the distributed optimizer)")
    if s.offload == "params" and not s.shards_weights:
        raise ValueError(f"--offload params needs sharded weights (--sharding fsdp/hsdp/zero3), not {s.sharding}: "
                         "parameters are offloaded per shard; with ZeRO-1/2 or DDP use --offload optimizer")
    if s.lora_rank < 0:
        raise ValueError(f"--lora-rank must be >= 0, got {s.lora_rank}")
    if isinstance(s.doc_len, bool) or not isinstance(s.doc_len, int) or s.doc_len < 0:   # > seq: cut at it
        raise ValueError(f"--doc-len must be a whole number of tokens, got {s.doc_len}")
    if s.global_batch is not None and s.global_batch < 1:
        raise ValueError(f"--global-batch must be a positive number of sequences, got {s.global_batch}")


def _check_rates(s) -> None:
    """Efficiency and overlap are fractions; link speeds are per GPU, in GB/s, within what any link runs."""
    if s.efficiency is not None and not MIN_EFFICIENCY <= s.efficiency <= 1:
        raise ValueError(f"--efficiency is a fraction of peak in [{MIN_EFFICIENCY}, 1], got {s.efficiency}")
    if not 0 <= s.overlap <= 1:
        raise ValueError(f"overlap is a fraction in [0, 1], got {s.overlap}")
    for name in ("intra_gbs", "inter_gbs"):
        v = getattr(s, name)
        if v is not None and not (0 < v < math.inf):
            raise ValueError(f"--{name.replace('_', '-')} must be a positive bandwidth in GB/s, got {v}")
        if v is not None and not BANDWIDTH_GBS[0] <= v <= BANDWIDTH_GBS[1]:
            raise ValueError(f"--{name.replace('_', '-')} {v} GB/s is outside {BANDWIDTH_GBS[0]}-"
                             f"{BANDWIDTH_GBS[1]:,} GB/s: give the per-GPU link speed in GB/s")
    if s.host_us is not None and not HOST_US_RANGE[0] <= s.host_us <= HOST_US_RANGE[1]:   # NaN fails both
        raise ValueError(f"--host-us {s.host_us} is outside {HOST_US_RANGE[0]}-{HOST_US_RANGE[1]:g} µs: give the "
                         "host's µs per eager op (scripts/host_us_published.py --device cuda measures it)")


def _check_layout(s) -> None:
    """The parallel degrees against the GPUs, the sequence and the batch."""
    if s.world % (s.tp * s.pp * s.cp):
        raise ValueError(f"tp {s.tp} x pp {s.pp} x cp {s.cp} does not divide the {s.world} GPUs "
                         f"({s.nodes} x --gpus {s.gpus_per_node}): pick degrees whose product divides it")
    if s.tp > s.gpus_per_node and s.tp % s.gpus_per_node:
        # across nodes TP takes whole nodes (its cost is the inter-node link, comm.py)
        raise ValueError(f"--tp {s.tp} spans nodes but is not a multiple of the {s.gpus_per_node} GPUs per "
                         f"node: use a tp that divides {s.gpus_per_node} or is a multiple of it")
    if s.gather_dtype and s.fp8_all_gather:
        raise ValueError(f"--gather-dtype {s.gather_dtype} and --fp8-all-gather both set the all-gather "
                         "dtype: keep one")
    if s.fp8_all_gather and s.stack == "megatron" and s.sharding == "none":
        # megatron/training/arguments.py validate_args: "--fp8-param-gather only supported with distributed
        # optimizer, torch fsdp2, megatron fsdp, or inference mode" (the quantised parameters are refreshed from
        # the distributed optimizer's master shards)
        raise ValueError("--fp8-all-gather on --stack megatron is Megatron's --fp8-param-gather, which needs the "
                         "distributed optimizer or FSDP: use --sharding zero1 or fsdp, or drop the flag")
    if s.cp > 1 and s.seq % (2 * s.cp):
        # Transformer Engine's ring attention splits each rank's share in two halves for causal load balance
        # ("Sequence length per GPU needs to be divisible by 2!"), so the sequence divides by 2·cp
        raise ValueError(f"--seq {s.seq} is not divisible by 2 x --cp {s.cp}: ring attention gives each "
                         f"rank two halves, use a multiple of {2 * s.cp}")
    gathers_other = s.gather_dtype and not (s.gather_dtype == "bf16" and s.precision not in ("fp16", "fp32"))
    if s.sharding == "zero3" and (s.pp > 1 or s.fp8_all_gather or gathers_other or s.stack != "pytorch"):
        # deepspeed/runtime/pipe/engine.py refuses ZeRO-2/3 under its PipelineEngine; stage3.py gathers the 16-bit
        # partitions in the model dtype; Megatron-Core's optimizers are its own
        what, why, fix = (
            ("--pp > 1", "DeepSpeed's PipelineEngine refuses ZeRO-2 and ZeRO-3", "--sharding zero1 with the pipeline")
            if s.pp > 1 else
            (f"--stack {s.stack}", "Megatron-Core shards with its own distributed optimizer, not DeepSpeed's",
             "--sharding zero1 (its distributed optimizer) or fsdp")
            if s.stack != "pytorch" else
            ("--fp8-all-gather" if s.fp8_all_gather else f"--gather-dtype {s.gather_dtype}",
             "DeepSpeed gathers its 16-bit partitions in the model's dtype", "--sharding fsdp (FSDP2)"))
        raise ValueError(f"--sharding zero3 (DeepSpeed ZeRO-3) does not run with {what}: {why}; use {fix}"
                         + (", without --no-zero-init (a ZeRO-3 flag)" if not s.zero_init else "")
                         + f", or drop {what.split()[0]}")
    if not s.zero_init and s.sharding != "zero3":
        raise ValueError(f"--no-zero-init plans DeepSpeed ZeRO-3 given a model built whole, not --sharding {s.sharding}: "
                         "plan --sharding zero3 alone, or drop the flag")
    if s.deepspeed_pipeline and s.sharding not in ("none", "zero1"):
        # deepspeed/runtime/pipe/engine.py: "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism"
        raise ValueError(f"--deepspeed-pipeline with --sharding {s.sharding}: DeepSpeed's PipelineEngine refuses "
                         "ZeRO-2/3, use --sharding zero1 or none")
    if s.zero_broadcast and (s.sharding != "zero1" or s.stack != "pytorch" or s.deepspeed_pipeline):
        raise ValueError(f"--zero-broadcast is ZeRO-1 as InternLM and torch's ZeroRedundancyOptimizer run it "
                         f"(gradients all-reduced, weights broadcast by their owners), not --stack {s.stack} "
                         f"--sharding {s.sharding}"
                         f"{' --deepspeed-pipeline' if s.deepspeed_pipeline else ''}: use --stack pytorch "
                         "--sharding zero1, or drop the flag")
    if s.zero_broadcast and (s.lora_rank or s.optimizer_in_backward):
        raise ValueError("--zero-broadcast plans a full-model ZeRO-1 step (InternLM's, torch's), not "
                         f"{'--lora-rank' if s.lora_rank else '--optimizer-in-backward'}: drop one")
    if not s.overlap_grad_reduce and (s.stack != "megatron" or s.sharding not in ("zero1", "none")):
        what = f"--stack {s.stack}" if s.stack != "megatron" else f"--sharding {s.sharding}"   # the one that is not
        raise ValueError(f"--no-overlap-grad-reduce is Megatron's DDP/distributed-optimizer option; {what} is not "
                         "that: use --stack megatron with --sharding zero1 or none, or drop the flag")
    if not s.overlap_grad_reduce and s.deepspeed_pipeline:
        raise ValueError("--no-overlap-grad-reduce with --deepspeed-pipeline: DeepSpeed's PipelineEngine reduces "
                         "after the pipeline flush already (Megatron's flag is not its): drop --no-overlap-grad-reduce")
    if s.dropout and s.block_code:
        raise ValueError(f"--dropout with --block-code {s.block_code}: that Llama block has no hidden dropout "
                         "(and transformers' attention_dropout is 0 unless set): drop --dropout")
    if s.sharding == "zero2" and s.stack == "megatron" and s.vpp is not None and s.vpp > 1:
        # Megatron-Core has no ZeRO-2; Megatron-LLaMA's overlapped optimizer runs in the non-interleaved schedules
        # only (its interleaved one never calls backward_epilogue)
        raise ValueError(f"--sharding zero2 on --stack megatron (Megatron-LLaMA's overlapped distributed optimizer) "
                         f"with --vpp {s.vpp}: it has no interleaved schedule; drop --vpp or use --sharding zero1")
    if s.deepspeed_pipeline and s.vpp is not None and s.vpp > 1:
        raise ValueError(f"--deepspeed-pipeline with --vpp {s.vpp}: DeepSpeed's PipelineEngine has no interleaved "
                         "schedule, drop --vpp")
    if s.vpp is not None and s.vpp > 1 and s.pp == 1:
        raise ValueError("--vpp needs --pp > 1 (virtual stages interleave a pipeline)")
    if s.global_batch is not None and s.global_batch % (s.micro_batch * s.dp):
        raise ValueError(f"global batch {s.global_batch} is not divisible by micro-batch {s.micro_batch} "
                         f"x {s.dp} data-parallel ranks: use a multiple of {s.micro_batch * s.dp}")


def _check_precision_and_steps(s) -> None:
    """The master weights against the precision, and what stepping in the backward rules out."""
    if s.pure_bf16 and s.precision == "fp32":
        raise ValueError("--pure-bf16 (--master-weights none) contradicts --precision fp32")
    if s.master_weights == "remainder" and s.precision in ("fp32", "fp16"):
        raise ValueError(f"--master-weights remainder rebuilds fp32 from bf16 weights, not {s.precision} ones: "
                         "use --precision bf16 (or fp8 and the like, whose weights are bf16)")
    fmt = planned_format(s.precision)
    if fmt is not None and fmt.te_eager_only and s.stack == "pytorch" and s.compile:
        raise ValueError(f"--precision {s.precision} is Transformer Engine's delayed scaling, which does not run "
                         "under torch.compile: add --no-compile (--fused-kernels too for hand-fused code), or plan "
                         "--precision fp8 (current scaling)")
    if stack_lacks(s.stack, s.precision):
        raise ValueError(f"--precision {s.precision} with --stack megatron: {stack_lacks(s.stack, s.precision)}; "
                         f"use --stack pytorch or a precision Transformer Engine runs")
    if s.optimizer_in_backward:
        if s.global_batch is not None and s.grad_accum > 1:
            raise ValueError(f"--optimizer-in-backward steps each parameter in its backward, so it needs one "
                             f"micro-batch per step, not {s.grad_accum}: drop --global-batch or the flag")
        if s.pp > 1 or s.lora_rank or s.offload != "none":
            raise ValueError("--optimizer-in-backward is planned for single-stage full fine-tuning without "
                             "offload (torchtune's optimizer_in_bwd): drop it with --pp, --lora-rank or --offload")
