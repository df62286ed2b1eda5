"""`overdrive plan --explain`: one candidate's memory and time terms, each with its formula."""

from __future__ import annotations

import dataclasses

from overdrive.plan.choices import BANDWIDTH_GBS, HOST_US_RANGE, STATELESS
from overdrive.plan.collectives import CONNECTION_BYTES, LINK_EFF
from overdrive.formats import planned_format
from overdrive.plan.engine_memory import gathered_tp_bytes, nccl_groups, weight_copies
from overdrive.plan.estimate import Estimate
from overdrive.plan.host import HOST_US_PER_OP, OPS_OUTSIDE_BLOCKS, host_time, host_us, host_us_source
from overdrive.plan.setup import gbs_text
from overdrive.plan.memory import (CONTEXT_BYTES, FRAGMENTATION, FRAGMENTATION_CAP, GIB, RESERVED_SHARE, act_tensors,
                                   backward_grad_bytes, state_bytes_per_param, terms)
from overdrive.plan.attention import (CUDNN_HINT, FA1_VS_FA2, TRITON_VS_FA2, attention_kernel, attention_override,
                                      attention_share, fa2_by_default, KERNEL_NAMES, head_dim_ratio, head_dim_refusal,
                                      padded_head_dim)
from overdrive.plan.throughput import CALIBRATION, cast_bytes_per_micro_batch, peak_tflops
from overdrive.plan.pipeline import chunk_slots, embedding_bytes, embedding_micro_batches, pipeline_blocks_in_flight, stage_params

__all__ = ["explain", "NOT_ADDED"]

NOT_ADDED = ("dp_comm", "dp_latency")
"""Time terms that are not part of the step sum: the data-parallel communication before overlap (dp_exposed is
what compute does not hide of it) and its latency share."""

_PHASE = {"loss": "the loss's backward", "blocks": "the blocks' backward",
          "end": "the backward's end or the step", "": "the peak"}
