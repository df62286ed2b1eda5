"""One configuration -> memory per GPU, step time, tokens/s: the memory model (memory.py), the per-op
roofline (throughput.py) and communication (comm.py) put together.

  step = GA × t_mb × (1 + bubble) + optimizer + exposed data-parallel communication (comm.dp_exposed: FSDP
         max(first gather + last reduce-scatter, dp_comm − overlap × GA × t_mb); DDP/ZeRO bucket by bucket;
         DeepSpeed's PipelineEngine all of it) + the SMs NCCL takes from the compute it overlaps (`nccl_sms`)
         + the tied embedding's all-reduce between the pipeline's ends
  t_mb = GEMM + attention + memory-bound + recompute + exposed TP/CP/PP communication + exposed activation offload
         (+ DeepSpeed's BF16_Optimizer fp32 gradient accumulation, throughput.py), and at least the host's
         dispatch of the micro-batch in eager PyTorch (host.py)
  tokens/s/GPU = GA · micro_batch · seq / (tp · pp · cp) / step
  MFU = tokens/s/GPU × (6N + 12·L·H·Q·T) / bf16 peak (nanoGPT/torchtitan's convention; FP8 runs are
  reported against the bf16 peak too, so the figures compare; LoRA: 4N + 6·adapters, `model_flops_per_token`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from overdrive.plan.attention import attention_kernel, head_dim_refusal
from overdrive.plan.collectives import PCIE_GBS, nccl_channels
from overdrive.plan.engine_memory import nccl_buffer_bytes
from overdrive.plan.host import host_note, host_time, host_us, zero_sliced_ops
from overdrive.plan.comm import comm_times, dp_exposed
from overdrive.plan.memory import (CONTEXT_BYTES, FRAGMENTATION, GIB, lora_params, memory_breakdown,
                                   reserve_bytes, terms)
from overdrive.plan.setup import TrainSetup, check_layout, fallback_precision, gbs_text, needs_blackwell
from overdrive.plan.specs import ModelSpec
from overdrive.plan.throughput import SMS, compute_times

__all__ = ["Estimate", "estimate", "model_flops_per_token", "GIB", "CONTEXT_BYTES", "FRAGMENTATION"]


@dataclass(kw_only=True)
class Estimate:
    setup: TrainSetup
    breakdown_gib: dict[str, float]
    memory_gib: float
    """What the GPU must hold: allocated + fragmentation margin + CUDA context + NCCL's buffers."""
    allocated_gib: float
    """What torch.cuda.max_memory_allocated() should read at the peak."""
    reserved_margin_gib: float
    nccl_gib: float = 0.0
    """NCCL's connection buffers: outside the allocator (nvidia-smi sees them, max_memory_reserved does not)."""
    cached_gib: float = 0.0
    """The loss's and the blocks' backward phases added (`memory.terms`): what max_memory_reserved rows are compared
    with, RESERVED_SHARE over it."""
    peak_phase: str = ""
    """Where the memory peaks: "loss" (the loss's backward), "blocks" (the blocks' backward: the recompute buffer and
    its gradients), "end" (the backward's end, every gradient beside one block, or the optimizer's step)."""
    capacity_gib: float
    fits: bool
    step_s: float
    compute_s: float
    comm_s: float
    times: dict[str, float]
    tokens_per_s_per_gpu: float
    mfu: float
    requested_precision: str
    notes: list[str] = field(default_factory=list)
    model: ModelSpec | None = None
    """The model planned (for --explain's per-tensor activation line)."""
    comm: dict = field(default_factory=dict)
    """comm.comm_times' details (calls, latency, algorithm) for --explain."""

    @property
    def headroom_gib(self) -> float:
        return self.capacity_gib - self.memory_gib

    @property
    def label(self) -> str:
        """The precision that was planned, with what was asked when it fell back ("nvfp4→fp8")."""
        p = self.setup.precision
        return p if p == self.requested_precision else f"{self.requested_precision}→{p}"


