"""Enumerate training configurations, estimate each, rank what fits, and say what would make the rest fit."""

from __future__ import annotations

import dataclasses
import os

from overdrive.env.catalog import GpuSpec, gpu_by_key
from overdrive.formats import planned_format
from overdrive.plan.estimate import Estimate, estimate
from overdrive.plan.host import host_us, host_us_source
from overdrive.plan.memory import GIB, terms
from overdrive.plan.runnable import how_to_run, not_in_overdrive
from overdrive.plan.choices import EIGHT_BIT, LOW_PRECISION_SEARCHED, OPTIMIZER_NAMES, STATELESS
from overdrive.plan.setup import (CHECKPOINTING, MIN_EFFICIENCY, SHARDING_ALIASES, TrainSetup,
                                  check_layout, fallback_precision)
from overdrive.plan.specs import ModelSpec, get_model
from overdrive.plan.setup_checks import stack_lacks
from overdrive.plan.attention import CUDNN_HINT, attention_kernel, fa2_by_default, padded_head_dim

__all__ = ["plan", "sweep", "longest_seq", "calibrate_from_bench", "SWEEP_MODELS", "label", "MIN_HEADROOM_SHARE",
           "default_margin_gib", "rank"]

DEFAULT_PRECISIONS = ("bf16", *LOW_PRECISION_SEARCHED)
MICRO_BATCHES = (1, 2, 4, 8, 16)
MIN_HEADROOM_SHARE = 0.10
"""Default safety margin, a share of the GPU's memory: the planner's memory estimate is off by up to ~11% on
the held-out rows of docs/plan-validation.md (and by more on stacks it models less well), so a pick that leaves
less free may not fit when run. Configurations below the margin are ranked after those above it."""


def label(s: TrainSetup) -> str:
    par = "".join(f" {k}{v}" for k, v in (("tp", s.tp), ("pp", s.pp), ("cp", s.cp)) if v > 1)
    extra = "".join(f" · {x}" for x, on in (("offload " + s.offload, s.offload != "none"),
                                              (f"LoRA r{s.lora_rank}", s.lora_rank), ("8-bit " + ("Adam" if s.optimizer == "adamw" else "states"), s.optimizer_dtype == "8bit"),
                                              ("no optimizer step" if s.optimizer == "none" else s.optimizer,
                                               s.optimizer != "adamw"),
                                              ("master remainders", s.master_weights == "remainder"),
                                              ("optimizer in backward", s.optimizer_in_backward),
                                              ("fused loss", s.loss == "fused"),
                                              (f"recompute {s.recompute_layers} blocks/chunk", s.recompute_layers),
                                              ("recompute " + ",".join(s.recompute_modules), s.recompute_modules),
                                              (f"offload acts of {s.offload_activations} blocks", s.offload_activations))
                     if on)
    return f"{s.precision} · {s.sharding}{par} · AC {s.checkpointing} · mb {s.micro_batch}{extra}"


def _named(e: Estimate) -> str:
    """label() with the precision as the table shows it: what was asked and what runs ("mxfp8→fp8 · fsdp ...")."""
    return e.label + label(e.setup)[len(e.setup.precision):]


def _candidates(model: ModelSpec, base: TrainSetup, precisions, shardings, ckpts, micro_batches) -> list[Estimate]:
    out, seen = [], set()
    for prec in precisions:
        if (fallback_precision(prec, base.gpu) or stack_lacks(base.stack, prec)) and len(precisions) > 1:
            continue  # searching: only what this GPU and stack run (asked alone: planned and labelled, or refused)
        for sh in shardings:
            if sh == "hsdp" and base.nodes == 1 or sh == "none" and base.stack == "megatron" and base.fp8_all_gather:
                continue  # HSDP on one node is FSDP; Megatron's --fp8-param-gather needs a sharded optimizer
            for ac in ckpts:
                for mb in micro_batches:
                    if base.global_batch and base.global_batch % (mb * base.dp):
                        continue
                    s = dataclasses.replace(base, precision=prec, sharding=sh, checkpointing=ac, micro_batch=mb)
                    key = (s.precision, s.sharding, s.checkpointing, s.micro_batch)
                    if key not in seen:
                        seen.add(key)
                        out.append(estimate(model, s))
    return out


