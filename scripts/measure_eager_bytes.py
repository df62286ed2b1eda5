"""Count the HBM bytes that Megatron-LM's pre-Transformer-Engine block code moves in the kernels it runs eagerly:
the numbers behind the planner's `--unfused-ops` (`overdrive.plan.throughput`, `UNFUSED_ELEMS`).

Megatron-LM's megatron/model/ (before Megatron-Core and Transformer Engine, 2023; forks such as alibaba/Megatron-LLaMA
@ 25306de keep it) fuses the norms (apex), bias-GeLU and bias-dropout-add (TorchScript) and the masked softmax (its
own CUDA kernels), but runs three things as plain PyTorch ops:

  rope         megatron/model/rotary_pos_embedding.py `apply_rotary_pos_emb` on the query and the key:
               t * cos + _rotate_half(t) * sin, _rotate_half = cat(-x2, x1), then cat((t, t_pass)); the model is
               cast to bf16 (Float16Module), so are the cos/sin tables;
  swiglu       megatron/model/transformer.py ParallelMLP: x = torch.chunk(x, 2, -1); F.silu(x[0]) * x[1];
  attn-layout  transformer.py ParallelAttention with --use-flash-attn: q, k, v rearranged 's b ... -> b s ...'
               and .contiguous(), the output 'b s h d -> s b (h d)' and .contiguous(); FlashSelfAttention views
               them '(b s) ...' and back; flash-attn 1.x's backward makes its incoming gradient contiguous
               (flash_attn_interface.py `_flash_attn_backward`: dout.contiguous()).

Each is run here forward and backward (torch.autograd.grad, so no AccumulateGrad copy is counted) under a
TorchDispatchMode that adds, for every ATen op that is not a view, the bytes of its tensor inputs and outputs
(empty allocations write nothing; in-place ops read and write their target). The attention kernel itself is a
stand-in that moves nothing, so only the layout traffic around it is counted. The result is elements moved per
element of the tensor the op is defined over (q and k's elements for rope, the MLP's F per token for swiglu, the
attention's q/k/v/out width for attn-layout), forward + backward, in bf16. The planner already counts a fused
kernel's traffic for RoPE (2 elements forward, ×3 with backward: 6) and the gated activation (3F forward, ×3:
9 per F); the extra it adds for an unfused op is this count less that.

  python scripts/measure_eager_bytes.py [--out FILE]
  (default FILE: benchmarks/results/cpu/<date>-eager-bytes/eager-bytes.json). Bytes do not depend on the device.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from overdrive.io import write_atomic

S, HN, FFN = 64, 32, 96   # sequence, head dim, MLP width on this rank
B, NP = 2, 4             # batch and heads on this rank (rope_case varies them)
DT = torch.bfloat16
FUSED = {"rope": 6.0, "swiglu": 9.0, "attn-layout": 0.0}   # what the planner already counts (see above)


# ops that return an alias without a kernel, though their schema does not say view (_unsafe_view: reshape's result)
_ALIASES = (torch.ops.aten.detach, torch.ops.aten.lift_fresh, torch.ops.aten._unsafe_view)


class ByteCounter(TorchDispatchMode):
    """Sum the bytes every non-view ATen op reads and writes (tensor inputs + outputs), while `on`."""

    def __init__(self):
        super().__init__()
        self.bytes, self.on, self.ops = 0, True, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not self.on or func.is_view or func.overloadpacket in _ALIASES:
            return out
        reads = [t for t in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        writes = [t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
        if func.overloadpacket in (torch.ops.aten.empty, torch.ops.aten.empty_like, torch.ops.aten.new_empty,
                                   torch.ops.aten.empty_strided, torch.ops.aten.new_empty_strided):
            reads, writes = [], []   # an allocation: no kernel reads or writes anything
        n = sum(t.numel() * t.element_size() for t in reads + writes)
        self.bytes += n
        self.ops.append((str(func), n))
        return out


def _rotate_half(x):
    x1, x2 = x.reshape(*x.shape[:-1], 2, x.shape[-1] // 2).unbind(dim=-2)   # einops '... (j d) -> ... j d', j=2
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(t, freqs):
    rot_dim = freqs.shape[-1]
    t, t_pass = t[..., :rot_dim], t[..., rot_dim:]
    t = (t * freqs.cos()) + (_rotate_half(t) * freqs.sin())
    return torch.cat((t, t_pass), dim=-1)


def _rope_bytes(counter: ByteCounter, heads: int) -> tuple[int, int]:
    """RoPE on a query and a key of [s, b, heads, hn] (views of the QKV GEMM's output, as Megatron splits it)."""
    mixed = torch.randn(S, B, 3 * heads * HN, dtype=DT, requires_grad=True)
    freqs = torch.randn(S, 1, 1, HN, dtype=DT)   # the bf16 table (the model was cast by Float16Module)
    g = [torch.randn(S, B, heads, HN, dtype=DT) for _ in range(2)]
    q, k, _ = (x.view(S, B, heads, HN) for x in torch.chunk(mixed, 3, dim=-1))
    counter.bytes, counter.ops, counter.on = 0, [], True
    outs = [apply_rotary_pos_emb(q, freqs), apply_rotary_pos_emb(k, freqs)]
    torch.autograd.grad(outs, [q, k], g)
    counter.on = False
    return counter.bytes, 2 * q.numel()


def rope_case(counter: ByteCounter) -> tuple[float, int]:
    """Per element of q and k: the slope between two head counts, so the [s, 1, 1, hn] cos/sin tables (a cost
    per sequence, not per element: 1/(b·heads) of it in a real run) drop out."""
    small, big = _rope_bytes(counter, NP), _rope_bytes(counter, 2 * NP)
    return big[0] - small[0], big[1] - small[1]


def swiglu_case(counter: ByteCounter) -> tuple[float, int]:
    """ParallelMLP's swiglu on the fc1 output [s, b, 2F]."""
    x = torch.randn(S, B, 2 * FFN, dtype=DT, requires_grad=True)
    g = torch.randn(S, B, FFN, dtype=DT)
    counter.bytes, counter.ops, counter.on = 0, [], True
    a, b = torch.chunk(x, 2, dim=-1)
    out = F.silu(a) * b
    torch.autograd.grad([out], [x], [g])
    counter.on = False
    return counter.bytes, S * B * FFN


class _FlashStandIn(torch.autograd.Function):
    """flash_attn_unpadded_func's layout contract without its kernel: (total, h, d) in and out; the backward makes
    dout contiguous as flash-attn 1.x does and returns fresh (empty: the kernel's own writes) gradients."""

    @staticmethod
    def forward(ctx, q, k, v):
        return torch.empty_like(q)

    @staticmethod
    def backward(ctx, dout):
        dout = dout.contiguous()   # flash_attn_interface.py _flash_attn_backward
        return torch.empty_like(dout), torch.empty_like(dout), torch.empty_like(dout)


def layout_case(counter: ByteCounter) -> tuple[float, int]:
    """ParallelAttention's flash-attention path: q, k, v [s, b, np, hn] -> [b, s, np, hn] contiguous, the kernel,
    the output back to [s, b, np·hn] contiguous."""
    mixed = torch.randn(S, B, 3 * NP * HN, dtype=DT, requires_grad=True)
    g = torch.randn(S, B, NP * HN, dtype=DT)
    q0, k0, v0 = (x.view(S, B, NP, HN) for x in torch.chunk(mixed, 3, dim=-1))
    counter.bytes, counter.ops, counter.on = 0, [], True
    q, k, v = (x.transpose(0, 1).contiguous() for x in (q0, k0, v0))   # rearrange 's b ... -> b s ...'
    flat = [x.reshape(B * S, NP, HN) for x in (q, k, v)]                 # FlashSelfAttention '(b s) ...'
    out = _FlashStandIn.apply(*flat).reshape(B, S, NP, HN)               # '(b s) ... -> b s ...'
    ctx = out.transpose(0, 1).reshape(S, B, NP * HN).contiguous()        # 'b s h d -> s b (h d)'
    torch.autograd.grad([ctx], [q0, k0, v0], [g])
    counter.on = False
    return counter.bytes, S * B * NP * HN


def measure() -> dict:
    counter = ByteCounter()
    cases = {}
    with counter:
        counter.on = False
        for name, fn in (("rope", rope_case), ("swiglu", swiglu_case), ("attn-layout", layout_case)):
            nbytes, elems = fn(counter)
            moved = nbytes / elems / 2   # elements of 2 bytes per element
            cases[name] = {"elements_per_element": round(moved, 3), "planner_fused": FUSED[name],
                           "extra": round(moved - FUSED[name], 3),
                           "ops": [f"{op} {n}" for op, n in counter.ops]}
    return cases


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    cases = measure()
    out = args.out or os.path.join("benchmarks", "results", "cpu",
                                   f"{datetime.date.today().isoformat()}-eager-bytes", "eager-bytes.json")
    doc = {"what": "HBM elements moved per element, forward + backward, by Megatron-LM's pre-TE eager ops "
                   "(scripts/measure_eager_bytes.py)", "torch": torch.__version__,
           "source": "alibaba/Megatron-LLaMA @ 25306de: megatron/model/rotary_pos_embedding.py, transformer.py "
                     "(ParallelMLP swiglu, ParallelAttention/FlashSelfAttention); flash-attn 1.x's backward "
                     "dout.contiguous()",
           "shapes": {"s": S, "b": B, "heads": NP, "head_dim": HN, "ffn": FFN}, "cases": cases}
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    write_atomic(out, json.dumps(doc, indent=1) + "\n")
    for name, c in cases.items():
        print(f"{name:12s} {c['elements_per_element']:6.2f} elements per element (fused, as planned: "
              f"{c['planner_fused']:.0f}; extra {c['extra']:+.2f})")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
