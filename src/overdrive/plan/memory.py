"""Memory per GPU for one training configuration. Every term says where its formula comes from.

States (bytes per GPU; P_l = parameters on this GPU after tensor and pipeline parallelism: its pipeline stage's
(`pipeline.stage_params`: the blocks, the embedding on the first stage, the head on the last) / tp;
S = GPUs sharing the sharded states, `TrainSetup.shards`):
  params      fp32 master weights 4·P_l, /S under FSDP (ZeRO-3). ZeRO-1/2 and DDP keep the compute copy
              on every rank (2·P_l, Megatron's layout; plain DDP under autocast: fp32 4·P_l + the bf16 copies
              autocast caches for backward, 2·P_l) and the fp32 master in the optimizer (4·P_l / S).
              --pure-bf16: 2 bytes, no master. LoRA: frozen bf16 base (2·P_l, /S under FSDP).
  grads       fp32 4·P_l (2 with --pure-bf16 or --grad-dtype bf16, Megatron's grad_reduce_in_fp32=False), /S
              under ZeRO-2/3 (reduce-scattered); Megatron's distributed optimizer (ZeRO-1) keeps the whole buffer.
              PyTorch DDP (--sharding none over several ranks) allocates its reducer's buckets once, a gradient's
              size in the parameters' dtype, alive all run beside the gradients (reducer.cpp initialize_buckets,
              gradient_as_bucket_view False by default: `ddp_bucket_bytes`). nanotron's ZeRO-1 (--zero-sliced) has
              no DDP; it accumulates into an fp32 buffer of every parameter's gradient that it never frees
              (gradient_accumulator.py build_grad_buffers), beside which the 16-bit gradients of a backward live
              until the accumulation after it, and the after-step all-gather's flattened outputs and NCCL's flat
              buffer (two 16-bit copies of the weights) while the activations are gone (`_zero_sliced_peak`).
  optimizer   n·b·P_l, n states per parameter (--optimizer: AdamW 2, Lion 1, SGD with momentum 1, Adafactor's
              factored moment ~0) of b = 4 / 2 / 1 bytes (fp32 / bf16 / 8-bit), /S under any ZeRO.
              --master-weights remainder: 16-bit weights + the 16 low bits of the fp32 master (Apex/TE
              store_param_remainders), 2 bytes in place of 4; none = --pure-bf16.
              --optimizer-in-backward (torchtune's optimizer_in_bwd): each gradient is freed as soon as its
              parameter is stepped, so only the largest tensor's gradient is alive.
              --offload optimizer moves states and the fp32 master to the CPU; --offload params also the
              weights and grads (FSDP CPUOffloadPolicy), leaving the gathered blocks.
  activations per layer, 16-bit, flash attention (no s² scores): Korthikanti et al. 2022
              ("Reducing Activation Recomputation in Large Transformer Models", eq. 1 gives 34·s·b·h with
              dropout and materialised scores), recounted tensor by tensor for what autograd saves:
                s·b·(h [norm1 in] + h [qkv in] + (h + 2·kv) [q, k, v] + h [attention out] + h [norm2 in]
                     + h [mlp in] + F·(2 if gated else 1) [fc outs] + F [activation out])
              / (tp·cp) (sequence parallel, context parallel; PyTorch's DTensor TP keeps the gathered GEMM
              inputs whole: `engine_memory.gathered_tp_bytes`); FP8 activation storage (Transformer Engine)
              keeps 1-byte copies of the GEMM inputs (qkv in, mlp in, activation out) and of the projection's
              input beside the 16-bit attention output flash attention keeps (`act_tensors`).
              --block-code torchtune|hf (eager PyTorch, --no-compile): what torchtune's or transformers' eager
              Llama block saves, op by op (`eager_act_tensors`): fp32 RMSNorm copies, four F-wide SwiGLU tensors,
              k and v copied to every head (torchtune) or shared (transformers' SDPA enable_gqa).
              Megatron selective recompute (--recompute-modules) drops what the named modules keep:
              core_attn flash's output copy (FP8 storage only), mlp its input, fc outputs and activation,
              layernorm the 16-bit norm outputs (with FP8 storage the GEMMs keep their own copies).
              Megatron full recompute (--recompute-layers N, block method) keeps only the input of the first
              N blocks of each (virtual) pipeline chunk, plus one block being recomputed.
              Activation offload (--offload-activations N, Megatron cpu_offloading_num_layers): N blocks'
              activations go to the host after their forward; the GPU keeps the rest and one in flight.
              Checkpointing keeps each checkpointed block's input (s·b·h) and recomputes one block at a
              time; selective-op keeps the block input, attention output and every other matmul output; never
              more than no checkpointing (one block per stage: the buffer is that block's own activations).
              The backward adds its own gradients on top: s·b·(h + F/tp)/cp (`backward_grad_bytes`).
              Pipeline 1F1B: the first stage holds pp micro-batches in flight; interleaved (Megatron's schedule)
              its warm-up runs (pp−1)·2 + (v−1)·pp chunk forwards, then one more, cycling over its v chunks
              pp micro-batches at a time — ×(1 + (pp−1)/(pp·v)) for even chunks (Korthikanti et al.), counted
              chunk by chunk so a first chunk that also holds the embedding (--embedding-in-pipeline-split) is
              one block short. The plan is the busiest stage's, all of its states and its activation peak
              counted: the first (the most micro-batches in flight, the embedding, with --embed-norm and
              --dropout what the embedding keeps of each), or the last (one micro-batch in flight, the head, the
              loss, and with --pp-keep-outputs every micro-batch's fp32 output, kept for torch.distributed.
              pipelining's merged step() output), or a middle one with more blocks (1F1B: every stage compared; interleaved: the two
              ends); under DeepSpeed's PipelineEngine each stage also keeps its outputs in flight: `pipeline.py`.
              --dropout: the 1-byte masks after the attention projection and the MLP (Korthikanti et al.'s two
              s·b·h mask rows; on every TP rank without sequence parallelism) and, with unfused attention, the
              scores' mask and dropped-out copy.
  logits      s·b·V/(tp·cp) × 12 bytes at the start of backward in eager cross-entropy on .float() logits:
              log_softmax's saved fp32 output (4) + the incoming fp32 grad (4) + the grad it produces (4);
              ~12 GB for V = 128K, s = 8192 — why long context on big vocabularies OOMs at the head.
              --loss hf (Hugging Face: the model output keeps the fp32 logits through the backward): 16 bytes.
              --loss compiled (torch.compile'd loss, torchtitan's default since 2025): bf16 logits + bf16
              grad, 4 bytes. --loss inplace (Transformer Engine's triton cross-entropy, which Megatron-Bridge's
              perf recipes use: its backward overwrites the logits with their gradient): 2 bytes.
              --loss fused materialises one 1,024-token chunk at a time. --stack megatron with --loss standard:
              Megatron-Core's vocab-parallel cross-entropy, in place on one fp32 copy: 6 bytes (16-bit logits + the
              fp32 copy; then the copy as gradient + its 16-bit cast).
              The loss's peak comes first in the backward: its tensors are freed before the last block's recompute
              buffer and the backward's own gradients exist, beside which only what the training loop keeps of the
              model output stays (`logits.logits_kept_bytes`: --loss hf's fp32 logits; the engines planned here
              free the output). The activation peak is the stored activations + the larger of the two (`terms`'
              peak_phase says which); `cached`, the two added, is what max_memory_reserved rows are compared with.
  buffers     FSDP: two blocks' parameters all-gathered at once (current + prefetched; compute dtype, 1
              byte with FP8 all-gather) + one block's fp32 gradients before reduce-scatter. --stack megatron in
              low precision: Transformer Engine's cached quantised weights and transposes (`engine_memory`).

What the allocator counter sees (`torch.cuda.max_memory_allocated`) is `allocated`: the states, the
activations at their peak and the buffers. Gradients are None at the activation peak when the optimizer
zeroes with set_to_none (torch's default) and there is one micro-batch per step, so then the peak is
max(activations, gradients + one block). The GPU needs more: the CUDA context and library workspaces
(`CONTEXT_BYTES`), NCCL's connection buffers (`engine_memory.nccl_buffer_bytes`) and the caching allocator's
fragmentation, a reserve of `FRAGMENTATION` of allocated but never more than `FRAGMENTATION_CAP` (a fixed share
would refuse big-memory runs that completed: 8% of 177 GiB is 14 GiB, more than the allocator of a 405B run on
GB200 ever kept in reserve). A configuration fits when
allocated + reserve + context + NCCL <= capacity; `--explain` prints each term.
"""