def longest_seq(model: ModelSpec, base: TrainSetup, *, lo: int = 512, hi: int = 1 << 20, step: int = 512) -> int:
    """The longest sequence (a multiple of `step` and of cp) that fits, by bisection; 0 if even `lo` does not."""
    step = step * base.cp

    def fits(seq: int) -> bool:
        return estimate(model, dataclasses.replace(base, seq=seq)).fits

    if not fits(lo * base.cp):
        return 0
    a, b = lo // step or 1, hi // step
    while a < b:
        mid = (a + b + 1) // 2
        a, b = (mid, b) if fits(mid * step) else (a, mid - 1)
    return a * step


def _option(model: ModelSpec, s: TrainSetup, what: str) -> tuple[str, Estimate] | None:
    try:
        e = estimate(model, s)
    except ValueError:
        return None
    gaps = not_in_overdrive(cand_dict(e))
    other = f" [not run by Overdrive: {'; '.join(gaps)}]" if gaps else ""
    if not e.fits:
        return (f"{what}: not enough alone, {e.memory_gib:.1f} GiB per GPU{other}", e)
    bound = " — communication-bound, says its own model" if any("communication-bound" in n for n in e.notes) else ""
    return (f"{what}: {e.memory_gib:.1f} GiB per GPU, {e.tokens_per_s_per_gpu:,.0f} tokens/s per GPU "
            f"({_named(e)}){bound}{other}", e)


def _suggestions(model: ModelSpec, smallest: Estimate) -> list[str]:
    """What practitioners do when nothing fits, each with its memory and speed from the same model."""
    s = smallest.setup
    out = [f"the leanest configuration ({_named(smallest)}) needs {smallest.memory_gib:.1f} GiB per GPU, "
           f"{smallest.memory_gib - smallest.capacity_gib:.1f} GiB over the {smallest.capacity_gib:.0f} GiB of a "
           f"{s.gpu.key}"]
    # the leanest's micro-batch: the user's when given (--micro-batch), else the smallest the search tried
    full = dataclasses.replace(s, checkpointing="full", recompute_layers=0, recompute_modules=())
    n, opt, ckpt = s.gpus_per_node, OPTIMIZER_NAMES[s.optimizer], "" if s.checkpointing == "full" else "full checkpointing + "

    def alt(**kw):  # None where the change is not a valid setup here (e.g. a tp the GPU count refuses)
        try:
            return dataclasses.replace(full, **kw)
        except ValueError:
            return None

    tries = [
        (alt(loss="fused"), "fused cross-entropy"),
        (alt(optimizer_dtype="8bit"), f"8-bit {opt} states ({EIGHT_BIT.get(s.optimizer)})"),
        (alt(optimizer_dtype="8bit", loss="fused"), f"8-bit {opt} + fused cross-entropy"),
        (alt(offload="optimizer"), "CPU offload of the optimizer (states + step on the CPU)"),
        (alt(offload="params", sharding="fsdp"), "FSDP CPU offload of parameters, gradients and states"),
        # only a larger tp than the one that did not fit is a suggestion (one GPU per node has none)
        (alt(tp=min(n, 8), sharding="fsdp", async_tp=True) if min(n, 8) > s.tp else None,
         f"tensor parallel {min(n, 8)} within the node + FSDP"),
        (alt(lora_rank=16, sharding="fsdp"), "LoRA rank 16 (frozen bf16 base, fine-tuning only)"),
    ]
    if s.micro_batch > 1:   # a fixed micro-batch: one sequence a time, accumulation keeping the global batch
        tries.insert(0, (alt(micro_batch=1), "micro-batch 1"))
    lean = _option(model, dataclasses.replace(s, pp_keep_outputs=False), "the loss alone on the last stage (today's "
                   "torchtitan: no --pp-keep-outputs)") if s.pp_keep_outputs and s.pp > 1 else None
    out += [lean[0]] if lean else []   # the user's own setup, no checkpointing added
    if s.optimizer not in EIGHT_BIT:   # no states to shrink
        tries = [t for t in tries if not t[1].startswith("8-bit")]
    fp8_gather = None if s.fp8_all_gather else alt(fp8_all_gather=True)
    if fp8_gather is not None and fp8_gather.gathers_fp8:   # only where it changes what is gathered
        tries.insert(0, (fp8_gather, "FP8 all-gather"))
    if not s.zero_init and terms(model, s)["startup"] > 0:   # start-up, whole on every GPU, is the peak: more GPUs
        tries.insert(0, (alt(zero_init=True), "the model built under deepspeed.zero.Init (no whole copy at start-up)"))
    for nodes in (2, 4, 8, 16, 32, 64):
        if nodes > s.nodes:
            more = alt(nodes=nodes, sharding="fsdp")
            if more is None:  # the global batch does not spread over that many data-parallel ranks
                break
            tries.append((more, f"more GPUs: FSDP over {nodes} nodes ({nodes * n} GPUs)"))
    found = int(bool(lean and lean[1].fits))
    for cand, what in tries:   # each planned at full checkpointing, which the label says when it is a change
        opt = _option(model, cand, ckpt + what) if cand and cand != s else None
        if opt and (opt[1].fits or not what.startswith("more GPUs")):
            out.append(opt[0])
            found += opt[1].fits
            if what.startswith("more GPUs"):
                break
    seq = longest_seq(model, full, hi=s.seq)
    if 0 < seq < s.seq:
        out.append(f"a shorter sequence: {seq} tokens fits with full checkpointing at micro-batch {full.micro_batch}")
    if not found:
        out.append("nothing within reach does it: shard over more GPUs" + (
            ", with the model built under deepspeed.zero.Init (--no-zero-init puts all of it on every GPU)"
            if not s.zero_init else ""))
    return out