VPP_MAX = 16
"""Largest virtual-stage count searched (Megatron-Bridge's recipes use 2-10; past that the bubble is gone and
only the extra sends remain)."""


def vpp_choices(m: ModelSpec, s: TrainSetup) -> list[int]:
    """Virtual stages to try: to interleave at all, micro-batches in multiples of pp (both schedules' need);
    Megatron splits the blocks evenly (every chunk the same count), torch.distributed.pipelining (torchtitan)
    takes uneven chunks, so the pytorch stack tries every v that leaves each chunk a block."""
    slots = m.n_layer + (2 if s.embedding_in_pipeline_split else 0)
    out = [1]
    # DeepSpeed's PipelineEngine, Megatron-LLaMA's ZeRO-2 (--stack megatron --sharding zero2): 1F1B only
    if s.grad_accum % s.pp == 0 and not s.deepspeed_pipeline and not (s.stack == "megatron" and s.sharding == "zero2"):
        even = s.stack == "megatron"
        out += [v for v in range(2, VPP_MAX + 1) if slots >= s.pp * v and (not even or slots % (s.pp * v) == 0)
                and s.recompute_layers <= slots // (s.pp * v)]
    return out


def model_flops_per_token(m: ModelSpec, s: TrainSetup) -> float:
    """The FLOPs a token's training step does: 6N + 12·L·H·Q·T (ModelSpec.flops_per_token; T the document's
    tokens with --doc-len, which is what document-masked attention computes); with LoRA the
    frozen base weights get no weight gradient (forward and input gradient only, 4N) and the adapters their 6."""
    if not s.lora_rank:
        return m.flops_per_token(s.attn_len)
    return m.flops_per_token(s.attn_len) - 2 * m.n_params_matmul() + 6 * lora_params(m, s.lora_rank)


def estimate(m: ModelSpec, s: TrainSetup, *, cal: dict | None = None) -> Estimate:
    """Memory and speed of one configuration. With `s.vpp` None and pp > 1 the virtual stages are searched:
    the fastest that fits (else the fastest), named in the notes."""
    if s.vpp is None:
        tried = [_estimate(m, dataclasses.replace(s, vpp=v), cal) for v in vpp_choices(m, s)]
        fit = [e for e in tried if e.fits] or tried
        best = max(fit, key=lambda e: e.tokens_per_s_per_gpu)
        if len(tried) > 1:
            why = f"the fastest that {'fits' if best.fits else 'was tried'} of {[e.setup.vpp for e in tried]}"
        elif s.deepspeed_pipeline:
            why = "no interleaving: DeepSpeed's PipelineEngine runs 1F1B only (deepspeed/runtime/pipe/schedule.py)"
        elif s.grad_accum % s.pp:
            why = (f"no interleaving: {s.grad_accum} micro-batches per step are not a multiple of --pp {s.pp} "
                   "(the interleaved schedule's need)")
        else:
            slots = m.n_layer + (2 if s.embedding_in_pipeline_split else 0)
            why = (f"no interleaving: {slots} pipeline slots do not split evenly over --pp {s.pp} x v for any v > 1 "
                   "(Megatron's need)"
                   + ("" if s.embedding_in_pipeline_split else
                      "; --embedding-in-pipeline-split counts the embedding and the loss as slots"))
        best.notes.insert(0, f"--vpp not given: {best.setup.vpp} virtual stages chosen, {why}")
        return best
    return _estimate(m, s, cal)


def nccl_sms(s: TrainSetup, c: dict, exposed: float, idle: float = 0.0) -> float:
    """Seconds the compute loses to the SMs NCCL holds while it overlaps the data-parallel collectives: each
    ring channel is one CTA on one SM (collectives.nccl_channels: 24 inside an A100/H100 node, 16 across
    nodes), so for the hidden part of the communication the compute runs on SMs − channels of the SMs. When the
    communication is what the step waits for (exposed beyond its first and last call), the compute has that
    much slack before the slowdown shows; so has it while the GPU waits for the host (`idle`, host.py)."""
    hidden = max(0.0, c["dp"] - exposed)
    if hidden <= 0:
        return 0.0
    nvlink = s.gpu.nvlink_gbs > PCIE_GBS
    share = nccl_channels(s.gpu.sm[0], c["dp_nodes"], nvlink=nvlink) / SMS.get(s.gpu.key, 132)
    return max(0.0, hidden * share - max(0.0, exposed - c["dp_edge"]) - idle)


def _estimate(m: ModelSpec, s: TrainSetup, cal: dict | None) -> Estimate:
    check_layout(m, s)
    notes = []
    asked = s.precision
    fb = fallback_precision(asked, s.gpu)
    if fb:
        need = "SM 10.x" if needs_blackwell(asked) else "FP8 tensor cores (SM >= 8.9)"
        notes.append(f"{asked} is not supported on {s.gpu.key} (needs {need}): planned as {fb}, what would run")
        s = dataclasses.replace(s, precision=fb)
    refused = head_dim_refusal(attention_kernel(s), m.head_dim, s.gpu.sm)   # "" for the unfused GEMMs: no limit
    if refused:
        notes.append(refused + "; planned as if it ran")
    if s.pp > 1 and s.sharding in ("fsdp", "hsdp") and s.stack == "pytorch":
        notes.append("FSDP under pipelining: each stage keeps its parameters gathered and its gradients unsharded "
                     "in fp32 through the step (torch.distributed.pipelining); torchtitan's published 405B PP runs "
                     "are within -26%/+22% of this memory estimate (docs/plan-validation.md)")
    bd = memory_breakdown(m, s)
    t = terms(m, s)
    if t["startup_bytes"]:
        step_peak = (t["allocated"] - t["startup"]) / GIB
        notes.append(f"--no-zero-init: deepspeed.initialize puts the whole model ({t['startup_bytes'] / GIB:.1f} GiB) "
                     f"on each GPU before partitioning it, {'above' if t['startup'] else 'under'} the step's "
                     f"{step_peak:.1f} GiB allocated; built under deepspeed.zero.Init it never is")
    total = sum(bd.values())
    ct = compute_times(m, s, cal)
    cm = comm_times(m, s, ct["attention"])
    t_mb = (ct["gemm"] + ct["attention"] + ct["memory"] + ct["recompute"] + ct["grad_accum"] + cm["tp"] + cm["cp"]
            + cm["pp"])
    offload_exposed = max(0.0, ct["offload"] - t_mb)
    if offload_exposed > 0:
        notes.append(f"activation offload: {ct['offload'] * 1e3:.0f} ms of host transfer per micro-batch vs "
                     f"{t_mb * 1e3:.0f} ms of compute to hide it under")
    t_mb += offload_exposed
    # eager PyTorch: the GPU cannot run ahead of the host's dispatch (host.py)
    host = host_time(m, s)
    host_exposed = max(0.0, host - t_mb)
    if host_exposed > 0:
        notes.append(host_note(m, s, host, t_mb))
    t_mb += host_exposed
    if s.zero_sliced and s.shards <= 1:
        notes.append("--zero-sliced on one data-parallel rank: nothing is sliced, reduced or gathered; nanotron's fp32 "
                     "accumulator and its pass after each backward remain")
    n = s.grad_accum
    bubble = (s.pp - 1) / (s.vpp * n) if s.pp > 1 else 0.0
    compute = n * t_mb * (1 + bubble) + ct["optimizer"]
    # FSDP reduces every micro-batch, under that micro-batch; DDP and ZeRO-1/2 once per step, bucket by bucket
    # (comm.dp_exposed); every call carries its latency (collectives.py)
    # the forward: its compute and its half of the exposed TP/CP collectives and pipeline sends
    exposed, hide = dp_exposed(s, cm, t_mb, bubble, ct["forward"] + (cm["tp"] + cm["cp"] + cm["pp"]) / 2)
    # --zero-sliced, after the backward: the GPU runs the gradients' all-reduce, then the weights' all-gather (then
    # the copies back, whose GPU time is not measured); the host, which nothing makes wait for the all-reduce,
    # slices and flattens, then enqueues the copies: the next forward starts when both are done (comm.py, host.py)
    pre, post = (x * host_us(s) * 1e-6 for x in zero_sliced_ops(s, cm["zero_sliced_tensors"]))
    after = max(exposed + cm["dp_after"], pre + post) - exposed if cm["dp_after"] else 0.0
    if after > 0.05 * (n * t_mb):
        uneven = (f", as {cm['dp_after_calls']} broadcasts: a tensor does not split evenly over the ranks"
                  if cm["dp_after_calls"] > 1 else "")
        notes.append(f"nanotron's sliced ZeRO-1: after the backward, beyond the gradients' all-reduce, "
                     f"{after * 1e3:.0f} ms with nothing to hide under: the host's slices, flattens and copies of "
                     f"{cm['zero_sliced_tensors']} tensors {s.shards} ways ({(pre + post) * 1e3:.0f} ms at "
                     f"{host_us(s):g} µs per op, in ops' worth timed on a CPU host; the copies' GPU time not "
                     f"counted) against the weights' all-gather ({cm['dp_after'] * 1e3:.0f} ms on the wire{uneven}); "
                     "a contiguous ZeRO-1, Megatron's or DeepSpeed's, moves one buffer per bucket")
    if exposed > 0.05 * (n * t_mb) and cm["dp"] > s.overlap * hide:
        lat = (f", {cm['dp_latency'] * 1e3:.0f} ms of it latency over {cm['dp_calls']:.0f} calls"
               if cm["dp_latency"] > 0.2 * cm["dp"] else "")
        unhidden = ("none of it hidden: with --no-overlap-grad-reduce nothing overlaps the compute" if not s.overlap_grad_reduce
                    else "none of it hidden: DeepSpeed's PipelineEngine reduces after the pipeline flush"
                    if s.deepspeed_pipeline else "none of it hidden: nanotron all-reduces its fp32 gradients after the "
                    "backward" if s.zero_sliced else f"vs {hide * 1e3:.0f} ms of compute to hide it under")
        notes.append(f"communication-bound: {cm['dp'] * 1e3:.0f} ms of data-parallel communication per step{lat}, "
                     f"{unhidden}")
    if s.pp_keep_outputs and (s.pp == 1 or s.stack != "pytorch" or s.deepspeed_pipeline):
        notes.append("--pp-keep-outputs changes nothing here: " + (
            "no pipeline (--pp 1)" if s.pp == 1 else "DeepSpeed's PipelineEngine keeps its own (--deepspeed-pipeline)"
            if s.deepspeed_pipeline else f"--stack {s.stack}'s last stage returns the loss alone"))
    if not s.overlap_grad_reduce and cm["dp"] <= 0:
        notes.append("--no-overlap-grad-reduce changes nothing here: one data-parallel rank, no gradient reduce")
    if s.fp8_all_gather and s.stack == "pytorch" and (not s.gathers_fp8 or s.sharding not in ("fsdp", "hsdp")):
        notes.append("--fp8-all-gather changes nothing here: torchao's float8 all-gather is FSDP2's (--sharding "
                     "fsdp/hsdp), for per-tensor scaling (--precision fp8) only")
    if s.sp_regather and (s.tp == 1 or s.stack == "megatron"):
        notes.append("--sequence-parallel regather changes nothing here: " + (
            "no tensor parallelism" if s.tp == 1 else "Megatron's sequence parallelism regathers already"))
    if s.doc_len > s.seq:
        notes.append(f"--doc-len {s.doc_len} is longer than the sequence: documents are cut at {s.seq} tokens, "
                     "each sequence one document")
    elif s.doc_len and s.attention == "unfused":
        notes.append("--doc-len changes no time here: unfused attention computes every masked score of the s × s "
                     f"(MFU counts only the documents' s·{s.doc_len})")
    if s.nodes == 1 and s.inter_gbs is not None:
        notes.append(f"--inter-gbs {gbs_text(s.inter_gbs)} changes nothing here: one node, nothing crosses the network")
    if s.host_us is not None and host_exposed <= 0 and not (cm["dp_after"] and pre + post > exposed + cm["dp_after"]):
        notes.append(f"--host-us {s.host_us:g} changes nothing here: " + (
            f"the host's {host * 1e3:.1f} ms per micro-batch stay under its {t_mb * 1e3:.1f} ms of GPU work" if host
            else "no host floor is planned for " + ("the megatron stack" if s.stack != "pytorch"
                                                    else "compiled code without ZeRO-3's hooks")))
    if s.world == 1 and s.intra_gbs is not None:
        notes.append(f"--intra-gbs {gbs_text(s.intra_gbs)} changes nothing here: one GPU, nothing to communicate")
    if cm["tp_nodes"] > 1:
        notes.append(f"tensor parallel {s.tp} spans {cm['tp_nodes']} nodes: its activations cross the "
                     f"{gbs_text(s.net_gbs)} GB/s per-GPU network ({n * cm['tp'] * 1e3:.0f} ms per step, not overlapped)")
    if bubble > 0.1:
        notes.append(f"pipeline bubble {100 * bubble:.0f}%: more micro-batches per step or --vpp shrink it")
    # the tied embedding's gradient, all-reduced between the first and the last stage after the data-parallel
    # reduction, on the stage that finishes last (comm.py: nothing left to hide it under)
    sms = nccl_sms(s, cm, exposed, n * host_exposed)
    # --zero-broadcast: the owners' broadcasts after the step, waited for before the step ends (comm.py)
    bcast = cm["dp_bcast"]
    if bcast > 0.05 * (n * t_mb):
        notes.append(f"{cm['dp_bcast_calls']} broadcasts of the updated weights per step, all exposed: "
                     f"{bcast * 1e3:.0f} ms, {cm['dp_bcast_latency'] * 1e3:.0f} ms of it latency (without "
                     "--zero-broadcast, a ZeRO-1 that all-gathers pays one call per bucket)")
    step = compute + exposed + sms + cm["embed"] + bcast + after
    tokens = n * s.micro_batch * s.seq / (s.tp * s.pp * s.cp)
    tps = tokens / step
    mfu = tps * model_flops_per_token(m, s) / (s.gpu.bf16_tflops * 1e12)
    times = {"gemm": n * ct["gemm"], "attention": n * ct["attention"], "memory_bound": n * ct["memory"],
             "recompute": n * ct["recompute"], "optimizer": ct["optimizer"], "bubble": n * t_mb * bubble,
             "offload_exposed": n * offload_exposed, "host_exposed": n * host_exposed, "tp_exposed": n * cm["tp"],
             "cp_exposed": n * cm["cp"],
             "pp_p2p": n * cm["pp"], "dp_comm": cm["dp"], "dp_latency": cm["dp_latency"], "dp_exposed": exposed,
             "nccl_sms": sms, "embed_allreduce": cm["embed"], "fp32_grad_accum": n * ct["grad_accum"],
             "zero_bcast_exposed": bcast, "zero_sliced_exposed": after}
    return Estimate(setup=s, breakdown_gib=bd, memory_gib=total, allocated_gib=t["allocated"] / GIB,
                    reserved_margin_gib=reserve_bytes(t["allocated"]) / GIB, capacity_gib=s.gpu.mem_gib,
                    nccl_gib=nccl_buffer_bytes(s) / GIB, cached_gib=t["cached"] / GIB, peak_phase=t["peak_phase"],
                    fits=total <= s.gpu.mem_gib, step_s=step, compute_s=compute,
                    comm_s=cm["dp"] + cm["dp_bcast"] + cm["dp_after"] + cm["tp"] + cm["cp"],
                    times=times, tokens_per_s_per_gpu=tps, mfu=mfu, requested_precision=asked, notes=notes, model=m,
                    comm=cm)
