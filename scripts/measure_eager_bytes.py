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
# what the planner already counts for a fused kernel (see above): per element, forward + backward and forward alone
FUSED = {"rope": {"q": 6.0, "kv": 6.0}, "swiglu": {"F": 9.0}, "attn-layout": {"q": 0.0, "kv": 0.0}}
FUSED_FORWARD = {"rope": {"q": 2.0, "kv": 2.0}, "swiglu": {"F": 3.0}, "attn-layout": {"q": 0.0, "kv": 0.0}}


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


class Saved:
    """The distinct storages autograd keeps for the backward (saved_tensors_hooks), in bytes: what the eager code
    holds per micro-batch beside what the planner already counts."""

    def __init__(self):
        self.ptrs = {}

    def __enter__(self):
        def pack(t):
            self.ptrs[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t
        self.hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
        self.hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self.hooks.__exit__(*exc)

    def bytes(self, *exclude: torch.Tensor) -> int:
        skip = {t.untyped_storage().data_ptr() for t in exclude}
        return sum(n for p, n in self.ptrs.items() if p not in skip)


def _run(counter: ByteCounter, forward, inputs, grads) -> tuple[int, int, int]:
    """(forward bytes, forward + backward bytes, bytes saved for the backward beyond the inputs' own storage)."""
    counter.bytes, counter.ops, counter.on = 0, [], True
    with Saved() as saved:
        outs = forward(*inputs)
    fwd = counter.bytes
    torch.autograd.grad(outs, inputs, grads)
    counter.on = False
    return fwd, counter.bytes, saved.bytes(*inputs)


def _rope(counter: ByteCounter, heads: int) -> tuple[int, int, int]:
    """RoPE on a query and a key of [s, b, heads, hn] (views of the QKV GEMM's output, as Megatron splits it)."""
    mixed = torch.randn(S, B, 3 * heads * HN, dtype=DT, requires_grad=True)
    freqs = torch.randn(S, 1, 1, HN, dtype=DT)   # the bf16 table (the model was cast by Float16Module)
    q, k, _ = (x.view(S, B, heads, HN) for x in torch.chunk(mixed, 3, dim=-1))
    g = [torch.randn(S, B, heads, HN, dtype=DT) for _ in range(2)]
    return _run(counter, lambda q, k: [apply_rotary_pos_emb(q, freqs), apply_rotary_pos_emb(k, freqs)], [q, k], g)


def rope_case(counter: ByteCounter) -> dict:
    """Per element of q and of k: the slope between two head counts, so the [s, 1, 1, hn] cos/sin tables (a cost
    per sequence, not per element: 1/(b·heads) of it in a real run) drop out."""
    small, big = _rope(counter, NP), _rope(counter, 2 * NP)
    elems = 2 * S * B * NP * HN   # the q and k elements the bigger run adds
    fwd, total, saved = ((b - a) / elems / 2 for a, b in zip(small, big))
    return {"per": {"q": 1, "kv": 1}, "forward": fwd, "total": total, "saved": saved}


def swiglu_case(counter: ByteCounter) -> dict:
    """ParallelMLP's swiglu on the fc1 output [s, b, 2F] (that input is the planner's fc_out, not counted as
    saved here)."""
    x = torch.randn(S, B, 2 * FFN, dtype=DT, requires_grad=True)
    g = torch.randn(S, B, FFN, dtype=DT)

    def forward(x):
        a, b = torch.chunk(x, 2, dim=-1)
        return [F.silu(a) * b]

    fwd, total, saved = (n / (S * B * FFN) / 2 for n in _run(counter, forward, [x], [g]))
    return {"per": {"F": 1}, "forward": fwd, "total": total, "saved": saved}


class _FlashStandIn(torch.autograd.Function):
    """flash_attn_unpadded_func's layout contract without its kernel: (total, h, d) in and out, which it saves for
    its backward; the backward makes dout contiguous as flash-attn 1.x does and returns fresh (empty: the kernel's
    own writes) gradients."""

    @staticmethod
    def forward(ctx, q, k, v):
        out = torch.empty_like(q)
        ctx.save_for_backward(q, k, v, out)
        return out

    @staticmethod
    def backward(ctx, dout):
        dout = dout.contiguous()   # flash_attn_interface.py _flash_attn_backward
        q, k, v, _ = ctx.saved_tensors
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


class _ProjStandIn(torch.autograd.Function):
    """The output projection as far as the layout goes: it keeps its input for the weight gradient; its GEMMs
    are not layout traffic (an empty output and an empty input gradient move nothing here)."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.new_empty(S, B, 8)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return torch.empty_like(x)


def _layout(counter: ByteCounter, heads: int, kv_heads: int) -> tuple[int, int, int]:
    """ParallelAttention's flash-attention path: q, k, v [s, b, np, hn] -> [b, s, np, hn] contiguous, the kernel,
    the output back to [s, b, np·hn] contiguous, then the output projection (which keeps its input)."""
    mixed = torch.randn(S, B, (heads + 2 * kv_heads) * HN, dtype=DT, requires_grad=True)
    q0, k0, v0 = torch.split(mixed, [heads * HN, kv_heads * HN, kv_heads * HN], dim=-1)
    q0, k0, v0 = q0.view(S, B, heads, HN), k0.view(S, B, kv_heads, HN), v0.view(S, B, kv_heads, HN)

    def forward(q0, k0, v0):
        q, k, v = (x.transpose(0, 1).contiguous() for x in (q0, k0, v0))   # rearrange 's b ... -> b s ...'
        flat = [x.reshape(B * S, *x.shape[2:]) for x in (q, k, v)]          # FlashSelfAttention '(b s) ...'
        out = _FlashStandIn.apply(*flat).reshape(B, S, heads, HN)           # '(b s) ... -> b s ...'
        ctx = out.transpose(0, 1).reshape(S, B, heads * HN).contiguous()    # 'b s h d -> s b (h d)'
        return [_ProjStandIn.apply(ctx)]

    return _run(counter, forward, [q0, k0, v0], [torch.randn(S, B, 8, dtype=DT)])


def layout_case(counter: ByteCounter) -> dict:
    """Per element of q's width and of kv's (k's = v's; b covers both): solved from an MHA and a GQA run
    (elements = a·q + b·kv). Saved:
    the stand-in keeps the contiguous q, k, v and its [b, s] output, the projection the [s, b] copy; the planner
    already counts q, k, v (qkv) and one attention output (attn_out)."""
    runs = {}
    for kv in (NP, NP // 2):
        runs[kv] = _layout(counter, NP, kv)
    q_el, kv_el = S * B * NP * HN, S * B * (NP // 2) * HN
    out = {"per": {"q": None, "kv": None}}
    for i, name in enumerate(("forward", "total", "saved")):
        mha, gqa = runs[NP][i] / 2, runs[NP // 2][i] / 2          # elements
        b = (mha - gqa) / (q_el - kv_el)   # per element of kv's width (k and v together), as the planner's kv_dim
        a = (mha - b * q_el) / q_el
        if name == "saved":
            a, b = a - 2, b - 2   # minus the planner's qkv (q + 2kv) and attn_out (q)
        out[name] = {"q": round(a, 6), "kv": round(b, 6)}
    out["per"] = None
    return out


def measure() -> dict:
    """Elements moved per element of the widths each op is defined over, forward + backward and forward alone,
    and what the eager code keeps for backward beyond the planner's tensors."""
    counter = ByteCounter()
    with counter:
        counter.on = False
        rope, swiglu, layout = rope_case(counter), swiglu_case(counter), layout_case(counter)
    ops = {"rope": {"total": {"q": rope["total"], "kv": rope["total"]}, "forward": {"q": rope["forward"],
                                                                                 "kv": rope["forward"]},
                    "saved": {"q": rope["saved"], "kv": rope["saved"]}},
           "swiglu": {"total": {"F": swiglu["total"]}, "forward": {"F": swiglu["forward"]},
                      "saved": {"F": swiglu["saved"]}},
           "attn-layout": {k: layout[k] for k in ("total", "forward", "saved")}}
    for name, op in ops.items():
        op["fused"] = {k: FUSED[name][k] for k in op["total"]}
        op["extra"] = {k: round(op["total"][k] - FUSED[name][k], 6) for k in op["total"]}
        op["extra_forward"] = {k: round(op["forward"][k] - FUSED_FORWARD[name][k], 6) for k in op["total"]}
        op["saved"] = {k: round(v, 6) for k, v in op["saved"].items()}
    return ops


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    cases = measure()
    out = args.out or os.path.join("benchmarks", "results", "cpu",
                                   f"{datetime.date.today().isoformat()}-eager-bytes", "eager-bytes.json")
    doc = {"what": "HBM elements moved per element of each width (q, kv, F), forward + backward and forward alone, "
                   "and kept for backward beyond the planner's tensors, by Megatron-LM's pre-TE eager ops "
                   "(scripts/measure_eager_bytes.py)", "torch": torch.__version__,
           "source": "alibaba/Megatron-LLaMA @ 25306de: megatron/model/rotary_pos_embedding.py, transformer.py "
                     "(ParallelMLP swiglu, ParallelAttention/FlashSelfAttention); flash-attn 1.x's backward "
                     "dout.contiguous()",
           "shapes": {"s": S, "b": B, "heads": NP, "head_dim": HN, "ffn": FFN}, "cases": cases}
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    write_atomic(out, json.dumps(doc, indent=1) + "\n")
    for name, c in cases.items():
        print(f"{name:12s} moved {c['total']} per element (fused, as planned: {c['fused']}; extra {c['extra']}, "
              f"of it forward {c['extra_forward']}); kept for backward beyond the planner's: {c['saved']}")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
