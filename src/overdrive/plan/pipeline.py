"""What a pipeline stage holds at its peak: the micro-batches in flight on each rank, and what the last stage
keeps of every micro-batch until the step ends.

  in flight   1F1B (PipeDream-Flush; Megatron's and torch.distributed.pipelining's Schedule1F1B): rank r runs
              pp − 1 − r warm-up forwards and one more before its first backward, so it holds min(pp − r,
              micro-batches) micro-batches: the first stage pp, the last one. Interleaved (Megatron's schedule,
              Narayanan et al. 2021 §2.2.2) warms up (pp − 1 − r)·2 + (v − 1)·pp chunk forwards, cycling over
              its v chunks pp micro-batches at a time.
  outputs     torch.distributed.pipelining kept the last stage's output of every micro-batch for the merged
              output `step()` returns (`_PipelineStageBase.forward_one_chunk`: `self.output_chunks.append(output)`
              when `is_last`; cleared at the next step), and torchtitan's model returns fp32 logits
              (`output = self.output(h).float()`), vocab-sharded under TP's loss parallel: micro-batches × tokens ×
              V/tp × 4 bytes beside the loss of the micro-batch in backward (--pp-keep-outputs). Since PyTorch's
              `step(return_outputs=False)` (pytorch#165822) torchtitan keeps none (its #1922, 2025-10), nor do
              nanotron's and picotron's 1F1B engines, which keep the loss: the default. Megatron's last stage returns the loss
              (a scalar), so `--stack megatron` keeps nothing of the kind. DeepSpeed's PipelineEngine keeps each
              stage's output for its backward (`pipe_buffers['outputs'][buffer_id]`, freed in `_exec_backward_pass`),
              split over the TP ranks when there are several (`is_pipe_partitioned`: a PartitionedTensor of 1/tp,
              the whole output's `.data` replaced by `torch.zeros(1)`), deepspeed/runtime/pipe/engine.py @ 3401d25;
              Megatron frees its outputs' data once sent (`deallocate_output_tensor`).
  parameters  Stages are not alike: the first holds the word embedding (and a learned position table), the last the
              final norm and the head, a copy of the embedding when it is tied (Megatron's
              `setup_embeddings_and_output_layer`; DeepSpeed's `TiedLayerSpec('embed', ...)` on both ends in
              Megatron-DeepSpeed's GPTModelPipe, its gradient all-reduced between them); each holds its blocks
              (`chunk_slots`; under --embedding-in-pipeline-split, DeepSpeed's partition_method
              'type:transformer|embedding' or Megatron's account_for_embedding_in_pipeline_split, the embedding and
              the loss take a block's slot). `memory.terms` plans the busiest stage, not the average.
  embedding   What the embedding keeps for the backward on the first stage, per micro-batch in flight (never
              recomputed: DeepSpeed checkpoints only ParallelTransformerLayerPipe, `PipelineModule._is_checkpointable`
              @ 3401d25, Megatron only its blocks): with --embed-norm (BLOOM's --embed-layernorm, a LayerNorm after the
              vocab-parallel lookup's all-reduce, Megatron-DeepSpeed megatron/mpu/layers.py @ 0d0d84c) its 16-bit
              input and fp32 mean and rstd per token (the fused LayerNorm's saved tensors); with --dropout, the
              embedding dropout's 1-byte mask. Whole on every TP rank without sequence parallelism.
"""

from __future__ import annotations

import math

from overdrive.plan.setup import TrainSetup
from overdrive.plan.specs import ModelSpec

__all__ = ["pipeline_blocks_in_flight", "pipeline_outputs_bytes", "chunk_slots", "stage_imbalance", "stage_blocks",
           "stage_params", "embedding_micro_batches", "embedding_bytes", "stage_outputs_bytes", "param_tensors",
           "torch_layout", "zero_sliced_tensors"]


