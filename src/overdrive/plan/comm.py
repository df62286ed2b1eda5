"""Communication per step, call by call, and how much of it compute cannot hide.

Each collective is timed by `collectives.py` (nccl-tests' bus-bandwidth factors + NCCL's ring/tree latency
model), over the ranks of its group and the nodes they span. Megatron's rank order is tp, cp, dp, pp (tp
fastest), so a group's members per node are gpus_per_node / (the degrees inside it), at least one.

  data parallel   FSDP/ZeRO-3: per block and micro-batch an all-gather of its parameters in forward and again in
                  backward (reshard after forward; --gather-dtype bytes, 1 with FP8 all-gather) and a reduce-scatter of
                  its gradients (grad dtype); HSDP: that inside the node + an all-reduce of the shard across nodes.
                  DeepSpeed ZeRO-3 (--sharding zero3): the same per module, the gradients reduce-scattered in the model
                  dtype per reduce bucket (`zero3.py`). ZeRO-1/2: a reduce-scatter of gradients + an all-gather of
                  parameters per bucket, once per step; DDP: an all-reduce per bucket, once per step. Buckets: PyTorch
                  DDP's, as its Reducer builds them (`ddp_buckets`); Megatron's max(40M, 1M·dp) parameters
                  (DistributedDataParallelConfig.bucket_size), one bucket without --overlap-grad-reduce. Every call pays
                  its latency: at hundreds of nodes with small buckets that term dominates.
  overlap         FSDP: the calls hide under the block computing beside them, up to `overlap` of the compute;
                  the first all-gather and the last reduce-scatter have nothing to hide under: on the PyTorch
                  stack those are the root unit's (the embedding, final norm and untied head fully_shard leaves
                  outside the blocks, `_root_unit`: gathered once a micro-batch, in the compute dtype even with
                  FP8 all-gather) and one block's. DDP/ZeRO: bucket
                  k is ready when the backward has computed k/nb of itself and the calls run one after another
                  on one stream, so what is left after the backward is max(t, nb·t − (nb−1)·c) for nb buckets of
                  t seconds each over c seconds of compute per bucket (the last bucket always shows). Megatron
                  without --overlap-grad-reduce (Megatron-LM's default, NVIDIA/Megatron-LM
                  megatron/core/distributed/distributed_data_parallel.py @ d98e8a64): all of it shows.
  tensor parallel per block, all-gather + reduce-scatter of b·s·h 16-bit activations twice in forward and
                  twice in backward (without sequence parallelism: the same bytes as four all-reduces;
                  Korthikanti et al. 2022), plus the recomputed forward's; over NVLink inside a node, over the
                  NICs when tp spans nodes (Narayanan et al. 2021, §3.3: why TP stays in a node), each call
                  with its latency; exposed unless overlapped (async TP, or Megatron's tp_comm_overlap: 30%
                  left; userbuffers overlap works inside a node only).
  context parallel ring attention passes K and V around the cp ranks (backward: and their grads), one p2p
                  per step, hidden under the attention compute.
  pipeline        the bubble (pp−1)/(vpp·micro-batches) (Narayanan et al. 2021, §2.2), plus per micro-batch and
                  virtual stage a send of activations forward and of their gradients back (p2p latency + bytes,
                  across nodes when the stages are); a tied embedding's gradient all-reduced between the first and
                  the last stage once a step, after the data-parallel reduction (`_embed_comm`), exposed.
  Hybrid ZeRO     --zero-broadcast (InternLM's HybridZeroOptimizer as its July 2023 performance table ran it,
                  internlm/solver/optimizer/hybrid_zero_optim.py @ 20fe5ac2): each rank owns whole tensors, the
                  largest first to the least-loaded rank (`zero_owners`); the gradients are all-reduced (not
                  reduce-scattered) in the model's dtype, in buckets of reduce_bucket_size 512M elements, under the
                  last micro-batch's backward; after the step every owner broadcasts its updated weights to the whole
                  ZeRO group, one call each (collectives.broadcast_s: nRanks hops of latency per call), and
                  `broadcast_params(overlap=False)` waits for every call before the step ends: all of it exposed.
                  With fp32 gradients, torch's ZeroRedundancyOptimizer beside DDP (`TrainSetup.torch_zero`): DDP's
                  all-reduce, then `_sync_params` broadcasts each fp32 tensor from its owner, one call per tensor.
  nanotron ZeRO-1 --zero-sliced (huggingface/nanotron src/nanotron/optim/zero.py, gradient_accumulator.py and
                  trainer.py @ c252843, with accumulate_grad_in_fp32 as its benchmarks ran): every tensor sliced over
                  the ZeRO group; no DDP (make_ddp is false with fp32 accumulation and ZeRO), so after the last
                  backward one all-reduce of the whole fp32 gradient buffer (`sync_gradients_across_dp`,
                  reduce_scatter False), synchronous, nothing to hide under; after the step one all-gather of the
                  updated 16-bit weights (`dp_after`), which the next forward waits for, with the host's dp·T
                  slices and flattens before the call and copies after it (host.py). When a tensor does not split
                  evenly over the ranks, the ranks' pieces differ in size and ProcessGroupNCCL's all-gather falls back
                  to one broadcast per rank, coalesced (collectives.broadcast_s each).
  DeepSpeed       --deepspeed-pipeline (Megatron-DeepSpeed, GPT-NeoX; microsoft/DeepSpeed
                  deepspeed/runtime/pipe/engine.py @ 0050fdad and schedule.py @ af8f2596): the engine sets
                  `enable_backward_allreduce = False` and its TrainSchedule appends ReduceTiedGrads, ReduceGrads,
                  OptimizerStep after the last micro-batch, so the gradients go out after the pipeline flush with
                  no backward left to hide them (all of dp exposed), in buffers of 5e8 elements; bf16 runs its
                  BF16_Optimizer, "hardcoded for fp32 gradient accumulation": an all-reduce of fp32 gradients,
                  then its ZeRO-1 all-gather of the bf16 parameters.
"""

