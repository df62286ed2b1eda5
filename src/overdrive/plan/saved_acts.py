"""Measure what autograd saves for backward in one eager decoder block, to check the planner's eager term.

`saved_bytes` runs a block forward under `torch.autograd.graph.saved_tensors_hooks` and adds up the storages
the pack hook sees, each once (deduplicated by the storage's data pointer), leaving out the block's parameters
and buffers and the caller's constant inputs (RoPE tables): what is left is what the block keeps alive from its
forward to its backward, the planner's `act_tensors` per token when divided by batch × sequence.

Two blocks, written as their sources write them (no other code of theirs is imported):
  `TorchtuneBlock`  torchtune's TransformerSelfAttentionLayer for Llama 3 (torchtune/modules/rms_norm.py,
                    attention.py, feed_forward.py, models/llama3_1/_position_embeddings.py @ 1814feb):
                    RMSNorm in fp32 (`x.float()`, `pow`, `rsqrt`, `type_as`, `* scale`), RoPE in fp32 on
                    interleaved pairs, k and v expanded to every query head with `expand(...).flatten(1, 2)`
                    (a copy), SDPA, `output.transpose(1, 2).contiguous()`, SwiGLU `w2(silu(w1 x) * w3 x)`.
  `hf_block`        Hugging Face transformers' LlamaDecoderLayer itself (the installed transformers), SDPA.

On CPU, `F.scaled_dot_product_attention` with `is_causal=True` and no mask runs the flash kernel for CPU,
which saves q, k, v, the output and an fp32 logsumexp per query and head, as flash and memory-efficient
attention (and flex attention, torchtune's kernel for packed batches) do on a GPU. The math kernel (a mask
the fused kernels cannot take) saves the s × s probabilities as well; `sdpa="math"` forces it to show that.
"""

from __future__ import annotations


import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["TorchtuneBlock", "hf_block", "saved_bytes", "measure_per_token", "rope_cache"]