from __future__ import annotations

from overdrive.plan.activations import REPLICATED_WITHOUT_SP, act_tensors, eager_act_tensors
from overdrive.plan.choices import NO_STEP
from overdrive.plan.engine_memory import gathered_tp_bytes, nccl_buffer_bytes, te_weight_cache_bytes
from overdrive.plan.logits import logits_bytes as _logits, logits_kept_bytes
from overdrive.plan.pipeline import (embedding_bytes, embedding_micro_batches, pipeline_blocks_in_flight,
                                     pipeline_outputs_bytes, stage_blocks, stage_outputs_bytes, stage_params,
                                     zero_sliced_tensors)
from overdrive.plan.setup import OPTIMIZER_STATES, TrainSetup
from overdrive.plan.specs import ModelSpec
from overdrive.plan.zero3 import zero3_buffers, zero3_startup_bytes, zero3_states, zero3_step_bytes

__all__ = ["memory_breakdown", "peak_allocated", "GIB", "CONTEXT_BYTES", "FRAGMENTATION", "FRAGMENTATION_CAP",
           "RESERVED_SHARE",
           "reserve_bytes", "OPT_BYTES",
           "act_bytes_per_layer", "backward_grad_bytes", "eager_act_tensors", "master_bytes", "largest_param", "state_bytes_per_param", "act_tensors", "recomputed_blocks", "pipeline_blocks_in_flight", "lora_params", "terms",
           "ddp_bucket_bytes"]