from __future__ import annotations

import math

from overdrive.plan.choices import NO_STEP
from overdrive.plan.collectives import (LINK_EFF, broadcast_s, choose_allreduce, gather_s, group_layout, p2p_s,
                                       ring_latency_s)
from overdrive.plan.pipeline import param_tensors, stage_imbalance, torch_layout, zero_sliced_tensors
from overdrive.plan.setup import TrainSetup
from overdrive.plan.specs import ModelSpec
from overdrive.plan.zero3 import zero3_comm

__all__ = ["comm_times", "dp_exposed", "reduces_every_micro_batch", "LINK_EFF", "ASYNC_TP_EXPOSED", "DDP_BUCKET_BYTES",
           "DS_ALLREDUCE_ELEMENTS", "group_layout", "ZERO_BUCKET_ELEMENTS", "zero_owners", "zero_sliced_tensors"]

ASYNC_TP_EXPOSED = 0.3
DS_ALLREDUCE_ELEMENTS = 500_000_000
"""DeepSpeed's MEMORY_OPT_ALLREDUCE_SIZE: the elements per buffer its PipelineEngine reduces gradients in
(deepspeed/runtime/engine.py)."""
DDP_BUCKET_BYTES = 25 * 2**20
"""torch.nn.parallel.DistributedDataParallel's bucket_cap_mb default."""
DDP_FIRST_BUCKET_BYTES = 2**20
"""torch.distributed._DEFAULT_FIRST_BUCKET_BYTES: the first bucket's cap while bucket_cap_mb is left at its default
(_BucketCapacityConfig.create; a bucket_cap_mb given makes the first bucket full size too)."""
ZERO_BUCKET_ELEMENTS = 512 * 1024 * 1024
"""InternLM's hybrid_zero_optimizer reduce_bucket_size (configs/7B_sft.py @ 00478761): gradient elements per
all-reduce."""