def chunk_slots(m: ModelSpec, s: TrainSetup) -> list[int]:
    """Slots (blocks, and the embedding and the loss with --embedding-in-pipeline-split) of each of the pp·vpp
    pipeline chunks, in order; chunk c runs on rank c mod pp. An uneven split gives the extra slot to the first
    chunks, as torchtitan does (torchtitan/distributed/pipeline.py `generate_module_names_per_stage` @ 0ab23071:
    `layers_per_stage = num_effective_layers // num_stages`, one more `if stage_idx < extra_layers`)."""
    chunks = s.pp * s.vpp
    slots = m.n_layer + (2 if s.embedding_in_pipeline_split else 0)
    base, extra = divmod(slots, chunks)
    return [base + (c < extra) for c in range(chunks)]


def stage_imbalance(m: ModelSpec, s: TrainSetup) -> float:
    """The busiest pipeline rank's slots over the average rank's: 1 when the slots split evenly over the ranks.
    Every rank steps at the pace of the busiest one (a micro-batch cannot leave a stage before it is done), so an
    uneven split runs each micro-batch at the busiest rank's time."""
    if s.pp == 1:
        return 1.0
    sizes = chunk_slots(m, s)
    busiest = max(sum(sizes[r::s.pp]) for r in range(s.pp))
    return busiest * s.pp / sum(sizes)