def _why(model: ModelSpec, top: Estimate, ranked: list[Estimate], margin: float) -> str:
    s = top.setup
    safe = top.headroom_gib >= margin
    parts = [f"{_named(top)} is fastest that fits "
             + (f"with the {margin:.1f} GiB safety margin (--min-headroom)" if safe else
                f"but none keeps the {margin:.1f} GiB safety margin (--min-headroom): measure its memory before a "
                "long run")
             + f": {top.tokens_per_s_per_gpu:,.0f} tokens/s per GPU ({100 * top.mfu:.0f}% MFU) with "
             f"{top.headroom_gib:.1f} GiB headroom"]
    faster = next((e for e in ranked if e.headroom_gib < margin), None) if safe else None
    if faster and faster.tokens_per_s_per_gpu > top.tokens_per_s_per_gpu:
        parts.append(f"{_named(faster)} is {100 * (faster.tokens_per_s_per_gpu / top.tokens_per_s_per_gpu - 1):.0f}% "
                     f"faster but leaves only {faster.headroom_gib:.1f} GiB free, inside the memory estimate's error; "
                     "--min-headroom 0 ranks by speed alone")
    bf16 = next((e for e in ranked if e.setup.precision == "bf16"), None)
    if s.precision != "bf16" and bf16:
        gain = top.tokens_per_s_per_gpu / bf16.tokens_per_s_per_gpu - 1
        share = top.times["gemm"] / max(1e-12, top.step_s)
        parts.append(f"{s.precision} is {100 * gain:+.0f}% over the best bf16 ({bf16.tokens_per_s_per_gpu:,.0f}): "
                     f"the GEMMs, {100 * share:.0f}% of its step, run at the {s.precision} peak, minus the casts")
    if s.checkpointing == "none":
        parts.append("no recomputation is needed: the activations fit")
    else:
        parts.append(f"{s.checkpointing} checkpointing is the least recomputation that fits at this micro-batch")
    if fa2_by_default(s):
        parts.append("attention is planned as FlashAttention-2 (PyTorch <= 2.10, flash-attn 2); " + CUDNN_HINT)
    parts.extend(top.notes)
    return "; ".join(parts)


