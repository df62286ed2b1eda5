"""`overdrive plan` — argument parsing and printing only; the work is in overdrive.plan."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import tempfile

from overdrive.errors import UserError
from overdrive.io import check_writable


def _check_writable(path: str) -> None:
    """Refuse an output path we could not write, before any work (nothing computed is lost)."""
    d = os.path.dirname(os.path.abspath(path)) or "."
    if not os.path.isdir(path) and not path.lower().endswith(".png"):
        # matplotlib picks the format from the suffix: "x.txt" fails after the work, "x" is written as "x.png"
        raise UserError(f"--png {path}: give a file name ending in .png")
    if os.path.isdir(path):
        raise UserError(f"--png {path} is a directory: give a file name such as {os.path.join(path, 'plan.png')}")
    if not os.path.isdir(d):
        raise UserError(f"--png {path}: folder {d} does not exist: create it or pick another path")
    try:  # a real write, as os.access says yes to root on read-only mounts and /proc
        with tempfile.NamedTemporaryFile(dir=d, suffix=".png"):
            pass
        if os.path.exists(path):
            with open(path, "ab"):
                pass
    except OSError as e:
        raise UserError(f"--png {path} is not writable ({e.strerror}): pick a path in a folder you can write") from None


DEFAULT_MODEL, DEFAULT_VOCAB = "llama3-8b", 128256
_CUSTOM_DIMS = ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "tied", "gelu_mlp", "squared_relu",
                "learned_pos", "bias", "head_dim")
_SWEEP_FLAGS = ("sweep", "json", "markdown", "png", "func", "verbose")
"""What --sweep reads; it runs its own grid, so any other flag set would be silently ignored."""
_DEFAULTS: dict = {}


def _model(args):
    from overdrive.plan.specs import MAX_DIM, ModelSpec, get_model

    custom = [f"--{n.replace('_', '-')}" for n in _CUSTOM_DIMS if getattr(args, n) not in (None, False)]
    if args.model is not None and custom:
        raise ValueError(f"--model {args.model} and {' '.join(custom)} both give the model: keep one")
    if args.layers is None and custom:
        raise ValueError(f"{' '.join(custom)} describe a custom model: add --layers, --hidden and --heads")
    if args.layers is None:
        return get_model(args.model or DEFAULT_MODEL)
    if args.gelu_mlp and args.squared_relu:
        raise ValueError("--gelu-mlp and --squared-relu both name the MLP's activation: keep one")
    for name in ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "learned_pos", "head_dim"):
        v = getattr(args, name)
        if v is not None and not 1 <= v <= MAX_DIM:
            raise ValueError(f"--{name.replace('_', '-')} must be a positive integer up to {MAX_DIM:,}, got {v}")
    if not (args.hidden and args.heads):
        raise ValueError("custom dims need --layers, --hidden and --heads (--help lists the optional ones)")
    if (odd := args.hidden % args.heads and not args.head_dim) or args.heads % (args.kv_heads or args.heads):
        raise ValueError((f"--hidden {args.hidden} must divide by --heads {args.heads}, or give --head-dim" if odd else
                          f"--heads {args.heads} must divide by --kv-heads {args.kv_heads}") + ": pick dims that divide")
    return ModelSpec(name="custom", n_layer=args.layers, hidden=args.hidden, n_head=args.heads,
                     n_kv_head=args.kv_heads or args.heads, ffn=args.ffn or 4 * args.hidden,
                     vocab=args.vocab or DEFAULT_VOCAB,
                     tied=args.tied, gated_mlp=not (args.gelu_mlp or args.squared_relu), squared_relu=args.squared_relu,
                     learned_pos=args.learned_pos or 0, bias=args.bias, attn_head_dim=args.head_dim or 0)


def _check_flags(args: argparse.Namespace) -> None:
    """Flags that contradict each other or go with another flag, refused before any work."""
    if args.markdown and not args.sweep:
        raise UserError("--markdown goes with --sweep (the plan's own table: --json, or --out for a report)")
    if args.out and args.sweep:
        raise UserError(f"--out {args.out} is not with --sweep: use --png for the sweep plot, or drop --sweep")
    if args.zero and args.sharding:
        raise UserError(f"--zero {args.zero} and --sharding {args.sharding} both choose the sharding: keep one")
    if args.calibrate is not None and args.efficiency is not None:
        raise UserError(f"--calibrate {args.calibrate} and --efficiency {args.efficiency} both set the GEMM "
                        "efficiency: keep one")
    if args.global_batch is not None and args.global_batch_tokens is not None:
        raise UserError(f"--global-batch {args.global_batch} and --global-batch-tokens {args.global_batch_tokens} "
                        "both set the global batch: keep one")
    if args.sweep:
        ignored = [f"--{k.replace('_', '-')}" for k, v in vars(args).items()
                   if k not in _SWEEP_FLAGS and k in _DEFAULTS and v != _DEFAULTS[k]]
        if ignored:
            raise UserError(f"--sweep runs its own grid (1B-64B on 8xB200/B300) and ignores {' '.join(ignored)}: "
                            "drop them, or drop --sweep to plan that setup")
    if args.png:
        _check_writable(args.png)
    if args.out:
        check_writable(args.out, flag="--out", create=False)   # before any work; made when the plan is written


def _run_sweep(args: argparse.Namespace, console) -> int:
    from overdrive.plan import sweep
    from overdrive.report.plan_view import render_sweep, sweep_markdown, write_sweep_png

    rows = sweep()
    if args.json or args.markdown:
        print(json.dumps({"sweep": rows}, indent=1) if args.json else sweep_markdown(rows))
    else:
        render_sweep(rows, console)
    if args.png:
        write_sweep_png(rows, args.png)
    return 0


_SAME_NAME = ("nodes", "seq", "tp", "pp", "vpp", "cp", "optimizer_dtype", "optimizer", "master_weights",
              "optimizer_in_backward", "fp8_all_gather", "intra_gbs", "inter_gbs", "host_us", "offload", "loss",
              "lora_rank", "pure_bf16", "fp8_activations", "recompute_layers", "offload_activations", "grad_dtype",
              "embedding_in_pipeline_split", "stack", "attention", "z_loss", "fused_kernels", "deepspeed_pipeline",
              "embed_norm", "dropout", "zero_broadcast", "zero_sliced", "pp_keep_outputs", "unfused_ops", "doc_len")
"""Flags whose value is the TrainSetup field of the same name."""


def _setup_kwargs(args: argparse.Namespace) -> dict:
    """The TrainSetup fields the flags give (ValueError for a contradiction)."""
    from overdrive.plan import calibrate_from_bench

    eff = calibrate_from_bench(args.calibrate) if args.calibrate is not None else args.efficiency
    gb = args.global_batch
    if args.async_tp and args.no_async_tp:
        raise ValueError("--async-tp and --no-async-tp contradict each other: keep one")
    if args.doc_len < 0:
        raise ValueError(f"--doc-len {args.doc_len}: give the documents' tokens (0: one document fills the sequence)")
    if args.fused_kernels and not args.no_compile:
        raise ValueError("--fused-kernels describes eager code: add --no-compile (compiled code fuses anyway)")
    if args.global_batch_tokens is not None:
        if args.global_batch_tokens < 1 or args.global_batch_tokens % args.seq:
            raise ValueError(f"--global-batch-tokens {args.global_batch_tokens} is not a multiple of "
                             f"--seq {args.seq} (or not positive)")
        gb = args.global_batch_tokens // args.seq
    setup = dict(**{k: getattr(args, k) for k in _SAME_NAME}, gpus_per_node=args.gpus, global_batch=gb,
                 efficiency=eff, compile=not args.no_compile, recompute_modules=args.recompute_modules or (),
                 async_tp=True if args.async_tp else (False if args.no_async_tp else None),
                 block_code=args.block_code or "", gather_dtype=args.gather_dtype or "",
                 sequence_parallel=args.sequence_parallel != "off",
                 sp_regather=True if args.sequence_parallel == "regather" else None,
                 overlap_grad_reduce=not args.no_overlap_grad_reduce, zero_init=not args.no_zero_init,
                 partition_activations=not args.no_partition_activations)
    if args.micro_batch is not None:
        setup["micro_batch"] = args.micro_batch
    return setup


def _search_lists(args: argparse.Namespace) -> dict:
    """--precision/--sharding/--checkpointing comma lists (None: search them all); --zero picks one sharding."""
    for flag, v in (("--precision", args.precision), ("--sharding", args.sharding),
                    ("--checkpointing", args.checkpointing)):  # '' meant "all of them", silently
        if v is not None and not all(x.strip() for x in v.split(",")):
            raise UserError(f"{flag} {v!r} names an empty value: pass a comma list without empty items, or leave "
                            f"{flag} out for all of them")
    shardings = args.sharding.split(",") if args.sharding else None
    if args.zero:
        shardings = [{1: "zero1", 2: "zero2", 3: "zero3"}[args.zero]]
    return {"precisions": args.precision.split(",") if args.precision else None, "shardings": shardings,
            "checkpointing": args.checkpointing.split(",") if args.checkpointing else None}


def _explain_top(r: dict, model, setup: dict, gpu) -> list[str]:
    """--explain: the pick's terms, re-planned from the precision asked (before "→"): the fallback's label kept."""
    from overdrive.plan import TrainSetup, estimate, explain

    e = r["top"] or r["candidates"][0]
    s = TrainSetup(gpu=gpu, **{**setup, "micro_batch": e["micro_batch"]},
                   precision=e["label"].split("→")[0], sharding=e["sharding"], checkpointing=e["checkpointing"])
    return explain(estimate(model, s))


def _cmd_plan(args: argparse.Namespace) -> int:
    from overdrive.env import gpu_by_key
    from overdrive.plan import plan
    from overdrive.report.console import wide_console
    from overdrive.report.plan_view import render_plan, write_breakdown_png

    _check_flags(args)
    console = wide_console()
    if args.sweep:
        return _run_sweep(args, console)
    try:
        model = _model(args)
        setup = _setup_kwargs(args)
        if args.qk_norm and not model.qk_norm:
            model = dataclasses.replace(model, qk_norm=True)
        gpu = gpu_by_key(args.gpu, mem_gib=args.gpu_mem)
        r = plan(model, gpu, min_headroom_gib=args.min_headroom, **_search_lists(args), **setup)
        lines = _explain_top(r, model, setup, gpu) if args.explain else []
    except ValueError as e:
        raise UserError(str(e)) from None
    if args.json:  # one JSON document on stdout, the explanation inside it
        print(json.dumps({**r, "explain": lines} if args.explain else r, indent=1))
    else:
        render_plan(r, console)
        _print_next_step(r, console)
        for line in lines:
            console.print(line, markup=False, highlight=False)
    if args.png:
        write_breakdown_png(r, args.png)
        if not args.json:
            console.print(f"wrote {args.png}", markup=False)
    if args.out:
        _write_out(r, args.out, console, quiet=args.json)
    return 0


def _print_next_step(r: dict, console) -> None:
    """How to train the pick with Overdrive (accelerate(...) in the user's script), and what of it is another
    stack's feature."""
    h = r.get("how_to_run")
    if not h:
        return
    lead = ("Next step (parts of the pick are not Overdrive's, below; the nearest in Overdrive)"
            if h.get("other_stack") else "Next step")
    console.print(f"{lead}: in your training script, {h['call']}  (micro-batch {h['micro_batch']}, sequence "
                  f"{h['seq']}); launch: {h['launch']}", markup=False, highlight=False)
    for gap in h["not_in_overdrive"]:
        console.print(f"  not run by Overdrive: {gap}", markup=False, highlight=False)


def _write_out(r: dict, out: str, console, *, quiet: bool) -> None:
    """--out DIR: plan.json, memory.png and report.html (the pick and how to run it first)."""
    from overdrive.io import write_atomic
    from overdrive.report.plan_html import write_plan_html
    from overdrive.report.plan_view import write_breakdown_png

    os.makedirs(out, exist_ok=True)
    write_atomic(os.path.join(out, "plan.json"), json.dumps(r, indent=1) + "\n")
    png = os.path.join(out, "memory.png")
    write_breakdown_png(r, png)
    page = write_plan_html(r, out, png=png)
    if not quiet:
        console.print(f"wrote {os.path.join(os.path.normpath(out), 'plan.json')}, memory.png and {page}", markup=False)


def _add_layout_args(a) -> None:
    """The model, the GPUs and the parallel layout."""
    a("--model", help=f"llama3-1b/3b/8b/70b/405b, llama2-13b/70b, gpt-64b, mpt-1b..70b, a reference GPT size, or a "
                      f"Hugging Face config.json or the folder holding it (default: {DEFAULT_MODEL})")
    a("--gpu", default="h100-sxm", help="gb300, gb200, b300, b200, h200, h200-nvl, h100-sxm, h100-96gb, h100-nvl, "
                                        "h100-pcie, h800, a100-80, a100-40, a800, l40s, l4, rtx4090")
    a("--gpus", type=int, default=8, help="GPUs per node")
    a("--gpu-mem", type=float, metavar="GIB", help="the GPU's memory in GiB where the board differs from the catalog "
      "(e.g. a DGX Station's GB300: 252)")
    a("--min-headroom", type=float, default=None, metavar="GIB",
      help="safety margin: configurations leaving less than GIB free rank after the rest (default: 10%% of the "
           "GPU's memory, about the memory estimate's worst error; 0 ranks by speed alone)")
    a("--nodes", type=int, default=1, help="number of nodes (GPUs in all = nodes x --gpus)")
    a("--seq", type=int, default=4096, help="sequence length in tokens")
    a("--doc-len", type=int, default=0, metavar="D",
      help="packed documents of about D tokens, each attending to itself only (varlen / document-masked attention); "
           "0: one document a sequence; longer than --seq: cut at it")
    a("--micro-batch", type=int, default=None, help="sequences per GPU per step (default: search 1-16)")
    a("--global-batch", type=int, help="global batch in sequences (sets gradient accumulation)")
    a("--global-batch-tokens", type=int, help="global batch in tokens")


def _add_choice_args(a) -> None:
    """What the search ranks (precision, sharding, checkpointing) and the parallel degrees."""
    a("--precision", help="comma list of fp32,bf16,fp16,fp8,fp8-rowwise,fp8-delayed (Transformer Engine's delayed scaling),mxfp8,nvfp4 "
                          "(default: all but fp32/fp16/fp8-delayed that this GPU runs; mxfp8/nvfp4 need Blackwell, asked alone elsewhere they show the fallback)")
    a("--sharding", help="comma list of none (DDP),zero1,zero2,fsdp (FSDP2),hsdp,zero3 (DeepSpeed) (default: fsdp,hsdp,zero1,none)")
    a("--zero", type=int, choices=[1, 2, 3], help="ZeRO stage: 1 = distributed optimizer, 2 = + grads, 3 = DeepSpeed's")
    a("--tp", type=int, default=1, help="tensor parallel degree (sequence parallel unless --sequence-parallel off; across nodes in whole nodes, over the NICs)")
    a("--pp", type=int, default=1, help="pipeline parallel stages")
    a("--vpp", type=int, default=None, help="virtual stages per pipeline rank (interleaved 1F1B); not given with "
                                           "--pp > 1: searched, and the pick is named")
    a("--cp", type=int, default=1, help="context parallel degree (ring attention)")
    a("--checkpointing", help="comma list of none,selective (every 2nd block),selective-op (torchtitan per-op),full")


def _add_memory_args(a) -> None:
    """The optimizer, its states and where they live."""
    a("--optimizer-dtype", default="fp32", choices=["fp32", "bf16", "8bit"], help="dtype of the optimizer's states")
    a("--optimizer", default="adamw", help="adamw (2 states), lion, sgd (momentum: 1), sgd-nomomentum (0), adafactor (~0), "
      "none (no step: a forward/backward benchmark under no_sync, fsdp/hsdp/DDP only); adamw-bf16 / adamw-8bit also set the state dtype")
    a("--master-weights", default="fp32", choices=["fp32", "remainder", "none"],
      help="fp32 master copy (4 B/param), remainder (bf16 weights + 16 low bits: Apex/TE store_param_remainders, "
           "2 B), none (= --pure-bf16)")
    a("--optimizer-in-backward", action="store_true",
      help="step each parameter in the backward and free its gradient (torchtune's optimizer_in_bwd)")
    a("--pure-bf16", action="store_true", help="bf16 weights, grads and states with no fp32 master copy")
    a("--offload", default="none", choices=["none", "optimizer", "params"], help="CPU offload")
    a("--no-zero-init", action="store_true", help="with --sharding zero3: the model is built whole, not under "
      "deepspeed.zero.Init, so deepspeed.initialize puts all of it on each GPU before partitioning it")


def _add_stack_args(a) -> None:
    """What the software does: loss, attention, stack and kernels, recompute, offload, gather dtype, links, host."""
    from overdrive.plan.choices import LOSSES
    from overdrive.plan.host import HOST_US_PER_OP
    a("--loss", default="standard", choices=LOSSES, help="cross-entropy: eager on fp32 logits, Hugging Face's (the "
      "fp32 logits kept in the output), torch.compile'd, Transformer Engine's (gradient written over the logits), or "
      "chunked/fused with the head; compiled-fp32: compiled on the model's fp32 logits (torchtune), chunked: "
      "torchtune's CEWithChunkedOutputLoss, megatron-v07: Megatron-Core <= 0.7's (one more fp32 copy)")
    a("--attention", default="flash", help="flash (the stack's: cuDNN's on megatron/Blackwell, else FA2), fa1 (flash-"
      "attn 1.x), fa2 (SDPA <= 2.10), "
      "fa3 (Hopper), cudnn (cuDNN, FA4; SDPA >= 2.11), triton (MPT's attn_impl triton), unfused (scores in HBM)")
    a("--stack", default="pytorch", help="software stack: pytorch (FSDP2/torchtitan/Hugging Face; --no-compile for "
      "eager) or megatron (Megatron-Core/NeMo + Transformer Engine: fused kernels, TP comm overlap); each has its "
      "own calibrated GEMM efficiency per GPU generation")
    a("--fp8-activations", action="store_true", help="store GEMM inputs for backward in FP8 (Transformer Engine)")
    a("--recompute-layers", type=int, default=0, metavar="N",
      help="Megatron full recompute, block method: the first N blocks of each pipeline chunk keep only their input")
    a("--recompute-modules", metavar="LIST", help="Megatron selective recompute, comma list of core_attn,mlp,layernorm")
    a("--unfused-ops", metavar="LIST", help="megatron: pre-TE eager ops, of rope,swiglu,attn-layout")
    a("--offload-activations", type=int, default=0, metavar="N",
      help="move the activations of N blocks to host memory (Megatron cpu_offloading_num_layers; needs --pp 1)")
    a("--grad-dtype", default="fp32", choices=["fp32", "bf16"], help="gradient buffer dtype (bf16: Megatron's "
      "grad_reduce_in_fp32=False)")
    a("--embedding-in-pipeline-split", action="store_true",
      help="the embedding and the loss each take a block's place in the pipeline split (Megatron)")
    a("--lora-rank", type=int, default=0, help="> 0: LoRA fine-tuning with a frozen bf16 base")
    a("--fp8-all-gather", action="store_true", help="all-gather FP8 weights under FSDP; --stack megatron: "
      "Megatron's fp8_param_gather (NeMo's fp8_params): FP8 parameters, no separate TE weight cache")
    a("--gather-dtype", choices=["fp32", "bf16"], default=None,
      help="FSDP all-gather dtype when it is not the compute dtype: fp32 (fp32 parameters gathered, then cast: "
           "Lightning's bf16-mixed FSDP), bf16")
    a("--sequence-parallel", choices=["on", "off", "regather"], default="on", help="with --tp: off keeps the norms, "
      "residuals and their activations on every token of each TP rank (Megatron before 2022); regather: the GEMMs "
      "save their shard and gather it again in the backward (Megatron's; on --stack pytorch DTensor saves it whole)")
    a("--deepspeed-pipeline", action="store_true",
      help="DeepSpeed's PipelineEngine (Megatron-DeepSpeed, GPT-NeoX): gradients reduced after the pipeline "
           "flush, not under the backward; bf16 through its BF16_Optimizer (fp32 accumulation, fp32 all-reduce)")
    a("--pp-keep-outputs", action="store_true", help="with --pp, --stack pytorch: the last stage keeps every micro-"
      "batch's fp32 logits for step()'s merged output (torchtitan before 2025-10; today's and nanotron's keep the loss)")
    a("--no-overlap-grad-reduce", action="store_true", help="with --stack megatron: gradients reduced after the "
      "backward, parameters gathered after the step, nothing overlapped (Megatron-LM's default)")
    a("--zero-broadcast", action="store_true", help="ZeRO-1 as InternLM's Hybrid ZeRO and torch's ZeroRedundancy"
      "Optimizer run it: gradients all-reduced, then each owner broadcasts its weights (latency grows with the group)")
    a("--zero-sliced", action="store_true", help="ZeRO-1 as nanotron runs it: every tensor sliced over the data-"
      "parallel ranks, the weights all-gathered after the step with per-rank, per-tensor host work (grows with dp)")
    a("--embed-norm", action="store_true", help="a norm after the embedding (BLOOM's --embed-layernorm)"); a(
      "--dropout", action="store_true", help="dropout on (Megatron's default 0.1): its 1-byte masks are kept")
    a("--no-partition-activations", action="store_true",
      help="with --tp and --sequence-parallel off: every TP rank keeps a checkpointed block's input whole "
           "(Megatron-DeepSpeed without --partition-activations)")
    a("--qk-norm", action="store_true", help="the model normalizes q and k per head (OLMo 2, Qwen3, Gemma 3; "
                                             "read from a config.json by its model type)")
    a("--z-loss", action="store_true", help="PaLM's z-loss beside the cross-entropy (one more pass over the fp32 "
                                            "logits unless the loss kernel is fused)")
    a("--fused-kernels", action="store_true",
      help="with --no-compile: hand-fused eager kernels (Apex/Liger/TE norms, fused SwiGLU/RoPE) move what "
           "compiled code moves")
    a("--no-compile", action="store_true", help="eager: memory-bound ops unfused, micro-batches >= the host's dispatch")
    a("--block-code", choices=["torchtune", "hf"], default=None,
      help="whose Llama block runs: torchtune (k, v copied to every head) or transformers (k, v shared); with "
           "--no-compile its eager activations (fp32 RMSNorm, unfused SwiGLU), compiled what torch.compile keeps")
    a("--async-tp", action="store_true", help="overlap TP collectives with GEMMs (--stack megatron's default)"); a(
      "--no-async-tp", action="store_true", help="TP collectives not overlapped, even on megatron (before tp_comm_overlap)")
    a("--efficiency", type=float, help="override the calibrated GEMM fraction of peak, in (0, 1]")
    a("--calibrate", metavar="RESULTS.json", help="take the GEMM efficiency from an overdrive bench result")
    a("--intra-gbs", type=float, help="per-GPU intra-node bandwidth GB/s (default: NVLink of the GPU)")
    a("--inter-gbs", type=float, help="per-GPU inter-node GB/s (default: the GPU's reference system's NIC)")
    a("--host-us", type=float, help=f"µs the host spends per eager op (default {HOST_US_PER_OP}, a published B200 "
                                    "host's; scripts/host_us_published.py --device cuda measures yours)")


def _add_custom_model_args(a) -> None:
    """A custom model by its dimensions."""
    a("--layers", type=int, help="custom model: layers")
    a("--hidden", type=int, help="custom model: hidden size")
    a("--heads", type=int, help="custom model: attention heads"); a("--kv-heads", type=int, help="custom model: KV heads (default: heads)")
    a("--head-dim", type=int, help="custom model: width of one head where it is not hidden/heads (Qwen3, Gemma)")
    a("--ffn", type=int, help="custom model: FFN size (default 4 x hidden)")
    a("--vocab", type=int, help=f"custom model: vocabulary (default {DEFAULT_VOCAB})")
    a("--tied", action="store_true", help="custom model: tied embeddings")
    a("--gelu-mlp", action="store_true", help="custom model: 2-matrix GELU MLP instead of SwiGLU")
    a("--squared-relu", action="store_true", help="custom model: 2-matrix squared-ReLU MLP (Nemotron)")
    a("--learned-pos", type=int, metavar="N", help="custom model: a learned position table of N rows (GPT-2/3)")
    a("--bias", action="store_true", help="custom model: linear and norm biases (GPT-2/3)")


def _add_output_args(a) -> None:
    """What is printed or written."""
    a("--json", action="store_true", help="print JSON (candidates: fits, memory_gib, tokens_per_s_per_gpu, ...)")
    a("--explain", action="store_true", help="print every memory and time term of the top pick, with formulas")
    a("--png", help="write the memory breakdown of the top pick (with --sweep: the sweep plot) to this PNG")
    a("--out", help="folder for plan.json, memory.png and report.html (not with --sweep)")
    a("--markdown", action="store_true", help="with --sweep: print the table as Markdown")
    a("--sweep", action="store_true", help="1B-64B on 8xB200 and 8xB300, FP8/BF16/FP16, with and without "
                                           "checkpointing: longest sequence at micro-batch 1 and its speed")


def register(sub) -> None:
    p = sub.add_parser("plan", help="what fits and how fast: memory per GPU and tokens/s for 1B-405B models",
                       description="Estimate memory per GPU and step time for every precision x sharding x "
                                   "checkpointing x micro-batch, rank what fits, and say what would make the rest "
                                   "fit. Example: overdrive plan --model llama3-8b --gpu h100-sxm --gpus 8 --seq 8192")
    a = p.add_argument
    _add_layout_args(a)
    _add_choice_args(a)
    _add_memory_args(a)
    _add_stack_args(a)
    _add_custom_model_args(a)
    _add_output_args(a)
    p.set_defaults(func=_cmd_plan)
    _DEFAULTS.update(vars(p.parse_args([])))