def pipeline_blocks_in_flight(m: ModelSpec, s: TrainSetup, rank: int = 0) -> float:
    """Block-micro-batches whose activations pipeline rank `rank` holds at its peak (the forwards of its warm-up
    and one more, each on the chunk the schedule cycles to). The embedding takes a block's place on rank 0's first
    chunk and the loss on the last rank's last chunk with --embedding-in-pipeline-split."""
    sizes = chunk_slots(m, s)
    cut = 1 if s.embedding_in_pipeline_split else 0
    last = rank == s.pp - 1
    # the chunk that holds the embedding (rank 0, chunk 0) or the loss (last rank, chunk v - 1)
    edge = 0 if rank == 0 else (s.vpp - 1 if last else None)

    def blocks(j: int) -> int:   # blocks of this rank's j-th chunk
        return sizes[j * s.pp + rank] - (cut if j == edge else 0)

    if s.vpp == 1:
        return min(s.pp - rank, s.grad_accum) * blocks(0)
    warmup = (s.pp - 1 - rank) * 2 + (s.vpp - 1) * s.pp
    forwards = min(warmup + 1, s.grad_accum * s.vpp)
    return sum(blocks((k // s.pp) % s.vpp) for k in range(forwards))


def pipeline_outputs_bytes(m: ModelSpec, s: TrainSetup) -> float:
    """Bytes the last stage keeps of its outputs through the step (see the module docstring): --stack pytorch
    with --pp > 1 and --pp-keep-outputs, every micro-batch's fp32 logits, vocab-sharded over tp."""
    if s.pp == 1 or s.stack != "pytorch" or not s.pp_keep_outputs or s.deepspeed_pipeline:
        return 0.0
    tokens = s.seq * s.micro_batch / s.cp
    return s.grad_accum * tokens * m.vocab / s.tp * 4


def stage_blocks(m: ModelSpec, s: TrainSetup) -> list[int]:
    """Transformer blocks on each pipeline rank, all its chunks together (the embedding's and the loss's slots out)."""
    sizes = chunk_slots(m, s)
    cut = 1 if s.embedding_in_pipeline_split else 0
    blocks = [sum(sizes[r::s.pp]) for r in range(s.pp)]
    blocks[0] -= cut
    blocks[-1] -= cut
    return blocks


def stage_params(m: ModelSpec, s: TrainSetup) -> list[float]:
    """Parameters of each pipeline rank, before tensor parallelism: its blocks, the embedding on the first, the final
    norm and the head on the last (a copy of the embedding when tied and pp > 1). They add up to `m.n_params()`, and
    to one embedding more when a tied embedding sits on both ends."""
    per_block = m.layer_params()
    P = [float(b * per_block) for b in stage_blocks(m, s)]
    P[0] += (m.vocab + m.learned_pos) * m.hidden
    P[-1] += m.hidden * (2 if m.bias else 1) + (m.vocab * m.hidden if not m.tied or s.pp > 1 else 0)
    return P


def embedding_micro_batches(m: ModelSpec, s: TrainSetup) -> int:
    """Micro-batches whose embedding forward the first stage holds at its peak: min(pp, micro-batches) under 1F1B;
    interleaved, the warm-up forwards that fall on rank 0's first chunk (the one with the embedding)."""
    if s.vpp == 1:
        return min(s.pp, s.grad_accum)
    forwards = min((s.pp - 1) * 2 + (s.vpp - 1) * s.pp + 1, s.grad_accum * s.vpp)
    return sum(1 for k in range(forwards) if (k // s.pp) % s.vpp == 0)


def embedding_bytes(m: ModelSpec, s: TrainSetup) -> float:
    """Bytes the embedding keeps for the backward of one micro-batch (see the module docstring, "embedding")."""
    tokens = s.seq * s.micro_batch / (s.sp * s.cp)
    w = 4 if s.precision == "fp32" else 2
    return tokens * ((m.hidden * w + 8 if s.embed_norm else 0) + (m.hidden if s.dropout else 0))


def stage_outputs_bytes(m: ModelSpec, s: TrainSetup, rank: int) -> float:
    """Bytes of the stage outputs DeepSpeed's PipelineEngine keeps on rank `rank` (not the last) at its peak: one
    per micro-batch in flight, 1/tp of it with TP (see the module docstring, "outputs")."""
    if not s.deepspeed_pipeline or rank == s.pp - 1:
        return 0.0
    w = 4 if s.precision == "fp32" else 2
    return min(s.pp - rank, s.grad_accum) * s.seq * s.micro_batch / s.cp * m.hidden * w / s.tp


def param_tensors(m: ModelSpec, s: TrainSetup, gate_up: bool = False, separate_qkv: bool = False) -> list[int]:
    """The parameter tensors of one TP rank's first pipeline stage, elements each, in registration order: the
    embedding (and a learned position table), each block's norm, fused QKV (`separate_qkv`: q, k and v apart, as
    Hugging Face's, torchtitan's and torchtune's Llama register them), QK-norm gains, output, norm and MLP matrices
    (`gate_up`: a gated MLP's gate and up in one tensor, as nanotron's gate_up_proj), a --bias model's bias after
    each weight (GPT-2/3: every linear's and LayerNorm's); with one stage, the final norm and the head as well."""
    h, tp = m.hidden, s.tp

    def w(n: int, bias: int) -> list[int]:
        return [n, bias] if m.bias else [n]

    qkv = (w(h * m.q_dim // tp, m.q_dim // tp) + w(h * m.kv_dim // tp, m.kv_dim // tp) * 2 if separate_qkv
           else w(h * (m.q_dim + 2 * m.kv_dim) // tp, (m.q_dim + 2 * m.kv_dim) // tp))
    qkv += [m.head_dim, m.head_dim] if m.qk_norm else []
    mlp = (w(2 * h * m.ffn // tp, 2 * m.ffn // tp) if gate_up and m.gated_mlp
           else w(h * m.ffn // tp, m.ffn // tp) * (2 if m.gated_mlp else 1))
    block = w(h, h) + qkv + w(m.q_dim * h // tp, h) + w(h, h) + mlp + w(h * m.ffn // tp, h)
    last = (w(h, h) + ([] if m.tied else [m.vocab * h // tp])) if s.pp == 1 else []
    pos = [m.learned_pos * h] if m.learned_pos else []
    return [m.vocab * h // tp] + pos + block * math.ceil(m.n_layer / s.pp) + last


def torch_layout(m: ModelSpec, s: TrainSetup) -> list[int]:
    """`param_tensors` as a PyTorch-stack model registers them: a Llama-family (gated MLP) model's q, k and v apart
    (Hugging Face's, torchtitan's, torchtune's), a GPT-2-family model's fused c_attn."""
    return param_tensors(m, s, separate_qkv=m.gated_mlp)


def zero_sliced_tensors(m: ModelSpec, s: TrainSetup) -> list[int]:
    """nanotron's parameter tensors on one GPU, elements each (its Llama: qkv_proj, o_proj, gate_up_proj, down_proj and
    two norms a block; models/llama.py @ c252843)."""
    return param_tensors(m, s, gate_up=True)