def ddp_buckets(m: ModelSpec, s: TrainSetup, grad_b: int) -> list[float]:
    """PyTorch DDP's buckets, bytes each, in the order the backward fills them: after the first iteration the
    Reducer rebuilds them in gradient-ready order (`torch_layout`'s registration order reversed), whole tensors, each
    closing once it reaches its cap, the first DDP_FIRST_BUCKET_BYTES, the rest DDP_BUCKET_BYTES (reducer.cpp
    compute_bucket_assignment_by_size; DDP's _get_ddp_logging_data() reports them as rebuilt_bucket_sizes,
    tests/unit/test_plan_at_scale.py). The last holds the embedding, ready only when the backward ends."""
    out, cur, cap = [], 0.0, DDP_FIRST_BUCKET_BYTES
    for x in reversed(torch_layout(m, s)):
        cur += x * grad_b
        if cur >= cap:
            out, cur, cap = out + [cur], 0.0, DDP_BUCKET_BYTES
    return out + ([cur] if cur else [])


def _buckets(s: TrainSetup, grad_bytes: float, trained: float, blocks: float) -> int:
    """Calls a step's gradients go out in: Megatron's DDP/distributed optimizer buckets of max(40M, 1M·dp)
    parameters; PyTorch DDP's 25 MB where its real buckets (`ddp_buckets`) are not built (LoRA's adapters); FSDP2 as
    ZeRO-1/2 (reshard_after_forward=False) one per block; DeepSpeed's PipelineEngine buffers of
    MEMORY_OPT_ALLREDUCE_SIZE elements."""
    if s.deepspeed_pipeline:
        return max(1, math.ceil(trained / DS_ALLREDUCE_ELEMENTS))
    if not s.overlap_grad_reduce:   # Megatron's DDP: "Set bucket_size to infinity if overlap_grad_reduce is False"
        return 1
    if s.stack == "megatron":
        per = max(40e6, 1e6 * s.dp) * (grad_bytes / max(trained, 1))
    elif s.sharding in ("zero1", "zero2", "hsdp"):
        return max(1, round(blocks))
    else:
        per = DDP_BUCKET_BYTES
    return max(1, math.ceil(grad_bytes / per))


def _trained(m: ModelSpec, s: TrainSetup) -> float:
    """Parameters with gradients on one GPU's model shard (LoRA: the adapters only)."""
    if s.lora_rank:
        from overdrive.plan.memory import lora_params

        return lora_params(m, s.lora_rank) / (s.tp * s.pp)
    return m.n_params() / (s.tp * s.pp)


def _root_unit(m: ModelSpec, s: TrainSetup) -> float:
    """Parameters on one GPU's TP shard of the FSDP unit outside the blocks: fully_shard (and FSDP1's auto-wrap) on each
    block, then on the model, leaves the embedding, the final norm and an untied head in the root unit (torchtitan's
    and OLMo-core's apply_fsdp; 1.03B of OLMo-2 13B's parameters, three blocks' worth). PyTorch stack without
    pipelining; 0 otherwise (the blocks share everything evenly)."""
    if s.stack != "pytorch" or s.pp > 1:
        return 0.0
    return max(0.0, m.n_params() - m.n_layer * m.layer_params()) / s.tp