def _search_space(base: TrainSetup, setup: dict, precisions, shardings, checkpointing, micro_batches):
    """(precisions, shardings, checkpointings, micro-batches) to search, each name validated first."""
    precisions = list(precisions or (("bf16",) if base.zero_sliced or base.unfused_ops else DEFAULT_PRECISIONS))
    for p in precisions:  # validate every name before the search (the stack's gaps are skipped when searching)
        if not (len(precisions) > 1 and stack_lacks(base.stack, p)):
            dataclasses.replace(base, precision=p)
    for sh in shardings or ():
        dataclasses.replace(base, sharding=sh)
    for ac in checkpointing or ():
        dataclasses.replace(base, checkpointing=ac)
    mbs = micro_batches or ([base.micro_batch] if "micro_batch" in setup else MICRO_BATCHES)
    # --recompute-layers/-modules are Megatron's own choice of what to recompute: no torch-style checkpointing beside
    ckpts = checkpointing or (("none",) if base.recompute_layers or base.recompute_modules else
                              ("none", "full") if base.zero_sliced else CHECKPOINTING)
    # parameter offload is FSDP's (CPUOffloadPolicy): search only the shardings that have it
    asked_shardings = shardings
    fsdp = [sh for sh in shardings or () if sh in ("fsdp", "hsdp")]
    if base.loss == "megatron-v07" and fsdp:
        # megatron/core/distributed/torch_fully_sharded_data_parallel.py first appears in core_v0.10.0
        raise ValueError(f"--sharding {fsdp[0]} with --loss megatron-v07: Megatron-Core before 0.10 has no FSDP; "
                         "use --sharding zero1 (its distributed optimizer) or none")
    shardings = shardings or (("zero3",) if not base.zero_init else ("fsdp", "hsdp") if base.offload == "params" else
                              ("zero1",) if base.zero_broadcast or base.zero_sliced else
                              ("zero1", "none") if (base.deepspeed_pipeline or not base.overlap_grad_reduce
                                                    or base.loss == "megatron-v07") else
                              ("fsdp", "hsdp", "none") if base.optimizer == "none" else   # no_sync: DDP's and FSDP's
                              ("fsdp", "hsdp", "zero1", "none"))
    if base.dp * base.cp == 1 and not asked_shardings and not (base.zero_broadcast or base.zero_sliced):
        # one data-parallel rank: every sharding holds the same bytes and runs the same step; rank one, not three
        shardings = ("zero3",) if not base.zero_init else ("fsdp",) if base.offload == "params" else ("none",)
    return precisions, shardings, ckpts, mbs


def _check_asked(g: GpuSpec, base: TrainSetup, precisions: list, shardings) -> None:
    """What no candidate could give: a precision this GPU runs, FP8 flags without FP8, HSDP on one node."""
    runs_here = [p for p in precisions if len(precisions) == 1 or not fallback_precision(p, g)]
    if not runs_here:
        raise ValueError(f"none of --precision {','.join(precisions)} runs on {g.key}: ask for one alone to plan "
                         "what it falls back to, or add one this GPU runs (bf16, fp8)")
    planned = {fallback_precision(p, g) or p for p in runs_here}
    for flag, on in (("--fp8-activations", base.fp8_activations), ("--fp8-all-gather", base.fp8_all_gather)):
        if on and not any(planned_format(p) for p in planned):
            raise ValueError(f"{flag} needs a low precision that runs on {g.key} (fp8, fp8-rowwise, fp8-delayed; "
                             f"mxfp8/nvfp4 on Blackwell), and --precision {','.join(precisions)} has none: add one or drop the flag")
    if base.nodes == 1 and all(SHARDING_ALIASES.get(sh, sh) == "hsdp" for sh in shardings):
        raise ValueError("--sharding hsdp needs --nodes > 1 (FSDP within a node, replicas across nodes): "
                         "use fsdp on one node")