_MEM = {
    "params": "weights: fp32 master 4·P/S under FSDP; ZeRO-1/2: 2·P + 4·P/S; DDP: 4·P + 2·P autocast copies "
              "(P after /tp/pp; LoRA: frozen bf16 base)",
    "grads": "grads 4·P (bf16 grad buffer: 2·P; /S under ZeRO-2/3; whole with --optimizer none's no_sync), counted "
             "as far as they sit on top of the activation peak",
    "optimizer": "n states x b bytes x P/S (--optimizer: AdamW n=2, Lion/SGD 1, Adafactor ~0, SGD without momentum "
                 "and none 0; b = 4 fp32, 2 bf16, 1 8-bit; 0 when offloaded)",
    "activations": "per block s·b·(5h + h+2kv + 3F)·2 bytes /(tp·cp) (FP8 storage: 1-byte GEMM inputs; --block-code: "
                   "the eager block's tensors, line below), minus what checkpointing/recompute drops and "
                   "offloaded blocks, + the larger of the loss's peak (logits by --loss, bytes per logit: standard "
                   "12, hf 16, compiled 4, compiled-fp32 8, inplace 2, megatron's standard 6, megatron-v07 10; "
                   "fused: one chunk) and what the backward adds after it (the recompute buffer, its gradients, the "
                   "logits the loop keeps: hf 4 bytes, 0 where it frees them); with --pp the busier end of the "
                   "pipeline (line below)",
    "other": "FSDP buffers (2 gathered blocks + 1 block of fp32 grads) + Megatron's TE FP8 weight cache (line "
             "below) + 1 GiB CUDA context + NCCL buffers (channels x 9.19 MiB x ring + tree "
             "connections per communicator) + the fragmentation reserve, min(5% of allocated, 3 GiB) + with "
             "--no-zero-init what DeepSpeed's start-up (the whole model on each GPU) holds beyond the step",
}
_TIME = {
    "gemm": "per linear, forward (M×N over K), input grad (M×K over N), weight grad (K×N over M), each 2·M·K·N / "
            "(peak × e[stack][GPU generation] × tile/wave quantization over the SMs × inner/(inner + k0)); low "
            "precision at its peak × lowp_rel, head in bf16",
    "attention": "causal flash attention 3.5 × 2·b·s²·h/(tp·cp) (packed documents: s·d, --doc-len d) / (bf16 peak × "
                 "the kernel's share at this sequence (or document) × "
                 "attn_rel: the attention kernel line below); --attention unfused: "
                 "the two score GEMMs over the full s × s at their shape's rate + 20 bytes per score over HBM",
    "memory_bound": "(12h + 2kv + 3F)·2 bytes ×3 per token per block (10h of it on every token of a TP rank "
                    "without SP; + 2(q+kv) with QK-norm; + 8F unfused squared ReLU on megatron; --unfused-ops: "
                    "+ 20(q+kv) rope, + 9F swiglu, + 6q+4kv attn-layout) + FP8 casts + loss (+12 B/logit z-loss "
                    "unfused), at 80% of HBM",
    "recompute": "the forward again for checkpointed blocks (full: all, selective: half, selective-op: half the mms; "
                 "Megatron: recompute-layers blocks, recompute-modules parts)",
    "offload_exposed": "activation offload out and back over the host link beyond the micro-batch's compute",
    "host_exposed": f"the GPU waiting for the host: (eager PyTorch's dispatch, blocks × ops per block + "
                    f"{OPS_OUTSIDE_BLOCKS}, none when compiled; + blocks × ZeRO-3's hooks in ops' worth with "
                    f"--sharding zero3, compiled or not) × µs per op ({HOST_US_PER_OP} unless --host-us) per "
                    "micro-batch beyond its GPU work "
                    "(host.py; the µs from a published B200 host's eager step over its ops; ZeRO-3's ops' worth "
                    "timed on a CPU host)",
    "optimizer": "16 + 8 per state bytes per parameter of this GPU's shard over HBM (AdamW: 32; offloaded: PCIe "
                 "+ CPU step)",
    "bubble": "pipeline idle (pp−1)/(vpp·micro-batches) of the compute (Narayanan et al. 2021, §2.2)",
    "tp_exposed": "8 all-gathers/reduce-scatters of b·s·h per block (+ the recomputed forward's; without SP the same "
                  "bytes as 4 all-reduces), each (t−1)/t·bytes/busBW + NCCL ring latency, over NVLink or, tp "
                  "across nodes, the NICs; async TP / tp_comm_overlap: 30% exposed, inside a node only",
    "cp_exposed": "ring K/V exchange, (cp−1) p2p per block and pass, beyond what attention hides",
    "pp_p2p": "per micro-batch and virtual stage, activations on and gradients back: p2p latency + b·s·h·2/tp "
              "bytes over NVLink or the NIC",
    "dp_comm": "FSDP: per block an all-gather forward, one backward, a reduce-scatter (per micro-batch); ZeRO-1/2: "
               "reduce-scatter + all-gather per bucket (ZeRO-2: the reduce-scatters again in every micro-batch, "
               "DeepSpeed's stage 2); DDP: all-reduce per bucket (per step); --zero-sliced: one "
               "all-reduce of the fp32 gradients (the weights' gather is in zero_sliced_exposed); --optimizer none: "
               "the gathers alone; each call factor·B/busBW + latency, ring or tree as NCCL's model picks",
    "dp_latency": "the latency part of dp_comm: calls × NCCL's per-call latency (tuning.cc: ring 8.4 µs + 3.4 µs per "
                  "NVLink hop + 9.6 µs per network hop; tree 2·(hops in node·28 + log2(nodes)·50) µs)",
    "dp_exposed": "FSDP: max(first gather + last reduce-scatter, dp_comm − overlap × compute); DDP/ZeRO: "
                  "max(t_last, nb·t − (nb−1)·overlap·c), nb buckets of t s over c s of compute each (an "
                  "all-reduce: the backward's alone; ZeRO-2: each micro-batch's reduce-scatters under its own "
                  "compute); DeepSpeed's "
                  "PipelineEngine, Megatron without --overlap-grad-reduce and nanotron's ZeRO-1: all of dp_comm",
    "nccl_sms": "the compute the hidden data-parallel calls slow: (dp_comm − dp_exposed) × NCCL channels / SMs "
                "(ring channels, one CTA on an SM each: 24 inside an A100/H100 node, 16 across nodes, 32 inside a "
                "B200 node; NCCL src/graph/search.cc, connect.cc), less the compute's slack when communication "
                "is what the step waits for",
    "embed_allreduce": "tied embedding under --pp: its V·h/tp gradient all-reduced between the first and the last "
                       "stage after the data-parallel reduction (Megatron finalize_model_grads, DeepSpeed "
                       "ReduceTiedGrads), exposed",
    "zero_bcast_exposed": "--zero-broadcast: after the step each rank owning parameters broadcasts its updated "
                          "weights to the ZeRO group, all waited for: B/busBW + (8.4 + n·14 µs across nodes, n·4 µs "
                          "in a node) latency per call (NCCL tuning.cc's ring broadcast); InternLM: one call per owner, "
                          "dp_comm an all-reduce per 512M gradient elements; torch's ZeroRedundancyOptimizer (fp32 "
                          "gradients): one call per tensor in the weights' dtype, dp_comm DDP's",
    "zero_sliced_exposed": "--zero-sliced (nanotron's ZeRO-1): max(dp_exposed + the all-gather of the updated 16-bit "
                           "weights, the host's slices, flattens and copies: 0.41 + 0.56 ops' worth per rank and "
                           "tensor, nanotron's loops timed on a CPU host, × the µs per op) − dp_exposed; the copies' "
                           "GPU time is not counted",
    "fp32_grad_accum": "DeepSpeed's BF16_Optimizer: every micro-batch the bf16 gradients cast and added into fp32 "
                       "ones, 18 bytes per parameter of the stage over HBM (in the micro-batch time); nanotron's "
                       "accumulator (--zero-sliced): 10 bytes, the add promoting in place",
}


