"""The logits and the loss: what the head's output and the cross-entropy keep at the start of the backward, on the
last pipeline stage (bytes per GPU; `memory.py`'s docstring, "logits", says where each figure comes from).
"""

from __future__ import annotations

from overdrive.plan.setup import TrainSetup
from overdrive.plan.specs import ModelSpec

__all__ = ["logits_bytes", "logits_kept_bytes", "LOSS_CHUNK", "TORCHTUNE_CHUNKS"]

LOSS_CHUNK = 1024
TORCHTUNE_CHUNKS = 8
"""CEWithChunkedOutputLoss(num_output_chunks=8), torchtune/modules/loss/ce_chunked_output_loss.py."""


def logits_bytes(m: ModelSpec, s: TrainSetup) -> float:
    """Bytes of the logits and the loss at the start of the backward on the last pipeline stage (`memory.py`'s
    docstring, "logits")."""
    tokens = s.seq * s.micro_batch / (s.tp * s.cp)
    wide = s.precision == "fp32"
    if s.loss == "fused":
        return min(tokens, LOSS_CHUNK) * m.vocab * 10
    if s.loss == "chunked":
        # torchtune's CEWithChunkedOutputLoss: all 8 chunks' 16-bit logits exist at once (the head runs on every
        # chunk before the loss) and each chunk's cross-entropy saves its chunk; compiled, it saves the 16-bit chunk
        # (+ fp32 max and logsumexp per row, measured with torch.compile's partitioner) and its backward writes the
        # chunk's 16-bit gradient; eager, log_softmax saves an fp32 copy per chunk and the backward of one chunk
        # holds its fp32 gradients (4 + 4) and the 16-bit cast (2)
        n = TORCHTUNE_CHUNKS
        w = 4 if wide else 2
        return tokens * m.vocab * ((w + w / n) if s.compile else (w + 4 + 10 / n))
    if s.loss == "compiled-fp32":
        # the compiled loss saves its fp32 input (the model's `.float()` logits, 4) and writes an fp32 gradient (4)
        return tokens * m.vocab * 8
    if s.loss == "megatron-v07":
        # Megatron-Core from 2022-09 to 2024-06 (core_v0.1.0-core_v0.7.0: megatron/core/tensor_parallel/
        # cross_entropy.py:24 @ cac60ce4, `vocab_parallel_logits = vocab_parallel_logits - logits_max...`; in place
        # again from 9634c0e4, core_r0.8.0) writes the shifted logits to a new fp32 tensor while the fp32 input
        # (LanguageModule's `logits.float()`) and the 16-bit logits are alive: 2 + 4 + 4 at the forward's peak
        return tokens * m.vocab * (8 if wide else 10)
    # hf: the fp32 logits the model output keeps (4) + log_softmax's fp32 output (4) + the two fp32 gradients of
    # the backward (4 + 4); the 16-bit matmul output is dropped once .float() replaced it
    per = {"standard": 16 if wide else 12, "hf": 16, "compiled": 8 if wide else 4,
           "inplace": 4 if wide else 2}[s.loss]
    if s.loss == "standard" and s.stack == "megatron":
        # Megatron's vocab-parallel cross-entropy works in place on one fp32 copy (softmax, then its gradient):
        # the 16-bit logits and that copy in forward, the copy and the 16-bit gradient in backward
        per = 4 if wide else 6
    return tokens * m.vocab * per


def logits_kept_bytes(m: ModelSpec, s: TrainSetup) -> float:
    """Bytes of the logits that outlive the loss's backward, beside the blocks' backward: --loss hf's fp32 logits,
    which its model output keeps through the backward (4). The engines planned here free the output first:
    torchtitan (`del pred`), torchtune (`del logits`), Colossal-AI's benchmark (`del outputs`), the HF Trainer
    (`compute_loss` returns the loss alone), Megatron and nanotron (the model returns the loss). A loop that keeps
    the output (`out = model(...); out.loss.backward()`) holds its 16-bit logits through the whole backward: 2 bytes a
    logit more than planned at either phase."""
    if s.loss != "hf":
        return 0.0
    return s.seq * s.micro_batch / (s.tp * s.cp) * m.vocab * 4