def default_margin_gib(g: GpuSpec) -> float:
    """The GiB `plan` wants left free when --min-headroom is not given: MIN_HEADROOM_SHARE of the GPU."""
    return round(g.mem_gib * MIN_HEADROOM_SHARE, 1)


def rank(cands: list, margin: float) -> list:
    """The candidates that fit, best first: those leaving `margin` GiB free before the rest, then by speed."""
    return sorted([e for e in cands if e.fits],
                  key=lambda e: (e.headroom_gib < margin, -e.tokens_per_s_per_gpu, e.memory_gib))


def plan(model: ModelSpec, gpu: GpuSpec | str, *, precisions=None, shardings=None, checkpointing=None,
         micro_batches=None, min_headroom_gib: float | None = None, **setup) -> dict:
    """Rank every precision x sharding x checkpointing x micro-batch for `model` on `gpu` (`setup`: the other
    TrainSetup fields); those leaving under `min_headroom_gib` free (default: MIN_HEADROOM_SHARE) rank last."""
    g = gpu_by_key(gpu) if isinstance(gpu, str) else gpu
    if min_headroom_gib is not None and not 0 <= min_headroom_gib < g.mem_gib:
        raise ValueError(f"--min-headroom {min_headroom_gib:g} GiB is outside 0-{g.mem_gib:.0f} (the {g.key}'s "
                         "memory): give the GiB to keep free, 0 to rank by speed alone")
    margin = default_margin_gib(g) if min_headroom_gib is None else float(min_headroom_gib)
    # ZeRO-1 is the base of DeepSpeed's PipelineEngine, Megatron's non-overlapped reduce, InternLM's and nanotron's ZeRO
    if model.embed_norm:   # the model has it (BLOOM's config): what --embed-norm says
        setup = {**setup, "embed_norm": True}
    zero1 = (setup.get("deepspeed_pipeline") or setup.get("overlap_grad_reduce") is False or setup.get("zero_broadcast")
             or setup.get("zero_sliced"))
    # --no-zero-init is DeepSpeed ZeRO-3's: its base, and the only sharding searched
    first = {"sharding": "zero1"} if zero1 else {"sharding": "zero3"} if setup.get("zero_init") is False else {}
    base = TrainSetup(gpu=g, **{**first, **setup})
    precisions, shardings, ckpts, mbs = _search_space(base, setup, precisions, shardings, checkpointing,
                                                      micro_batches)
    _check_asked(g, base, precisions, shardings)
    if base.offload_activations >= model.n_layer and "full" in ckpts:
        ckpts = ("full",)   # every block to the host: only checkpointed blocks' inputs can all go
    # before the search: one message for the layout, not one per candidate
    check_layout(model, dataclasses.replace(base, checkpointing=ckpts[0]) if len(ckpts) == 1 else base)
    cands = _candidates(model, base, precisions, shardings, ckpts, mbs)
    if not cands:
        raise ValueError(f"no configuration to evaluate: global batch {base.global_batch} is not divisible by "
                         f"micro-batch x {base.dp} data-parallel ranks for any micro-batch in {list(mbs)}")
    return _result(model, g, base, cands, precisions, margin)