GIB = 2**30
OPT_BYTES = {"fp32": 4, "bf16": 2, "8bit": 1 + 4 / 256}
"""Bytes per state element. 8-bit: torchao's AdamW8bit (torchao/optim/subclass_8bit.py, OptimState8bit): a uint8
code per element and an fp32 scale per block of 256 (block_size=256), plus a 256-entry fp32 code map per state
tensor (negligible); tensors under 4,096 elements keep plain states (the norms, negligible). bitsandbytes'
blockwise 8-bit states carry one fp32 absmax per 2,048 (1 + 4/2048): the same to 1.5%."""
CONTEXT_BYTES = 1 * GIB
FRAGMENTATION = 0.05
FRAGMENTATION_CAP = 3 * GIB
RESERVED_SHARE = 0.08
"""What `max_memory_reserved` reads with room to spare over `cached` (`terms`: the loss's and the blocks' backward
phases added), set on torchtitan's FSDP runs: the allocator keeps freed blocks while nothing asks, and the runs that
publish max_memory_reserved read nearer the two phases added than the peak (54 runs: 5.1% median against 5.5%), an
empirical basis, not a traced mechanism (the allocator can split a freed block for smaller requests); near capacity
it frees its cache and retries, so the fit rule charges the allocated peak and only the bounded reserve above."""
def master_bytes(s: TrainSetup) -> int:
    """Bytes per parameter of the master weights beside the 16-bit compute copy (0: none kept)."""
    return {"fp32": 4, "remainder": 2, "none": 0}[s.master_weights]


def largest_param(m: ModelSpec) -> int:
    """Elements of the model's largest weight tensor (the embedding for most LLMs, else an MLP matrix)."""
    return max(m.vocab * m.hidden, m.hidden * m.ffn, m.hidden * (m.q_dim + 2 * m.kv_dim))


def state_bytes_per_param(s: TrainSetup) -> dict[str, float]:
    """What each trained parameter costs before sharding: master weights, gradient, optimizer states (the
    16-bit compute copy aside), as --explain prints them."""
    grad = s.grad_bytes
    st = OPT_BYTES[s.optimizer_dtype] if not s.pure_bf16 else min(OPT_BYTES[s.optimizer_dtype], 2)
    return {"master": master_bytes(s), "grad": grad, "states": OPTIMIZER_STATES[s.optimizer] * st}


def reserve_bytes(allocated: float) -> float:
    """The caching allocator's fragmentation reserve over `allocated` bytes: a share, bounded."""
    return min(FRAGMENTATION * allocated, FRAGMENTATION_CAP)


def lora_params(m: ModelSpec, rank: int) -> int:
    """Trainable LoRA parameters: r·(in + out) for each linear of each block."""
    h, q, kv, F = m.hidden, m.q_dim, m.kv_dim, m.ffn
    shapes = [(h, q), (h, kv), (h, kv), (q, h)] + [(h, F)] * (2 if m.gated_mlp else 1) + [(F, h)]
    return m.n_layer * sum(rank * (a + b) for a, b in shapes)