def _fsdp_comm(m: ModelSpec, s: TrainSetup, out: dict, grad_b: int) -> None:
    """FSDP/HSDP: per block and micro-batch an all-gather forward and backward and a reduce-scatter, and the root
    unit's one gather (FSDP keeps the root gathered for the backward that follows at once) and reduce-scatter; HSDP
    adds an all-reduce of the shard's gradients across the replicas once a step, bucket by bucket. Nothing hides the
    root's gather, which opens the micro-batch, nor its reduce-scatter, which closes it: those and one block's
    calls are the exposed edge."""
    P, S, trained, L = m.n_params() / (s.tp * s.pp), s.shards, _trained(m, s), m.n_layer / s.pp
    nodes, bw = group_layout(s, S, s.tp)
    blocks = max(1.0, L)
    root = _root_unit(m, s)
    root_trained = 0.0 if s.lora_rank else root   # LoRA's adapters sit in the blocks
    root_b = 4 if s.precision == "fp32" or s.gather_dtype == "fp32" else 2   # the root is never gathered in FP8
    ag = gather_s((P - root) * s.gather_bytes / blocks, S, nodes, bw)      # one block's parameters
    syncs = s.optimizer != NO_STEP   # no_sync: the gathers only, no reduce-scatter
    rs = gather_s((trained - root_trained) * grad_b / blocks, S, nodes, bw) if syncs else 0.0  # one block's grads
    ag_root = gather_s(root * root_b, S, nodes, bw) if root else 0.0
    rs_root = gather_s(root_trained * grad_b, S, nodes, bw) if root_trained and syncs else 0.0
    calls = blocks * (3 if syncs else 2) + ((2 if syncs else 1) if root else 0)
    per_mb = blocks * (2 * ag + rs) + ag_root + rs_root
    lat = calls * ring_latency_s(S, nodes, allreduce=False)
    out.update(dp=s.grad_accum * per_mb, dp_calls=s.grad_accum * calls, dp_latency=s.grad_accum * lat,
               dp_algo="ring", dp_edge=s.grad_accum * (ag + rs + ag_root + rs_root), dp_nodes=nodes)
    reps = s.dp * s.cp // S
    if s.sharding == "hsdp" and s.nodes > 1 and reps > 1 and syncs:
        rnodes, rbw = group_layout(s, reps, s.tp * S)
        nb = _buckets(s, trained * grad_b / S, trained / S, L)
        algo, t, t_lat = choose_allreduce(trained * grad_b / S / nb, reps, rnodes, rbw)
        out.update(dp=out["dp"] + nb * t, dp_calls=out["dp_calls"] + nb,
                   dp_latency=out["dp_latency"] + nb * t_lat, dp_algo=f"ring + {algo}")


def _ddp_comm(m: ModelSpec, s: TrainSetup, out: dict, grad_b: int) -> None:
    """DDP (all-reduce) or ZeRO-1/2 (reduce-scatter + all-gather of the 16-bit parameters), per bucket."""
    n = s.shards if s.sharding != "none" else s.dp * s.cp
    trained, L = _trained(m, s), m.n_layer / s.pp
    nodes, bw = group_layout(s, n, s.tp)
    grads = trained * grad_b
    nb = _buckets(s, grads, trained, L)
    if s.deepspeed_pipeline and s.precision == "bf16":
        # BF16_Optimizer: an all-reduce of the fp32 gradients (`_bf16_reduce_grads`), then under its ZeRO-1 an
        # all-gather of the updated bf16 parameters
        algo, t, lat_one = choose_allreduce(trained * 4 / nb, n, nodes, bw)
        if s.sharding != "none":
            t += gather_s(m.n_params() / (s.tp * s.pp) * 2 / nb, n, nodes, bw)
            lat_one += ring_latency_s(n, nodes, allreduce=False)
    elif (s.sharding == "none" or s.torch_zero) and s.stack == "pytorch" and not s.lora_rank:
        # PyTorch DDP: its own buckets, each all-reduced as it fills; the last (the embedding's) is the exposed edge
        calls = [choose_allreduce(b, n, nodes, bw) for b in ddp_buckets(m, s, grad_b)]
        out.update(dp=sum(c[1] for c in calls), dp_calls=len(calls), dp_latency=sum(c[2] for c in calls),
                   dp_algo=max(calls, key=lambda c: c[1])[0], dp_edge=calls[-1][1], dp_buckets=len(calls),
                   dp_nodes=nodes)
        return
    elif s.sharding == "none":
        algo, t, lat_one = choose_allreduce(grads / nb, n, nodes, bw)
    else:   # ZeRO-1/2: reduce-scatter the gradients, all-gather the updated 16-bit parameters
        algo = "ring"
        P = m.n_params() / (s.tp * s.pp)
        rs, lat_one = gather_s(grads / nb, n, nodes, bw), ring_latency_s(n, nodes, allreduce=False)
        if reduces_every_micro_batch(s):   # the reduce-scatters again in each of the other micro-batches
            out.update(dp_rs_mb=nb * rs, dp_calls_mb=nb, dp_latency_mb=nb * lat_one)
        t, lat_one = rs + gather_s(P * 2 / nb, n, nodes, bw), 2 * lat_one
    extra = (s.grad_accum - 1) * out.get("dp_rs_mb", 0.0)
    out.update(dp=nb * t + extra, dp_calls=nb + (s.grad_accum - 1) * out.get("dp_calls_mb", 0),
               dp_latency=nb * lat_one + (s.grad_accum - 1) * out.get("dp_latency_mb", 0.0), dp_algo=algo,
               dp_edge=t + extra / nb, dp_buckets=nb, dp_nodes=nodes)   # ZeRO-2: each micro-batch's last bucket


