"""--unfused-ops: the block ops that Megatron-LM's pre-Transformer-Engine code runs as plain PyTorch kernels.

Megatron-LM's megatron/model/ (before Megatron-Core and Transformer Engine, 2023; forks such as alibaba/Megatron-LLaMA
keep it) fuses the norms (apex), bias-GeLU and bias-dropout-add (TorchScript) and the masked softmax, but runs these
as eager kernels, each a pass over HBM of its own:

  rope         apply_rotary_pos_emb on q and k (t * cos + rotate_half(t) * sin, the cat of an empty slice);
  swiglu       chunk, F.silu, multiply;
  attn-layout  the [s, b] <-> [b, s] .contiguous() copies of q, k, v and the output around flash attention, and
               flash-attn 1.x's copy of the output's gradient.

scripts/measure_eager_bytes.py runs that code forward and backward under a TorchDispatchMode that adds every non-view
ATen op's input and output bytes, and keeps count of what autograd saves
(benchmarks/results/cpu/2026-12-07-eager-bytes/eager-bytes.json). The tables are elements per element of a width —
q (the query's width), kv (the key's = the value's) or F (the MLP's) — per token of a block, beyond what the planner
counts for the fused kernels (RoPE 2 elements forward, ×3 with backward; the gated activation 3F, ×3):

  moved        rope 26 per element of q and of k (12 forward) less the fused 6 (2); swiglu 18 per F (5) less 9 (3);
               attn-layout 6 per q and 4 per kv (4 and 4 forward: a copy of q, k, v and the output; the output's
               gradient copy in backward), nothing fused to subtract;
  kept         swiglu: silu's output beside fc1's (F); attn-layout: flash-attn's [b, s] output beside the
               projection's [s, b] copy (q); rope keeps only its cos/sin tables.
"""

from __future__ import annotations

from overdrive.plan.setup import TrainSetup
from overdrive.plan.specs import ModelSpec

__all__ = ["UNFUSED_ELEMS", "UNFUSED_FWD_ELEMS", "UNFUSED_SAVED", "unfused_elems", "unfused_bytes"]

UNFUSED_ELEMS = {"rope": {"q": 20.0, "kv": 20.0}, "swiglu": {"F": 9.0}, "attn-layout": {"q": 6.0, "kv": 4.0}}
"""Elements moved forward + backward beyond the fused count, per element of each width."""
UNFUSED_FWD_ELEMS = {"rope": {"q": 10.0, "kv": 10.0}, "swiglu": {"F": 2.0}, "attn-layout": {"q": 4.0, "kv": 4.0}}
"""The forward's share of UNFUSED_ELEMS (what a recomputed forward moves again)."""
UNFUSED_SAVED = {"rope": {}, "swiglu": {"F": 1.0}, "attn-layout": {"q": 1.0}}
"""Elements kept for the backward beyond the planner's tensors (activations.act_tensors)."""


def unfused_elems(m: ModelSpec, s: TrainSetup, table: dict, ops: tuple[str, ...] | None = None) -> float:
    """Elements per token of one block (full width, before tp) the named ops (default: --unfused-ops) add."""
    width = {"q": m.q_dim, "kv": m.kv_dim, "F": m.ffn}
    return sum(c * width[k] for op in (s.unfused_ops if ops is None else ops) for k, c in table[op].items())


def unfused_bytes(m: ModelSpec, s: TrainSetup, blocks: float, forward: bool = False,
                  ops: tuple[str, ...] | None = None) -> float:
    """HBM bytes per micro-batch over `blocks` blocks of this GPU: each TP rank's share of the tokens."""
    width = 4 if s.precision == "fp32" else 2
    elems = unfused_elems(m, s, UNFUSED_FWD_ELEMS if forward else UNFUSED_ELEMS, ops)
    return blocks * (s.micro_batch * s.seq / s.cp / s.tp) * elems * width