def _attention_line(e: Estimate) -> str:
    """Which kernel attention is planned with, at what share of the peak, and where that share comes from."""
    s = e.setup
    kernel, tokens = attention_kernel(s), min(s.seq // s.cp, s.attn_len)   # a packed document's own, --doc-len
    hd = e.model.head_dim if e.model is not None else 128
    share, rel = attention_share(s, tokens), CALIBRATION["attn_rel"] * attention_override(s, CALIBRATION)
    peak = peak_tflops(s, "fp32" if s.precision == "fp32" else "bf16")
    why = "--attention" if s.attention != "flash" else f"the {s.stack} stack's on {s.gpu.key}"
    src = ("the FlashAttention-3 paper's H100 figures" if s.gpu.sm[0] == 9 and tokens >= 512 else
           "assumed: the papers publish H100 figures from 512 tokens up")
    if kernel in ("triton", "fa1"):   # no figure of their own: FlashAttention-2's share x the FA2 paper's ratio
        src = (f"FlashAttention-2's share x the FlashAttention-2 paper's A100 ratio to "
               f"{'the Triton kernel' if kernel == 'triton' else 'FlashAttention'}, "
               f"{TRITON_VS_FA2 if kernel == 'triton' else FA1_VS_FA2:.2f}")
    pad = padded_head_dim(kernel, hd)   # the kernel's tiles are as wide as the head dim it was compiled for
    tiles = f" x {hd / pad:.2f} (head dim {hd} runs in the kernel's {pad}-wide tiles, the rest zeros)" if pad != hd else ""
    eff = share * rel * hd / pad
    line = (f"  attention kernel: {KERNEL_NAMES[kernel]} ({why}): {share:.2f} of the bf16 peak at {tokens} tokens "
            f"({src}) x attn_rel {rel:.3g} (fitted{', x --efficiency' if s.efficiency is not None else ''}){tiles} = "
            f"{eff:.2f}, {eff * peak:,.0f} TFLOP/s")
    if fa2_by_default(s):
        line += "; " + CUDNN_HINT
    refused = head_dim_refusal(kernel, hd, s.gpu.sm)
    if pad != 128 and not refused:
        line += (f"; head dim {pad} planned at 128's rate (the FlashAttention-3 paper's H100 forward puts it at "
                 f"{head_dim_ratio(s, pad):.2f} of that)")
    if refused:
        line += f"; {refused}"
    return line


def _cast_line(e: Estimate) -> str:
    """The low-precision casts inside memory_bound: the format's bytes per element, where weights are cast."""
    s, f = e.setup, planned_format(e.setup.precision)
    c = f.cast_bytes()
    nbytes = cast_bytes_per_micro_batch(e.model, s)
    where = ("once a step (Megatron passes is_first_microbatch: Transformer Engine caches them)" if s.stack == "megatron"
             else "every micro-batch")
    if s.gathers_fp8:
        where += ", gathered in FP8 so only their transposed copy (2 B)"
    b = lambda role: f"{sum(role):.3g}"   # noqa: E731  (forward + backward bytes)
    inputs = (f"norm-fed input {b(c.norm_input)} (once per norm), other input {b(c.input)}" if s.stack == "megatron"
              else f"input {b(c.input)} (the attention's and FFN's once each, on the sequence shard: torchtitan's "
                   "float8 TP)" if s.tp > 1 and f.tp_float8_gather else f"input {b(c.input)} (each linear its own)")
    return (f"  casts ({f.name}, {f.scaling} scaling; inside memory_bound): {nbytes / 1e9:.2f} GB per micro-batch at "
            f"{inputs}, gradient {b(c.grad)}, weight {b(c.weight)} B per element, weights {where} "
            "(Format.cast_bytes: each engine's kernels, overdrive/formats/registry.py)")


def _pipeline_line(e: Estimate) -> str:
    """Which end of the pipeline sets the peak, and why (plan/pipeline.py)."""
    s, m = e.setup, e.model
    t = terms(m, s)
    sizes, cut = chunk_slots(m, s), 1 if s.embedding_in_pipeline_split else 0
    first = pipeline_blocks_in_flight(m, s) / max(1, sum(sizes[0::s.pp]) - cut)
    last = pipeline_blocks_in_flight(m, s, s.pp - 1) / max(1, sum(sizes[s.pp - 1::s.pp]) - cut)
    r = t["pp_rank"]   # memory.terms: the stage whose states and peak, gradients included, are the largest
    end = "last" if r == s.pp - 1 else "first" if r == 0 else f"rank-{r}"
    kept = (f" + every micro-batch's fp32 output, {t['pp_outputs'] / GIB:.2f} GiB (--pp-keep-outputs: torch."
            "distributed.pipelining keeps them for step()'s merged output)" if t["pp_outputs"] else "")
    params = ", ".join(f"{p / 1e9:.3g}" for p in stage_params(m, s))
    return (f"  pipeline peak at the {end} stage: first {t['pp_first'] / GIB:.2f} GiB ({first:.3g} micro-batches "
            f"of its blocks in flight, no head) vs last {t['pp_last'] / GIB:.2f} GiB ({last:.3g} in flight + the "
            f"loss{kept}); parameters by stage (B, before tp): {params}")


def _te_cache_line(s, nbytes: float) -> str:
    """Transformer Engine's cached quantised weights: the bytes per weight, and the copies (engine_memory)."""
    copies = weight_copies(s)
    held = (f"{planned_format(s.precision).stored_bytes:.3g} B per linear weight x {copies} "
            + ("(rowwise + columnwise copy)" if copies == 2 else "(no transpose: Blackwell takes the other layouts)"))
    if s.fp8_all_gather:
        return (f"  TE FP8 weight cache {nbytes / GIB:.2f} GiB (in buffers): --fp8-all-gather makes the parameter "
                f"itself quantised, {held}, less the 2 B bf16 weight it replaces (in params)")
    return (f"  TE FP8 weight cache {nbytes / GIB:.2f} GiB (in buffers): Megatron passes is_first_microbatch, so "
            f"Transformer Engine keeps each linear's quantised weight across micro-batches and steps, {held}")


def _replanned(e: Estimate, field: str, values, text) -> str:
    """The plan replanned with `field` at each of `values` (those within its accepted range and not the planned
    one): "at <value> N tokens/s per GPU (+x%)", joined."""
    from overdrive.plan.estimate import estimate

    planned, parts = getattr(e.setup, field), []
    for v in dict.fromkeys(values):
        if v == planned:
            continue
        o = estimate(e.model, dataclasses.replace(e.setup, **{field: v}))
        parts.append(f"at {text(v)} {o.tokens_per_s_per_gpu:,.0f} tokens/s per GPU "
                     f"({100 * (o.tokens_per_s_per_gpu / e.tokens_per_s_per_gpu - 1):+.0f}%)")
    return ", ".join(parts)


def _network_sensitivity(e: Estimate) -> str:
    """The step on an assumed network (no --inter-gbs) replanned at a half and a quarter of it: how much the plan
    rests on the assumption (many clusters give a GPU less than its reference system's NIC)."""
    net = e.setup.net_gbs
    at = _replanned(e, "inter_gbs", [max(BANDWIDTH_GBS[0], net * k) for k in (0.5, 0.25)],
                    lambda v: f"{gbs_text(v)} GB/s")
    return ("  the network is assumed, not given: " + at + "; --inter-gbs plans the cluster's own "
            "(docs/plan-validation.md, the plan's assumed figures: what network each published run would need)")


def _host_line(e: Estimate, host_s: float) -> str:
    """The host's dispatch per micro-batch and where its µs per op come from; where it bounds the step, the plan
    replanned at twice and half the figure (one host's, or --host-us: a host-bound step moves with it)."""
    s, us = e.setup, host_us(e.setup)
    line = f"  host's dispatch: {host_s * 1e3:.1f} ms per micro-batch at {us:g} µs per op ({host_us_source(s)})"
    if not e.times.get("host_exposed"):
        return line + "; under the GPU's work, not exposed"
    at = _replanned(e, "host_us", [min(HOST_US_RANGE[1], max(HOST_US_RANGE[0], us * k)) for k in (2.0, 0.5)],
                    lambda v: f"{v:g} µs")
    return (line + f"; it bounds the step: {at}" + ("" if s.host_us else "; --host-us plans your host's "
                                                     "(scripts/host_us_published.py --device cuda measures it)"))


def explain(e: Estimate) -> list[str]:
    """Lines describing every memory term (GiB) and time term (ms) of one estimate, with formulas."""
    s = e.setup
    vpp = f" vpp{s.vpp}" if s.pp > 1 else ""
    docs = f" of {s.doc_len}-token documents" if s.attn_len < s.seq else ""
    lines = [f"{e.label} · {s.stack} · {s.sharding} tp{s.tp} pp{s.pp}{vpp} cp{s.cp} · AC {s.checkpointing} · "
             f"mb {s.micro_batch} x {s.grad_accum} accum · seq {s.seq}{docs} on {s.nodes}x{s.gpus_per_node} "
             f"{s.gpu.key}", "memory per GPU:"]
    for k, v in e.breakdown_gib.items():
        lines.append(f"  {k:<12} {v:8.2f} GiB  {_MEM[k]}")
    lines.append(f"  {'total':<12} {e.memory_gib:8.2f} GiB of {e.capacity_gib:.1f} "
                 f"({'fits' if e.fits else 'does not fit'}); max_memory_allocated should read "
                 f"{e.allocated_gib:.2f} GiB at {_PHASE[e.peak_phase]}, reserved margin {e.reserved_margin_gib:.2f} "
                 f"GiB; " + (f"with room to spare max_memory_reserved about {reserved:.1f} GiB (the loss's and the "
                             "blocks' backward phases added, + 8%)" if (reserved := e.cached_gib * (1 + RESERVED_SHARE))
                             < e.capacity_gib else "max_memory_reserved up to the capacity (near it the allocator "
                             "frees its cache and retries)"))
    lines.append(f"  fit rule: allocated {e.allocated_gib:.2f} + fragmentation reserve {e.reserved_margin_gib:.2f} "
                 f"(min({100 * FRAGMENTATION:.0f}% of allocated, {FRAGMENTATION_CAP / GIB:.0f} GiB)) + CUDA context "
                 f"{CONTEXT_BYTES / GIB:.2f} + NCCL buffers {e.nccl_gib:.2f} = {e.memory_gib:.2f} GiB "
                 f"{'<=' if e.fits else '>'} {e.capacity_gib:.1f} GiB capacity")
    groups = ", ".join(f"{k} {n} ranks" + (f" on {nodes} nodes" if nodes > 1 else "")
                       for k, (n, nodes) in nccl_groups(s).items())
    if groups:
        lines.append(f"  NCCL buffers: one communicator per group ({groups}), each channels x "
                     f"{CONNECTION_BYTES / 2**20:.2f} MiB x (ring + tree connections), outside the allocator")
    t = terms(e.model, s) if e.model is not None else None
    if t and t["te_weight_cache"]:
        lines.append(_te_cache_line(s, t["te_weight_cache"]))
    b = state_bytes_per_param(s)
    opt = ("no optimizer step" if s.optimizer == "none" else f"{s.optimizer} (no state)" if s.optimizer in STATELESS
           else f"{s.optimizer} ({s.optimizer_dtype} states)")
    lines.append(f"  per trained parameter, before sharding: {opt} "
                 f"{b['states']:.3g} B states + {b['grad']} B grad + {b['master']} B master ({s.master_weights})"
                 + (" + 2 B bf16 weights" if b["master"] != 4 or s.sharding not in ("fsdp", "hsdp") else "")
                 + ("; gradients freed in the backward (optimizer in backward)" if s.optimizer_in_backward else ""))
    acts = act_tensors(e.model, s) if getattr(e, "model", None) is not None else None
    if acts is not None:
        kind = (f"eager {s.block_code} block (fp32 RMSNorm, unfused SwiGLU)" if s.block_code and not s.compile else
                f"compiled {s.block_code} block" if s.block_code else
                f"fused kernels but {','.join(s.unfused_ops)} (--unfused-ops)" if s.unfused_ops else "fused kernels")
        lines.append(f"  activations saved per token per block, {kind}: {sum(acts.values()):,.0f} B = "
                     + " + ".join(f"{k} {v:,.0f}" for k, v in acts.items() if v))
        lines.append(f"  + the backward's own gradients as the last block's MLP backward starts (its output's, whole "
                     f"on a TP rank, and its activation's): {backward_grad_bytes(e.model, s) / 2**20:,.0f} MiB"
                     + (", after the loss's peak (not in it)" if e.peak_phase == "loss" else ""))
        if s.keeps_gathered:
            f8 = planned_format(s.precision)
            f8 = " in float8 (torchao's float8 TP casts before the gather), in place of the 16-bit shards" if (
                f8 is not None and f8.fsdp_float8_all_gather) else ""
            lines.append(f"  + {gathered_tp_bytes(e.model, s, acts):,.0f} B per local token: DTensor TP saves the "
                         f"gathered GEMM inputs whole (x{s.tp}{f8}; --sequence-parallel regather keeps the shard)")
    if (s.embed_norm or s.dropout) and acts is not None:
        lines.append(f"  embedding (first stage): {embedding_micro_batches(e.model, s)} micro-batch(es) in flight x "
                     f"{embedding_bytes(e.model, s) / 2**20:,.1f} MiB ("
                     + " + ".join(x for x, on in (("--embed-norm: the norm's input and fp32 statistics", s.embed_norm),
                                                 ("--dropout: its 1-byte mask", s.dropout)) if on) + ")")
    if s.pp > 1 and acts is not None:
        lines.append(_pipeline_line(e))
    lines.append("time per optimizer step (the terms add up to the step):")
    for k, v in e.times.items():
        if v and k not in NOT_ADDED:
            lines.append(f"  {k:<12} {1e3 * v:9.1f} ms  {_TIME[k]}")
    for k in NOT_ADDED:
        if e.times.get(k):
            lines.append(f"  ({k} {1e3 * e.times[k]:.1f} ms: not added, dp_exposed is what the step pays of it) "
                         f"{_TIME[k]}")
    host_s = host_time(e.model, s) if e.model is not None else 0.0
    if host_s > 0:
        lines.append(_host_line(e, host_s))
    if e.times.get("attention") and s.attention != "unfused":
        lines.append(_attention_line(e))
    if s.low_precision and e.model is not None:
        lines.append(_cast_line(e))
    c = getattr(e, "comm", None) or {}
    if c.get("dp"):
        lines.append(f"  data-parallel collectives: {c['dp_calls']:.0f} calls per step ({c['dp_algo']}"
                     + (f", {c['dp_buckets']} buckets" if c.get("dp_buckets") else "") + f"), {1e3 * c['dp']:.1f} ms "
                     f"of which {1e3 * c['dp_latency']:.1f} ms latency (bus bandwidth: nccl-tests "
                     "doc/PERFORMANCE.md; latency: NCCL src/graph/tuning.cc)")
    if s.nodes > 1:
        lines.append(f"  network across nodes: {gbs_text(s.net_gbs)} GB/s per GPU one way, at {LINK_EFF:.0%} of the wire ("
                     + ("--inter-gbs" if s.inter_gbs else f"{s.gpu.key}'s reference system: {s.gpu.nic_source}")
                     + "); the k ranks of a group on one node share k NICs (one ring per rail)")
        if not s.inter_gbs and e.model is not None:
            lines.append(_network_sensitivity(e))
    if c.get("dp_bcast"):
        lines.append(f"  weight broadcasts: {c['dp_bcast_calls']} calls per step, {1e3 * c['dp_bcast']:.1f} ms of which "
                     f"{1e3 * c['dp_bcast_latency']:.1f} ms latency ("
                     + ("one per tensor, a fused-QKV layout's count: torch's ZeroRedundancyOptimizer, "
                        "parameters_as_bucket_view off)"
                        if s.torch_zero else "one per rank owning parameters: min(ranks, tensors), InternLM's)"))
    if c.get("dp_after"):
        how = (f"{c['dp_after_calls']} broadcasts (a tensor does not split evenly over the ranks)"
               if c["dp_after_calls"] > 1 else "one all-gather")
        lines.append(f"  after the step: {how} of the updated weights, {1e3 * c['dp_after']:.1f} ms on the wire, "
                     f"around the host's loops over {c['zero_sliced_tensors']} tensors × {s.shards} ranks (nanotron's "
                     "zero.py; scripts/measure_zero_sliced_host.py); the fp32 gradients all-reduced in one call after "
                     "the backward, synchronously")
    lines.append(f"  {'step':<12} {1e3 * e.step_s:9.1f} ms -> {e.tokens_per_s_per_gpu:,.0f} tokens/s per GPU, "
                 f"{100 * e.mfu:.0f}% MFU vs the bf16 peak")
    lines.extend(f"note: {n}" for n in e.notes)
    return lines