def reduces_every_micro_batch(s: TrainSetup) -> bool:
    """ZeRO-2 keeps only its shard of the gradients, so it reduce-scatters them in every micro-batch's backward and
    adds the shard in: DeepSpeed's stage 2 (stage_1_and_2.py reduce_ready_partitions_and_remove_grads: "if
    self.partition_gradients or self.is_gradient_accumulation_boundary()"), Megatron-LLaMA's overlapped distributed
    optimizer (a grad hook per parameter, backward_epilogue after each micro-batch). Under pipelining on the
    pytorch stack (Llama 3's FSDP without resharding) torch.distributed.pipelining syncs gradients in the last
    backward only."""
    return s.sharding == "zero2" and s.grad_accum > 1 and not (s.pp > 1 and s.stack == "pytorch")


def zero_owners(m: ModelSpec, s: TrainSetup, n: int) -> int:
    """Ranks of a ZeRO group of n that own parameters. InternLM's `_partition_param_list` (@ 20fe5ac2) sorts the
    tensors by size and gives each to the least-loaded rank, so every rank gets one before any gets a second:
    min(n, tensors)."""
    return min(n, len(param_tensors(m, s)))


def _zero_broadcast_comm(m: ModelSpec, s: TrainSetup, out: dict, grad_b: int) -> None:
    """InternLM's Hybrid ZeRO: an all-reduce of the gradients per 512M-element bucket (`dp`, overlapped as DDP's),
    then one broadcast of the updated weights per owning rank (`dp_bcast`, all of it exposed). torch's
    ZeroRedundancyOptimizer (`TrainSetup.torch_zero`): DDP's all-reduce, then one broadcast per tensor (fp32 under
    autocast, bf16 with --pure-bf16)."""
    n, trained = s.shards, _trained(m, s)
    nodes, bw = group_layout(s, n, s.tp)
    if s.torch_zero:
        _ddp_comm(m, s, out, grad_b)
        calls = [broadcast_s((2 if s.pure_bf16 else 4) * x, n, nodes, bw) for x in torch_layout(m, s)]
        out.update(dp_bcast=sum(t for t, _ in calls), dp_bcast_calls=len(calls),
                   dp_bcast_latency=sum(lat for _, lat in calls))
        return
    nb = max(1, math.ceil(trained / ZERO_BUCKET_ELEMENTS))
    algo, t, lat = choose_allreduce(trained * grad_b / nb, n, nodes, bw)
    owners = zero_owners(m, s, n)
    weight_b = 4 if s.precision == "fp32" else 2
    b_t, b_lat = broadcast_s(m.n_params() / (s.tp * s.pp) * weight_b / owners, n, nodes, bw)
    out.update(dp=nb * t, dp_calls=nb, dp_latency=nb * lat, dp_algo=algo, dp_edge=t, dp_buckets=nb, dp_nodes=nodes,
               dp_bcast=owners * b_t, dp_bcast_calls=owners, dp_bcast_latency=owners * b_lat)


def _zero_sliced_comm(m: ModelSpec, s: TrainSetup, out: dict, grad_b: int) -> None:
    """nanotron's ZeRO-1: one all-reduce of the fp32 gradient buffer after the backward (`dp`, exposed: dp_exposed),
    then one all-gather of the updated 16-bit weights after the step (`dp_after`, exposed; n broadcasts when the
    ranks' pieces differ in size)."""
    n, trained = s.shards, _trained(m, s)
    nodes, bw = group_layout(s, n, s.tp)
    weights = m.n_params() / (s.tp * s.pp) * 2   # the 16-bit model (setup_checks refuses fp32)
    tensors = zero_sliced_tensors(m, s)
    algo, t, lat = choose_allreduce(trained * grad_b, n, nodes, bw)
    uneven = any(x % n for x in tensors)
    if uneven:
        ag = n * broadcast_s(weights / n, n, nodes, bw)[0]
    else:
        ag = gather_s(weights, n, nodes, bw)
    out.update(dp=t, dp_calls=1, dp_latency=lat, dp_algo=algo, dp_edge=t, dp_buckets=1, dp_nodes=nodes,
               dp_after=ag, dp_after_calls=n if uneven else 1, zero_sliced_tensors=len(tensors))