class _RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.scale = nn.Parameter(torch.ones(dim))

    def forward(self, x):  # torchtune/modules/rms_norm.py
        x_fp32 = x.float()
        x_normed = (x_fp32 * torch.rsqrt(x_fp32.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x)
        return x_normed * self.scale


def rope_cache(seq: int, head_dim: int, base: float = 500000.0) -> torch.Tensor:
    """torchtune's RoPE cache: [seq, head_dim/2, 2] of cos, sin (fp32)."""
    theta = 1.0 / (base ** (torch.arange(0, head_dim, 2)[: head_dim // 2].float() / head_dim))
    idx = torch.outer(torch.arange(seq).float(), theta)
    return torch.stack([torch.cos(idx), torch.sin(idx)], dim=-1)


def _rope(x, cache):  # torchtune/models/llama3_1/_position_embeddings.py (Llama3ScaledRoPE.forward)
    seq_len = x.size(1)
    rc = cache[:seq_len]
    xshaped = x.float().reshape(*x.shape[:-1], -1, 2)
    rc = rc.view(-1, xshaped.size(1), 1, xshaped.size(3), 2)
    x_out = torch.stack([xshaped[..., 0] * rc[..., 0] - xshaped[..., 1] * rc[..., 1],
                         xshaped[..., 1] * rc[..., 0] + xshaped[..., 0] * rc[..., 1]], -1)
    return x_out.flatten(3).type_as(x)


class TorchtuneBlock(nn.Module):
    def __init__(self, hidden: int, ffn: int, heads: int, kv_heads: int, head_dim: int | None = None,
                 sdpa: str = "flash"):
        super().__init__()
        self.h, self.nh, self.nkv = hidden, heads, kv_heads
        self.hd = head_dim or hidden // heads
        self.sdpa = sdpa
        self.sa_norm, self.mlp_norm = _RMSNorm(hidden), _RMSNorm(hidden)
        self.q_proj = nn.Linear(hidden, heads * self.hd, bias=False)
        self.k_proj = nn.Linear(hidden, kv_heads * self.hd, bias=False)
        self.v_proj = nn.Linear(hidden, kv_heads * self.hd, bias=False)
        self.output_proj = nn.Linear(heads * self.hd, hidden, bias=False)
        self.w1 = nn.Linear(hidden, ffn, bias=False)
        self.w2 = nn.Linear(ffn, hidden, bias=False)
        self.w3 = nn.Linear(hidden, ffn, bias=False)

    def _attn(self, x, cache):  # torchtune/modules/attention.py MultiHeadAttention.forward
        b, s, _ = x.shape
        q = _rope(self.q_proj(x).view(b, s, -1, self.hd), cache).transpose(1, 2)
        k = _rope(self.k_proj(x).view(b, s, -1, self.hd), cache).transpose(1, 2)
        v = self.v_proj(x).view(b, s, -1, self.hd).transpose(1, 2)
        if self.nh != self.nkv:
            shape = (b, self.nkv, self.nh // self.nkv, -1, self.hd)
            k = k.unsqueeze(2).expand(shape).flatten(1, 2)
            v = v.unsqueeze(2).expand(shape).flatten(1, 2)
        if self.sdpa == "math":
            with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.FLASH_ATTENTION):
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.output_proj(out.transpose(1, 2).contiguous().view(b, s, -1))

    def forward(self, x, cache):  # torchtune/modules/transformer.py TransformerSelfAttentionLayer.forward
        h = self._attn(self.sa_norm(x), cache) + x
        m = self.mlp_norm(h)
        return self.w2(F.silu(self.w1(m)) * self.w3(m)) + h


def hf_block(hidden: int, ffn: int, heads: int, kv_heads: int, head_dim: int | None = None):
    """transformers' LlamaDecoderLayer (sdpa) and its rotary embedding, or None without transformers."""
    try:
        from transformers import LlamaConfig
        from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding
    except ImportError:
        return None
    cfg = LlamaConfig(hidden_size=hidden, intermediate_size=ffn, num_attention_heads=heads,
                      num_key_value_heads=kv_heads, head_dim=head_dim or hidden // heads, num_hidden_layers=1,
                      vocab_size=32, attention_dropout=0.0, attn_implementation="sdpa")
    cfg._attn_implementation = "sdpa"
    return LlamaDecoderLayer(cfg, layer_idx=0), LlamaRotaryEmbedding(cfg)


def saved_bytes(fn, exclude: list[torch.Tensor]) -> tuple[int, list[tuple[tuple, torch.dtype]]]:
    """(bytes of the distinct storages autograd saves while `fn()` runs, their shapes), outside `exclude`."""
    skip = {t.untyped_storage().data_ptr() for t in exclude}
    seen: dict[int, tuple[int, tuple, torch.dtype]] = {}

    def pack(t):
        st = t.untyped_storage()
        ptr = st.data_ptr()
        if ptr not in skip and ptr not in seen:
            seen[ptr] = (st.nbytes(), tuple(t.shape), t.dtype)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    del out
    return sum(v[0] for v in seen.values()), [(v[1], v[2]) for v in seen.values()]


def measure_per_token(kind: str, hidden: int, ffn: int, heads: int, kv_heads: int, head_dim: int | None = None,
                      batch: int = 1, seq: int = 16, dtype=torch.bfloat16, sdpa: str = "flash",
                      compiled: bool = False) -> float:
    """Bytes autograd saves per token for one block of `kind` (torchtune | hf), measured.

    compiled: the block under torch.compile with the `aot_eager_decomp_partition` backend, which traces, splits
    forward from backward with the min-cut partitioner Inductor uses (what to save, what to recompute) and runs
    the graphs without generating kernels: what a compiled block saves, without a C++ compiler."""
    torch.manual_seed(0)
    x = torch.randn(batch, seq, hidden, dtype=dtype, requires_grad=True)
    if kind == "torchtune":
        blk = TorchtuneBlock(hidden, ffn, heads, kv_heads, head_dim, sdpa=sdpa).to(dtype)
        cache = rope_cache(seq, blk.hd)
        consts = [cache]

        def fn():
            return blk(x, cache)
    elif kind == "hf":
        made = hf_block(hidden, ffn, heads, kv_heads, head_dim)
        if made is None:
            raise RuntimeError("transformers is not installed: pip install transformers, or measure kind='torchtune'")
        blk, rot = made
        blk = blk.to(dtype)
        pos = torch.arange(seq).unsqueeze(0).expand(batch, -1)
        cos, sin = rot(x, pos)
        consts = [cos, sin]

        def fn():
            out = blk(x, position_embeddings=(cos, sin), attention_mask=None, position_ids=pos)
            return out[0] if isinstance(out, tuple) else out
    else:
        raise ValueError(f"kind {kind!r}: use torchtune or hf")
    exclude = list(blk.parameters()) + list(blk.buffers()) + consts
    if compiled:
        torch._dynamo.reset()
        eager_fn = fn
        cblk = torch.compile(blk, backend="aot_eager_decomp_partition", fullgraph=True)
        if kind == "torchtune":
            def fn():
                return cblk(x, cache)
        else:
            def fn():
                out = cblk(x, position_embeddings=(cos, sin), attention_mask=None, position_ids=pos)
                return out[0] if isinstance(out, tuple) else out
        del eager_fn
        fn().float().sum().backward()   # compile outside the hooks
    total, _ = saved_bytes(fn, exclude)
    return total / (batch * seq)
