"""DeepSpeed ZeRO stage 3 (`--sharding zero3`, `--zero 3`): what it keeps on each GPU and what it sends, where that
differs from FSDP's block-by-block gathers (`memory.py`, `comm.py`).

Read from deepspeedai/DeepSpeed @ edaa7221 (deepspeed/runtime/zero/stage3.py, partitioned_param_coordinator.py,
config.py, runtime/engine.py), with the configuration's defaults:

  states      bf16/fp16 (the engine's model dtype): the 16-bit partition of every parameter (`lp_param_buffer`,
              2·P/S), the gradient partitions in the gradient-accumulation dtype (`grad_partitions_flat_buffer`;
              `get_data_types` defaults grad_accum_dtype to the model dtype: 2·P/S), the fp32 master partition
              (4·P/S) and the optimizer's states: ZeRO's 2 + 2 + 12 bytes for AdamW. fp32: the fp32 partition is the
              weights, no master. offload_optimizer (ZeRO-Offload) puts the master, the states and the gradient
              partitions on the CPU (`self.device = cpu`); offload_param (ZeRO-Infinity) the 16-bit partitions too.
  gathered    module by module, not block by block. After each module's fetch the coordinator prefetches the
              parameters next in the recorded trace, up to `stage3_prefetch_bucket_size` (5e7) elements a step but
              never past `stage3_max_live_parameters` (1e9) gathered (`_fetch_sub_module_impl`); a module's
              parameters are released after its use unless they are used again within `stage3_max_reuse_distance`
              (1e9) elements of the trace (`__params_to_release`) or were prefetched for a later use. A prefetch of
              5e7 a step runs ahead of a consumption of one module a step, so the window fills to the live limit
              and stays there; at the turn from forward to backward the head (used last forward, first backward)
              sits on top: min(the shard's parameters, live limit + the largest module) elements in the model dtype.
              tests/unit/test_plan_zero3.py replays the rules over the module trace of Llama 3 1B-405B, with and
              without checkpointing, and checks this bound against the replay's peak.
  reduce      with contiguous_gradients (the default) one `reduce_bucket_size` (5e8) element buffer per gradient
              dtype (`ipg_buckets`), allocated at start: 1 GB in bf16.
  step        per sub-group (`sub_group_size`, 1e9 elements of the local partition) the averaged 16-bit gradients are
              flattened and cast to a new fp32 tensor (`_prepare_fp32_grad_for_sub_group`): 6 bytes per element of
              the sub-group beside the states, after the backward (the activations are freed by then).
  start-up    a model built whole (no deepspeed.zero.Init, --no-zero-init) is moved to each GPU in the model dtype
              and partitioned there (runtime/engine.py `_configure_distributed_model`): the whole model once per
              GPU, the plan's peak when it exceeds the training step's (`zero3_startup_bytes`).
  comm        an all-gather per module (the linears; `gathered_modules`) in the model dtype in forward and again in
              backward (the recomputed forward's gather serves the backward: it is within the reuse distance), and,
              every micro-batch (ZeRO-3 has no no_sync), a reduce-scatter of the gradients in the communication dtype
              (`communication_data_type`: the model dtype unless set) per reduce bucket, on a side stream
              (overlap_comm defaults on for stage 3). The embedding's gather opens the forward and the last bucket's
              reduce-scatter closes the backward: those are exposed.
"""

from __future__ import annotations

import math

from overdrive.plan.collectives import gather_s, group_layout, ring_latency_s
from overdrive.plan.setup import TrainSetup
from overdrive.plan.specs import ModelSpec

__all__ = ["REUSE_DISTANCE", "MAX_LIVE", "PREFETCH_BUCKET", "REDUCE_BUCKET", "SUB_GROUP", "gathered_modules", "zero3_states",
           "zero3_buffers", "zero3_step_bytes", "zero3_startup_bytes", "zero3_comm"]

REUSE_DISTANCE = 1e9      # stage3_max_reuse_distance
MAX_LIVE = 1e9            # stage3_max_live_parameters
PREFETCH_BUCKET = 5e7     # stage3_prefetch_bucket_size
REDUCE_BUCKET = 5e8       # reduce_bucket_size
SUB_GROUP = 1e9           # sub_group_size