def _tp_comm(m: ModelSpec, s: TrainSetup, out: dict) -> None:
    """Sequence-parallel all-gathers/reduce-scatters: 8 per block (+ those of the recomputed forward), on the
    busiest pipeline rank's blocks."""
    L, tokens = m.n_layer / s.pp * stage_imbalance(m, s), s.micro_batch * s.seq / s.cp
    colls = 8 + {"full": 4, "selective": 2}.get(s.checkpointing, 0)
    nodes, bw = group_layout(s, s.tp, 1)
    tp = L * colls * gather_s(tokens * m.hidden * 2, s.tp, nodes, bw)
    # Megatron's userbuffers and torchtitan's async TP overlap over NVLink only (symmetric memory)
    if s.tp_overlap and nodes == 1:
        tp *= ASYNC_TP_EXPOSED
    out.update(tp=tp, tp_latency=L * colls * ring_latency_s(s.tp, nodes, allreduce=False), tp_nodes=nodes)


def _cp_pp_comm(m: ModelSpec, s: TrainSetup, out: dict, attn_s: float) -> None:
    """Ring attention's K/V passes beyond what the attention hides; the pipeline's point-to-point sends."""
    L, tokens = m.n_layer / s.pp * stage_imbalance(m, s), s.micro_batch * s.seq / s.cp
    if s.cp > 1:
        kv_bytes = 2 * tokens * m.kv_dim * 2 / s.tp
        nodes, bw = group_layout(s, s.cp, s.tp)
        ring = L * 3 * (s.cp - 1) * p2p_s(kv_bytes, bw, across_nodes=nodes > 1)
        out["cp"] = max(0.0, ring - attn_s)
    if s.pp > 1:
        across = s.tp * s.cp * s.dp >= s.gpus_per_node   # stage neighbours are tp·cp·dp ranks apart
        # across nodes the NIC, which the GPU's own link feeds
        bw = LINK_EFF * (min(s.link_gbs, s.net_gbs) if across else s.link_gbs) * 1e9
        act = tokens * m.hidden * 2 / s.tp
        # each of the vpp chunks sends its activations on and receives their gradients back
        out["pp"] = s.vpp * 2 * p2p_s(act, bw, across_nodes=across)


def _embed_comm(m: ModelSpec, s: TrainSetup, out: dict, grad_b: int) -> None:
    """A tied embedding under pipelining lives on the first and the last stage; its gradient is all-reduced
    between the two once a step, after the data-parallel reduction (Megatron-Core finalize_model_grads:
    finish_grad_sync, then _allreduce_embedding_grads; DeepSpeed's schedule: ReduceTiedGrads before ReduceGrads,
    in fp32 under the BF16_Optimizer). The two ends are (pp−1)·tp·cp·dp ranks apart."""
    if not (m.tied and s.pp > 1):
        return
    nodes, bw = group_layout(s, 2, (s.pp - 1) * s.tp * s.cp * s.dp)
    b = 4 if s.deepspeed_pipeline and s.precision == "bf16" else grad_b
    out["embed"] = choose_allreduce(m.vocab * m.hidden / s.tp * b, 2, nodes, bw)[1]