def act_bytes_per_layer(m: ModelSpec, s: TrainSetup) -> float:
    """Bytes autograd keeps for one block of one micro-batch on one GPU (no block checkpointing)."""
    tokens = s.seq * s.micro_batch / (s.tp * s.cp)
    t = act_tensors(m, s)
    if s.tp > 1 and not s.sequence_parallel:
        rep = sum(v for k, v in t.items() if k in REPLICATED_WITHOUT_SP)
        return tokens * (sum(t.values()) - rep) + tokens * s.tp * rep
    return tokens * (sum(t.values()) + gathered_tp_bytes(m, s, t))


def recomputed_blocks(m: ModelSpec, s: TrainSetup) -> float:
    """Blocks per pipeline stage that Megatron's block-method full recompute checkpoints: the first
    `recompute_layers` of each of the vpp chunks of n_layer/(pp·vpp) blocks."""
    chunk = m.n_layer / (s.pp * s.vpp)
    return min(s.recompute_layers, chunk) * s.vpp


def _activations(m: ModelSpec, s: TrainSetup, rank: int = 0) -> tuple[float, float, float]:
    """(activation bytes at the peak on pipeline rank `rank`, bytes of one block during its backward, the part of
    the first that exists only once the blocks' backward runs: the recompute buffer and the backward's gradients)."""
    per_layer = act_bytes_per_layer(m, s)
    width = 4 if s.precision == "fp32" else 2
    tokens = s.seq * s.micro_batch / (s.tp * s.cp)
    # a checkpointed block's input, split over the TP ranks even without SP: Megatron's --distribute-checkpointed-
    # activations (2021); whole on every TP rank without it (setup.partition_activations False)
    block_input = tokens * m.hidden * width * (s.tp if not (s.sequence_parallel or s.partition_activations) else 1)
    L = m.n_layer / s.pp
    if s.recompute_layers:
        k = recomputed_blocks(m, s)
        acts = k * block_input + (L - k) * per_layer + per_layer
    elif s.checkpointing == "none":
        acts = L * per_layer
    elif s.checkpointing == "full":
        acts = L * block_input + per_layer
    elif s.checkpointing == "selective":
        k = L // 2
        acts = k * block_input + (L - k) * per_layer + per_layer
    else:  # selective-op: block input, attention output, every other matmul output
        h, kv, F = m.hidden, m.kv_dim, m.ffn
        mm_out = m.q_dim + 2 * kv + h + F * (2 if m.gated_mlp else 1) + h
        acts = L * tokens * (h * s.tp // s.sp + m.q_dim + mm_out / 2) * width + per_layer
    # Checkpointing never keeps more than no checkpointing: with one block per stage (or every 2nd of one) the
    # recompute buffer above is that block's own activations, whose input is the one kept, not a second copy.
    acts = min(acts, L * per_layer)
    # the recompute buffer: one block's activations, rebuilt in the backward (none where nothing is checkpointed)
    buf = per_layer if (s.recompute_layers or s.checkpointing != "none") and acts < L * per_layer else 0.0
    if s.offload_activations:
        # The offloaded blocks leave the GPU after their forward; one block is in flight at a time (TE's
        # double-buffered offload handler), so the GPU holds the other blocks and one more, and the recompute buffer
        acts = (L - min(s.offload_activations, L) + 1) * (acts - buf) / L + buf
    if s.pp > 1:
        # the stored part scales with the micro-batches in flight, the recompute buffer is one block at a time, and
        # never more than the blocks in flight keep unchecked (a stage of one block: the buffer is that block)
        flight = pipeline_blocks_in_flight(m, s, rank)
        if (acts - buf) * flight / L + buf >= flight * per_layer:
            acts, buf = flight * per_layer, 0.0
        else:
            acts = (acts - buf) * flight / L + buf
    # the embedding's own saved tensors (never recomputed) and DeepSpeed's kept stage outputs: plan/pipeline.py
    if rank == 0:
        acts += embedding_micro_batches(m, s) * embedding_bytes(m, s)
    grad = backward_grad_bytes(m, s)
    return acts + grad + stage_outputs_bytes(m, s, rank), per_layer, buf + grad


def backward_grad_bytes(m: ModelSpec, s: TrainSetup) -> float:
    """The backward's own gradients beside what the last block saved, as its MLP's backward starts: the gradient
    of the block's output, whole-sequence on a TP rank (the row-parallel linear's backward gathers it), and the
    one the down projection writes for the activation's output (F/tp per token)."""
    return s.seq * s.micro_batch / s.cp * (4 if s.precision == "fp32" else 2) * (m.ffn / s.tp + m.hidden)


def memory_breakdown(m: ModelSpec, s: TrainSetup) -> dict[str, float]:
    """GiB per GPU: params, grads, optimizer, activations (incl. logits), other (buffers, context, fragmentation,
    and what DeepSpeed's start-up with a model built whole holds beyond the step: `zero3.zero3_startup_bytes`)."""
    d = terms(m, s)
    other = d["buffers"] + d["startup"] + CONTEXT_BYTES + nccl_buffer_bytes(s) + reserve_bytes(d["allocated"])
    # Gradients count only as far as they sit on top of the activations at the peak (see above), so
    # the terms add up to what the GPU needs.
    out = {"params": d["params"], "grads": d["grads_at_peak"], "optimizer": d["optimizer"],
           "activations": d["activations"] + d["logits"], "other": other}
    return {k: v / GIB for k, v in out.items()}


def peak_allocated(m: ModelSpec, s: TrainSetup) -> dict[str, float]:
    """GiB: what `max_memory_allocated` should read (`allocated`), the reserved margin on top of it and what
    lies outside the allocator (the CUDA context, NCCL's buffers)."""
    d = terms(m, s)
    return {"allocated": d["allocated"] / GIB, "reserved_margin": reserve_bytes(d["allocated"]) / GIB,
            "context": CONTEXT_BYTES / GIB, "nccl": nccl_buffer_bytes(s) / GIB}


def _trained(m: ModelSpec, s: TrainSetup, rank: int) -> tuple[float, float]:
    """(parameters, LoRA parameters) of pipeline rank `rank` on one GPU (`pipeline.stage_params`, / tp)."""
    P = stage_params(m, s)[rank] / s.tp
    T = lora_params(m, s.lora_rank) * stage_blocks(m, s)[rank] / (m.n_layer * s.tp) if s.lora_rank else P
    return P, T


def _states(m: ModelSpec, s: TrainSetup, rank: int = 0) -> tuple[float, float, float]:
    """(params, grads, optimizer) bytes per GPU on pipeline rank `rank` (see the module docstring)."""
    P, T = _trained(m, s, rank)
    S, zero3 = s.shards, s.shards_weights
    opt_b, n_states, master_b = OPT_BYTES[s.optimizer_dtype], OPTIMIZER_STATES[s.optimizer], master_bytes(s)
    if s.sharding == "zero3" and not (s.lora_rank or s.pure_bf16 or s.optimizer_in_backward):
        return zero3_states(P, S, s, n_states * opt_b, master_b)   # DeepSpeed's partitions: zero3.py
    if s.lora_rank:
        T = T / (S if zero3 else 1)
        params = 2 * P / (S if zero3 else 1) + 4 * T
        grads, opt = 4 * T, n_states * opt_b * T
    elif s.pure_bf16:
        params = 2 * P / (S if zero3 else 1)
        grads = 2 * P / (S if s.sharding != "none" and s.sharding != "zero1" else 1)
        opt = n_states * min(opt_b, 2) * P / S
    else:
        if zero3:
            params = 4 * P / S   # the fp32 shard, or a bf16 shard + its remainders: 4 bytes either way
        elif s.sharding == "none" or s.torch_zero:   # torch's ZeroRedundancyOptimizer: the DDP model, no master
            # fp32 weights + autocast's cached 16-bit copies; with remainders: bf16 weights + their low bits
            params = (4 * P + (2 * P if s.precision != "fp32" else 0)) if master_b == 4 else 2 * P + master_b * P
        else:  # zero1/2: compute copy on every rank, the master (fp32, or remainders) sharded with the optimizer
            params = 2 * P + master_b * P / S
        grad_b = 2 if s.grad_dtype == "bf16" else 4
        grads = grad_b * P / (S if s.sharding == "zero2" or zero3 else 1)
        if s.deepspeed_pipeline and s.precision == "bf16":   # BF16_Optimizer: the bf16 grads stay beside the fp32
            grads += 2 * P                                     # ones (update_hp_grads(clear_lp_grads=False))
        opt = n_states * opt_b * P / S
    if s.optimizer_in_backward:
        grads = s.grad_bytes * largest_param(m) / s.tp  # the largest alive
    if s.optimizer == NO_STEP:   # no_sync: each rank's gradients accumulate whole (LoRA: the adapters' fp32 ones)
        grads = 4 * _trained(m, s, rank)[1] if s.lora_rank else s.grad_bytes * P
    if s.offload in ("optimizer", "params"):
        opt = 0.0
        if zero3 and not (s.lora_rank or s.pure_bf16):   # the 16-bit shard FSDP gathers from stays (ZeRO-Offload)
            params = max(2, s.gather_bytes) * P / S
        elif s.sharding in ("zero1", "zero2"):
            params -= master_b * P / S if not (s.lora_rank or s.pure_bf16) else 0
    if s.offload == "params":
        params, grads = 0.0, 0.0
    return params, grads, opt


def ddp_bucket_bytes(m: ModelSpec, s: TrainSetup, rank: int = 0) -> float:
    """PyTorch DDP's bucket buffers on pipeline rank `rank`: a copy of every trained gradient in the parameters' dtype
    (fp32 masters under autocast, 16-bit with --pure-bf16 or --grad-dtype bf16), allocated at wrap time and alive
    all run. 0 where DDP does not run (one rank, sharded or other stacks' optimizers, DeepSpeed's engine)."""
    if s.stack != "pytorch" or s.deepspeed_pipeline or s.sharding != "none" and not s.torch_zero or s.dp * s.cp == 1:
        return 0.0
    return s.grad_bytes * _trained(m, s, rank)[1]


def _zero_sliced_peak(m: ModelSpec, s: TrainSetup, rank: int, acts: float, per_layer: float) -> float:
    """nanotron's ZeRO-1 above its fp32 accumulator: the forward's activations; the 16-bit gradients of the whole
    backward beside its last block's activations (freed by the accumulation after it); after the step the
    all-gather's flattened outputs and ProcessGroupNCCL's flat output, two 16-bit copies of the weights."""
    half = 2 * _trained(m, s, rank)[1]   # the 16-bit model (setup_checks refuses fp32)
    # one rank gathers nothing; uneven pieces go by broadcasts into the outputs, with no flat buffer of NCCL's
    copies = 0 if s.shards <= 1 else 1 if any(x % s.shards for x in zero_sliced_tensors(m, s)) else 2
    return max(acts, half + per_layer, copies * half)


def _buffers(m: ModelSpec, s: TrainSetup, rank: int = 0) -> float:
    """FSDP's gathered blocks and unsharded gradients (see the module docstring); DeepSpeed ZeRO-3's gathered
    modules and reduce bucket (`zero3.py`)."""
    if s.sharding == "zero3" and (s.shards > 1 or s.offload == "params"):
        return zero3_buffers(m, s, _trained(m, s, rank)[0])
    if not (s.shards_weights and s.shards > 1 or s.offload == "params"):
        return 0.0
    gather = s.gather_bytes
    layer = m.layer_params() / s.tp
    if s.pp > 1 and s.stack == "pytorch" and s.offload != "params":
        # torch.distributed.pipelining turns off FSDP's resharding after backward and its gradient sync until
        # the last micro-batch (stage.py: set_reshard_after_backward(False), set_requires_gradient_sync(False)),
        # and torchtitan does not reshard after forward under PP: the stage's parameters stay gathered and its
        # gradients accumulate unsharded, in the reduce dtype (fp32), through the step
        P, trained = _trained(m, s, rank)
        return P * gather + trained * (2 if s.grad_dtype == "bf16" else 4)
    no_grad_block = s.lora_rank or s.optimizer == NO_STEP   # no_sync: the whole gradients are counted in grads
    return 2 * layer * gather + (layer * (2 if s.grad_dtype == "bf16" else 4) if not no_grad_block else 0)


def terms(m: ModelSpec, s: TrainSetup) -> dict[str, float]:
    """Bytes per GPU of each state and of the activation peak on the busiest pipeline rank (see the module docstring):
    each rank's parameters, optimizer states, buffers and activation peak (`pipeline.stage_params`; the last rank's
    with the loss and what pipeline_outputs_bytes keeps), gradients beside them (one micro-batch a step: the last
    stage's backward holds gradients and logits at once)."""
    logits, kept, residual = _logits(m, s), pipeline_outputs_bytes(m, s), logits_kept_bytes(m, s)
    stages = []
    # Interleaved: the two ends only. Rank 1 warms up two chunk forwards fewer than rank 0 but, when rank 0's first
    # chunk is a block short (--embedding-in-pipeline-split), can hold more blocks; counted, Megatron's schedule
    # leaves Llama 3 405B (8K, no recompute, paper §3.3.2) no interleaving that fits, though it ran interleaved
    # with a schedule of its own (tunable micro-batches per round): a gap left open, not modelled either way.
    for rank in (range(s.pp) if s.vpp == 1 else sorted({0, s.pp - 1})):
        params, grads, opt = _states(m, s, rank)
        acts, per_layer, backward_only = _activations(m, s, rank)
        # one micro-batch a step: grads are None while activations peak (set_to_none), then replace them in backward;
        # without a step (--optimizer none) nothing zeroes them: they stay from the micro-batch before
        # (nanotron's fp32 accumulator, --zero-sliced, is never freed); DDP's buckets stay all run
        kept_grads = s.grad_accum > 1 or s.lora_rank or s.optimizer == NO_STEP
        last = rank == s.pp - 1
        whole = logits + kept if last else 0.0

        def peak_with(a: float, lg: float, after: float) -> float:
            """The peak with activations `a` and logits `lg` at the activations' peak, `after` of the logits beside
            the backward's last gradients."""
            p = a + lg + grads if kept_grads else max(a + lg, grads + per_layer + after)
            if s.zero_sliced:   # its fp32 accumulator all along; the backward's 16-bit gradients, the step's copies
                p = grads + max(a + lg, _zero_sliced_peak(m, s, rank, 0.0, per_layer) + after)
            p += ddp_bucket_bytes(m, s, rank)
            if s.sharding == "zero3":   # DeepSpeed's step casts a sub-group of the gradients to fp32 after backward
                p = max(p, grads + zero3_step_bytes(_trained(m, s, rank)[0], s.shards, s))
            return p

        # the loss's peak comes first in the backward, before any block's recompute buffer or gradients exist; then
        # only what the training loop keeps of the logits (the model output) stays beside them (logits.py)
        a, lg, phase = acts, whole, "blocks"
        if last and acts - backward_only + whole >= acts + kept + residual:
            a, lg, phase = acts - backward_only, whole, "loss"
        elif last:
            lg = kept + residual
        peak = peak_with(a, lg, kept + residual if last else 0.0)
        if peak - ddp_bucket_bytes(m, s, rank) > a + lg + (grads if kept_grads or s.zero_sliced else 0.0) + 1:
            phase = "end"   # the backward's end (every gradient beside one block), ZeRO-3's or nanotron's step
        # the two phases added: what max_memory_reserved rows are compared with (+ RESERVED_SHARE, set on them)
        cached = peak_with(acts, whole, whole)
        te_cache = te_weight_cache_bytes(m, s, rank)
        buffers = _buffers(m, s, rank) + te_cache
        stages.append({"params": params, "grads": grads, "grads_at_peak": max(0.0, peak - a - lg),
                       "optimizer": opt, "activations": a, "logits": lg, "buffers": buffers,
                       "allocated": params + opt + buffers + peak, "cached": params + opt + buffers + cached,
                       "pp_rank": rank, "peak_phase": phase, "te_weight_cache": te_cache})
    busiest = {**max(stages, key=lambda d: d["allocated"]), "cached": max(d["cached"] for d in stages)}
    # DeepSpeed given a model built whole: start-up holds all of it once, the peak when the step holds less
    startup = zero3_startup_bytes(m, s)
    busiest = {**busiest, "startup_bytes": startup, "startup": max(0.0, startup - busiest["allocated"]),
               "allocated": max(busiest["allocated"], startup), "cached": max(busiest["cached"], startup)}
    ends = ({"pp_first": stages[0]["activations"], "pp_last": stages[-1]["activations"] + stages[-1]["logits"],
             "pp_outputs": kept} if s.pp > 1 else {"pp_first": 0.0, "pp_last": 0.0, "pp_outputs": 0.0})
    return {**busiest, **ends}