def gathered_modules(m: ModelSpec) -> int:
    """Linear modules per block, each fetched by an all-gather of its own: q, k, v, o (Hugging Face's separate
    projections, which most DeepSpeed ZeRO-3 runs train) and the MLP's two or three."""
    return 4 + (3 if m.gated_mlp else 2)


def _model_bytes(s: TrainSetup) -> int:
    return 4 if s.precision == "fp32" else 2


def zero3_states(P: float, S: int, s: TrainSetup, opt_bytes: float, master_b: int) -> tuple[float, float, float]:
    """(params, grads, optimizer) bytes per GPU for P trained parameters on this GPU's TP/PP shard, S GPUs sharing
    them; `opt_bytes` the optimizer's bytes per parameter, `master_b` the master copy's (16-bit training only)."""
    w = _model_bytes(s)
    if s.offload == "params":
        return 0.0, 0.0, 0.0
    if s.offload == "optimizer":
        return w * P / S, 0.0, 0.0   # master, states and gradient partitions on the CPU
    return (w + (master_b if w == 2 else 0)) * P / S, w * P / S, opt_bytes * P / S


def zero3_buffers(m: ModelSpec, s: TrainSetup, stage_params: float) -> float:
    """Bytes of the gathered parameters and the reduce bucket on a GPU whose TP/PP shard holds `stage_params`."""
    h = m.hidden
    largest = max(m.vocab * h, h * m.ffn, h * m.q_dim) / s.tp
    gathered = min(stage_params, MAX_LIVE + largest)
    trained = 0.0 if s.lora_rank else stage_params
    return _model_bytes(s) * (gathered + min(REDUCE_BUCKET, trained))


def zero3_step_bytes(P: float, S: int, s: TrainSetup) -> float:
    """The step's fp32 gradient of one sub-group and the flattened 16-bit copy it is cast from, P parameters on
    the shard (0 when the step runs on the CPU or there is no cast)."""
    if s.offload != "none" or s.precision == "fp32" or s.lora_rank:
        return 0.0
    return 6 * min(P / S, SUB_GROUP)


def zero3_startup_bytes(m: ModelSpec, s: TrainSetup) -> float:
    """Bytes on each GPU as deepspeed.initialize partitions a model built whole (--no-zero-init): the whole model
    in the model dtype (the engine casts it, then `module.to(device)`; each parameter is freed as its partition is
    taken), or 0 under zero.Init. `max_memory_reserved` keeps this peak unless the script resets it."""
    if s.zero_init or s.sharding != "zero3":
        return 0.0
    return _model_bytes(s) * m.n_params() / s.tp


def zero3_comm(m: ModelSpec, s: TrainSetup, out: dict, trained: float) -> None:
    """Per micro-batch: a forward and a backward all-gather per module and a reduce-scatter per reduce bucket of the
    `trained` parameters' gradients; the embedding's gather and the last bucket's reduce-scatter exposed (`dp_edge`)."""
    P, S, L = m.n_params() / (s.tp * s.pp), s.shards, max(1.0, m.n_layer / s.pp)
    nodes, bw = group_layout(s, S, s.tp)
    w = _model_bytes(s)
    mods = L * gathered_modules(m) + 2             # the blocks' linears, the embedding, the head
    ag = gather_s(P * w / mods, S, nodes, bw)      # one module's parameters
    buckets = max(1, math.ceil(trained / REDUCE_BUCKET))
    rs = gather_s(trained * w / buckets, S, nodes, bw)
    calls = 2 * mods + buckets
    lat = calls * ring_latency_s(S, nodes, allreduce=False)
    embed = gather_s(m.vocab * m.hidden / s.tp * w, S, nodes, bw)
    out.update(dp=s.grad_accum * (2 * mods * ag + buckets * rs), dp_calls=s.grad_accum * calls,
               dp_latency=s.grad_accum * lat, dp_algo="ring", dp_edge=s.grad_accum * (embed + rs), dp_nodes=nodes)