def comm_times(m: ModelSpec, s: TrainSetup, attn_s: float) -> dict:
    """Seconds: `dp` per step (to overlap with compute, `dp_exposed`), `tp`, `cp`, `pp` exposed per micro-batch;
    and how the data-parallel time splits (calls, latency, algorithm, the call nothing hides)."""
    grad_b = s.grad_bytes
    out = {"dp": 0.0, "dp_calls": 0.0, "dp_latency": 0.0, "dp_algo": "", "dp_edge": 0.0, "dp_buckets": 0,
           "dp_nodes": 1, "dp_bcast": 0.0, "dp_bcast_calls": 0, "dp_bcast_latency": 0.0, "dp_after": 0.0,
           "dp_after_calls": 0, "zero_sliced_tensors": 0, "tp": 0.0, "tp_latency": 0.0,
           "tp_nodes": 1, "cp": 0.0, "pp": 0.0, "embed": 0.0}
    if s.sharding == "zero3" and s.shards > 1:
        zero3_comm(m, s, out, _trained(m, s))   # DeepSpeed's module-by-module gathers
    elif s.sharding in ("fsdp", "hsdp") and s.shards > 1:
        _fsdp_comm(m, s, out, grad_b)
    elif s.zero_broadcast and s.shards > 1:
        _zero_broadcast_comm(m, s, out, grad_b)
    elif s.zero_sliced and s.shards > 1 and s.optimizer != NO_STEP:
        _zero_sliced_comm(m, s, out, grad_b)
    elif (s.sharding != "none" and s.shards > 1 or s.sharding == "none" and s.dp * s.cp > 1) and s.optimizer != NO_STEP:
        _ddp_comm(m, s, out, grad_b)   # (DDP under no_sync with no step reduces nothing)
    if s.tp > 1:
        _tp_comm(m, s, out)
    _cp_pp_comm(m, s, out, attn_s)
    _embed_comm(m, s, out, grad_b)
    return out


def dp_exposed(s: TrainSetup, c: dict, t_mb: float, bubble: float, forward: float = 0.0) -> tuple[float, float]:
    """(seconds of data-parallel communication per step compute does not hide, the compute it hides under).
    `forward`: the micro-batch's forward seconds, under which no gradient is ready to all-reduce."""
    n = s.grad_accum
    if c["dp"] <= 0:
        return 0.0, 0.0
    if not s.overlap_grad_reduce or s.zero_sliced:
        # Megatron without --overlap-grad-reduce: finish_grad_sync reduces after the backward, synchronously,
        # and without --overlap-param-gather the distributed optimizer gathers after its step; nanotron's ZeRO-1
        # all-reduces its fp32 buffer after the backward, synchronously
        return c["dp"], 0.0
    if s.deepspeed_pipeline:
        # DeepSpeed's PipelineEngine turns the backward's all-reduce off ("We schedule the all-reduces") and runs
        # ReduceGrads after the last backward (TrainSchedule); the first stage finishes last, so its reduction
        # is all exposed
        return c["dp"], 0.0
    if s.shards_weights:
        # every micro-batch's calls run beside that micro-batch's blocks; its first gather and last
        # reduce-scatter have no block beside them
        hide = n * t_mb
        return max(c["dp_edge"], c["dp"] - s.overlap * hide), hide
    # DDP/ZeRO reduce once per step, under the last micro-batch's backward (Megatron's ZeRO-1: its parameter
    # all-gather with the next step's first forward) and the pipeline's drain (no_sync on the others): bucket by
    # bucket. An all-reduce (DDP, --zero-broadcast) has only the backward: no gradient is ready in the forward.
    allreduce = s.sharding == "none" or s.zero_broadcast
    hide = t_mb - (forward if allreduce else 0.0) + n * t_mb * bubble
    nb = max(1, c["dp_buckets"])
    per_bucket = s.overlap * hide / nb
    other = (n - 1) * c.get("dp_rs_mb", 0.0)   # ZeRO-2's reduce-scatters in the other micro-batches, each under its own
    t = (c["dp"] - other) / nb
    # the last bucket waits for the backward's end (PyTorch DDP's holds the embedding: its own size, `dp_edge`)
    last = max(c["dp_edge"] if not other else t, nb * t - (nb - 1) * per_bucket)
    if not other:
        return last, hide
    rs = c["dp_rs_mb"] / nb
    each = max(rs, nb * rs - (nb - 1) * s.overlap * t_mb / nb)
    return last + (n - 1) * each, hide + (n - 1) * t_mb