def _result(model: ModelSpec, g: GpuSpec, base: TrainSetup, cands: list, precisions: list, margin: float) -> dict:
    """What plan() returns: the candidates ranked (a safety margin first, then speed), the pick and why."""
    skipped = [f"{p} skipped: not supported on {g.key} (would run as {fallback_precision(p, g)})"
               for p in precisions if len(precisions) > 1 and fallback_precision(p, g)]
    skipped += [f"{p} skipped: {stack_lacks(base.stack, p)}" for p in precisions
                if len(precisions) > 1 and stack_lacks(base.stack, p) and not fallback_precision(p, g)]
    # a safety margin first (the user's to set), then speed: a pick 5% faster with 2 GiB free is no pick
    ranked = rank(cands, margin)
    rest = sorted((e for e in cands if not e.fits), key=lambda e: e.memory_gib)
    result = {"model": dataclasses.asdict(model), "params_b": model.n_params() / 1e9, "gpu": g.key,
              "capacity_gib": g.mem_gib, "gpus_per_node": base.gpus_per_node, "nodes": base.nodes, "seq": base.seq,
              "doc_len": base.doc_len,
              "global_batch": base.global_batch, "tp": base.tp, "pp": base.pp, "cp": base.cp, "stack": base.stack,
              "efficiency": base.efficiency, "min_headroom_gib": margin, "intra_gbs": base.link_gbs,
              "inter_gbs": base.net_gbs, "inter_gbs_source": "--inter-gbs" if base.inter_gbs else g.nic_source,
              "host_us": host_us(base), "host_us_source": host_us_source(base),
              "candidates": [{**cand_dict(e), "margin_ok": e.fits and e.headroom_gib >= margin} for e in ranked + rest],
              "notes": skipped + sorted({n for e in cands for n in e.notes if "not supported" in n})}
    if ranked:
        top = result["candidates"][0]
        result.update(top=top, why=_why(model, ranked[0], ranked, margin), suggestions=[],
                      how_to_run=how_to_run(top, gpus_per_node=base.gpus_per_node, nodes=base.nodes,
                                            grad_accum=top["grad_accum"]))
    else:
        result.update(top=None, why="nothing fits", suggestions=_suggestions(model, rest[0]))
    return result


_SETTINGS = ("grad_dtype", "gather_dtype", "fp8_all_gather", "async_tp", "attention", "sequence_parallel",
             "sp_regather", "partition_activations", "overlap_grad_reduce", "deepspeed_pipeline",
             "embedding_in_pipeline_split", "z_loss", "block_code", "fused_kernels", "embed_norm", "dropout",
             "zero_broadcast", "zero_sliced", "zero_init", "pp_keep_outputs", "doc_len", "unfused_ops")
"""TrainSetup fields a candidate records beside its search axes (each changes the plan's figures)."""


def cand_dict(e: Estimate) -> dict:
    s = e.setup
    return {"precision": s.precision, "label": e.label, "sharding": s.sharding, "checkpointing": s.checkpointing,
            "micro_batch": s.micro_batch, "seq": s.seq, "tp": s.tp, "pp": s.pp, "vpp": s.vpp, "cp": s.cp,
            "stack": s.stack, "optimizer": s.optimizer, "host_us": host_us(s),
            "optimizer_dtype": None if s.optimizer in STATELESS else s.optimizer_dtype,
            "master_weights": s.master_weights, "loss": s.loss, "compile": s.compile, "offload": s.offload,
            "lora_rank": s.lora_rank, "optimizer_in_backward": s.optimizer_in_backward,
            "recompute_layers": s.recompute_layers, "recompute_modules": list(s.recompute_modules),
            "offload_activations": s.offload_activations, "grad_accum": s.grad_accum,
            # the rest of what was planned, so a plan.json says every setting that shaped its figures
            **{k: getattr(s, k) for k in _SETTINGS}, "attention_kernel": attention_kernel(s),
            # the head dim the kernel's tiles run at (padded: attention timed at head_dim / this of its rate)
            "attention_tile_head_dim": padded_head_dim(attention_kernel(s), e.model.head_dim) if e.model else None,
            "fits": e.fits, "cached_gib": round(e.cached_gib, 3), "peak_phase": e.peak_phase,
            "memory_gib": round(e.memory_gib, 3), "allocated_gib": round(e.allocated_gib, 3),
            "reserved_margin_gib": round(e.reserved_margin_gib, 3), "headroom_gib": round(e.headroom_gib, 3),
            "step_s": e.step_s, "compute_s": e.compute_s, "comm_s": e.comm_s,
            "tokens_per_s_per_gpu": e.tokens_per_s_per_gpu, "mfu": e.mfu,
            "times_s": {k: round(v, 6) for k, v in e.times.items()},
            "breakdown": {k: round(v, 3) for k, v in e.breakdown_gib.items()}, "notes": e.notes,
            # --no-zero-init: the whole model on each GPU at start-up (in "other" when it is the peak)
            **({"startup_gib": round(terms(e.model, s)["startup_bytes"] / GIB, 3)} if not s.zero_init else {})}


SWEEP_MODELS = ("llama3-1b", "llama3-3b", "llama3-8b", "gpt-64b")


def sweep(models=SWEEP_MODELS, gpus=("b200", "b300"), precisions=("fp8", "bf16", "fp16"),
          checkpointing=("none", "full")) -> list[dict]:
    """The seed scenario: one node of 8 GPUs, FSDP, micro-batch 1: the longest sequence that fits and the
    speed there (and at 8K tokens, so GPUs compare), for each model x GPU x precision x checkpointing."""
    rows = []
    for mname in models:
        m = get_model(mname)
        for gk in gpus:
            for prec in precisions:
                for ac in checkpointing:
                    base = TrainSetup(gpu=gpu_by_key(gk), precision=prec, sharding="fsdp", checkpointing=ac)
                    seq = longest_seq(m, base)
                    e = estimate(m, dataclasses.replace(base, seq=seq)) if seq else None
                    at8k = estimate(m, dataclasses.replace(base, seq=8192))
                    rows.append({"model": mname, "params_b": m.n_params() / 1e9, "gpu": gk, "precision": prec,
                                 "checkpointing": ac, "longest_seq": seq,
                                 "tokens_per_s_per_gpu_8k": at8k.tokens_per_s_per_gpu if at8k.fits else None,
                                 "tokens_per_s_per_gpu": e.tokens_per_s_per_gpu if e else None,
                                 "mfu": e.mfu if e else None, "memory_gib": e.memory_gib if e else None})
    return rows


# What --calibrate reads of a bench results.json: configurations with per-model rows (the MFU is
# filtered below: a string, a bool or NaN is no efficiency, and says "no bf16 ... MFU").
_CALIBRATION_SCHEMA = {"type": "object", "required": ["configs"], "properties": {"configs": {
    "type": "array", "items": {"type": "object", "properties": {
        "models": {"type": "object", "additionalProperties": {"type": "object"}}}}}}}


def calibrate_from_bench(path: str) -> float:
    """GEMM efficiency from our own bench: the best measured bf16 MFU (vs the BF16 peak) in results.json,
    read by the results files' one reader (`results.files.read_doc`: a bounded regular text JSON file)."""
    from overdrive.results.files import read_doc, results_path

    p = results_path(path)
    if not os.path.exists(p):
        raise ValueError(f"--calibrate {path}: no bench results.json there: pass one an overdrive bench run wrote")
    try:
        res = read_doc(p, _CALIBRATION_SCHEMA, what="bench results.json", fix="")
    except ValueError as e:
        raise ValueError(f"--calibrate {path} is not a bench results.json ({e}): pass one an overdrive bench run "
                         "wrote") from None
    configs = res["configs"]
    mfus = [m.get("mfu_bf16_peak") for c in configs if c.get("precision") == "bf16" and c.get("safe")
            for m in c.get("models", {}).values()]
    # a fraction of peak, nothing else: a string, a bool or NaN would become a silent efficiency of 1
    mfus = [x for x in mfus if isinstance(x, (int, float)) and not isinstance(x, bool) and MIN_EFFICIENCY <= x <= 1]
    if not mfus:
        raise ValueError(f"--calibrate {path}: no bf16 configuration with a measured MFU in [{MIN_EFFICIENCY}, 1] "
                         "(a GPU bench run is needed)")
    return max(mfus)
