"""What autograd keeps per token of one transformer block, tensor by tensor (no checkpointing, before the tp·cp
division): the fused count (`act_tensors`) and the eager PyTorch blocks' (`eager_act_tensors`). `memory.py`
turns them into bytes per GPU; its docstring, "activations per layer", says where each count comes from.
"""

from __future__ import annotations

from overdrive.plan.setup import TrainSetup
from overdrive.plan.specs import ModelSpec
from overdrive.plan.unfused import UNFUSED_SAVED

__all__ = ["act_tensors", "eager_act_tensors", "REPLICATED_WITHOUT_SP"]


def eager_act_tensors(m: ModelSpec, s: TrainSetup) -> dict[str, float]:
    """Bytes autograd keeps per token of one EAGER PyTorch Llama block, by tensor (`--block-code`).

    Counted op by op from what each op's backward saves, as torchtune and transformers write the block, and
    checked against a measurement (`overdrive.plan.saved_acts`: saved-tensor hooks, storages deduplicated,
    tests/unit/test_plan_eager_acts.py). w = 2 bytes (4 in fp32):
      RMSNorm, twice (`x.float()`; `pow(2)` saves the fp32 x; `rsqrt` its fp32 result, one per token; the
      product `x_fp32 · rstd` both; `.type_as(x)` nothing; `x_normed · scale` the 16-bit x_normed; the next
      linear saves the norm's output): 4h + 4 + w·h + w·h. In fp32, `.float()` is the input itself: same sum.
    RoPE (torchtune's fp32 pairs; HF's `q·cos + rotate_half(q)·sin`) saves only its constant tables.
      Attention (SDPA flash / memory-efficient on a GPU, flex attention for torchtune's packed batches, the
      flash kernel for CPU): q, k, v, the output and an fp32 logsumexp per head: w·(q + 2·kv' + q) + 4·heads,
      kv' = the query width when the block copies k and v to every head (torchtune's
      `expand(...).flatten(1, 2)`; a view, not a copy, for one kv head) or the kv width when SDPA takes them
      shared (transformers' `enable_gqa`). The output projection saves the attention output itself
      (`transpose(1, 2).contiguous()` of a (b, s, heads, d)-laid output is no copy).
      SwiGLU `w2(silu(w1 x) · w3 x)`: w1's output (silu's input), silu's output, w3's output, their product
      (w2's input): 4·F·w (a 2-matrix MLP: its fc output and activation output, 2·F·w).
    Against the fused count (`act_tensors`: norm in and out at w·h each, 3·F·w for the MLP) the eager norm
    keeps an fp32 copy and the normalised 16-bit tensor on top, and SwiGLU one more F-wide tensor."""
    h, qd, kv, F = m.hidden, m.q_dim, m.kv_dim, m.ffn
    w = 4 if s.precision == "fp32" else 2
    kv_saved = qd if (s.block_code == "torchtune" and 1 < m.n_kv_head < m.n_head) else kv
    norm = {"fp32_copy": 4 * h, "rstd": 4, "normed": w * h, "out": w * h}
    t = {f"norm{i}_{k}": v for i in (1, 2) for k, v in norm.items()}
    t.update({"q": qd * w, "k": kv_saved * w, "v": kv_saved * w, "attn_out": qd * w, "lse": 4 * m.n_head})
    t.update({"fc1_out": F * w, "act_out": F * w, "fc3_out": F * w, "gated": F * w} if m.gated_mlp
             else {"fc1_out": F * w, "act_out": F * w})
    if m.qk_norm:   # q and k before their eager RMSNorms, and the fp32 copy each norm makes
        t["qk_norm_in"] = (qd + kv) * (w + 4)
    if s.attention == "unfused":
        t["scores"] = 3 * m.n_head * s.seq / s.cp
    return t


def act_tensors(m: ModelSpec, s: TrainSetup) -> dict[str, float]:
    """Bytes autograd keeps per token of one block, by tensor (no checkpointing, before tp·cp division).

    16-bit (fp32: 4 bytes) unless FP8 activation storage is on, where Transformer Engine keeps a 1-byte
    quantized copy of each GEMM input for the weight gradient (qkv_in, mlp_in, act_out) and, for the output
    projection, an FP8 copy beside the 16-bit attention output that flash attention keeps for its own backward.
    Without FP8 storage the projection saves the attention output itself (one storage, counted once)."""
    if s.block_code and not s.compile:
        return eager_act_tensors(m, s)
    h, qd, kv, F = m.hidden, m.q_dim, m.kv_dim, m.ffn
    w = 4 if s.precision == "fp32" else 2
    # Transformer Engine keeps the FP8 copies whenever it runs FP8: --stack megatron implies --fp8-activations
    q = 1 if ((s.fp8_activations or s.stack == "megatron") and s.low_precision) else w
    t = {"norm1_in": h * w, "qkv_in": h * q, "qkv": (qd + 2 * kv) * w, "attn_out": qd * w,
         "proj_in": qd * q if q != w else 0, "norm2_in": h * w, "mlp_in": h * q,
         "fc_out": F * (2 if m.gated_mlp else 1) * w, "act_out": F * q}
    if m.qk_norm:
        t["qk_norm_in"] = (qd + kv) * w   # q and k before their norms (the normed ones are "qkv")
    if s.attention == "unfused":
        # every score's 16-bit softmax output (the fused softmax keeps no pre-softmax scores), and with dropout its
        # 1-byte mask and the 16-bit dropped-out copy the product with V saves: Korthikanti et al.'s 5as/h per token
        # (Table 2: softmax 2as²b, dropout mask as²b, attention over values 2as²b); without dropout the product
        # saves the softmax output itself (torch's dropout at p = 0 returns its input): 2·heads·s
        t["scores"] = (5 if s.dropout else 2) * m.n_head * s.seq / s.cp
    if "swiglu" in s.unfused_ops:   # pre-TE Megatron's eager SwiGLU keeps silu's output too (unfused.py)
        t["silu_out"] = F * w * UNFUSED_SAVED["swiglu"]["F"]
    if "attn-layout" in s.unfused_ops:   # flash-attn's [b, s] output beside the projection's [s, b] copy
        t["attn_out_bs"] = qd * w * UNFUSED_SAVED["attn-layout"]["q"]
    if s.dropout:
        # the 1-byte masks of the dropout after the attention projection and after the MLP (Korthikanti et al.'s
        # two sbh "dropout mask" rows; Megatron's bias_dropout_add saves its mask)
        t["dropout_masks"] = 2 * h
    # Megatron selective recompute: what each named module no longer keeps (its inputs stay saved).
    # core_attn without flash attention: the s × s scores (softmax output, dropout mask) are what it drops
    drop = {"core_attn": (("attn_out",) if q != w else ()) + (("scores",) if s.attention == "unfused" else ())
            + ("attn_out_bs",),   # the kernel's own output goes with it
            "mlp": ("mlp_in", "fc_out", "act_out", "silu_out"),   # the MLP reruns from its input (norm2_in, kept)
            # norm outputs rerun from the norm inputs; with FP8 storage the GEMMs keep their own FP8 copies
            "layernorm": ("qkv_in", "mlp_in") if q == w else ()}
    for mod in s.recompute_modules:
        for k in drop[mod]:
            if k in t:
                t[k] = 0
    if s.block_code:
        # torch.compile'd torchtune / transformers block (measured with the min-cut partitioner Inductor uses,
        # `saved_acts.measure_per_token(compiled=True)`): the fused count above, plus the k and v the code copies
        # to every head (torchtune), an fp32 rstd per RMSNorm and the attention's fp32 logsumexp per head
        if s.block_code == "torchtune" and 1 < m.n_kv_head < m.n_head:
            t["qkv"] += 2 * (qd - kv) * w
        t["rstd"] = 2 * 4
        t["lse"] = 4 * m.n_head
    return t


REPLICATED_WITHOUT_SP = ("norm1_in", "qkv_in", "norm2_in", "mlp_in", "rstd", "dropout_masks")
"""Tensors of a block every TP rank keeps whole without sequence parallelism: the norms' inputs and outputs
(Korthikanti et al. 2022's 10·s·b·h of "sbh(10 + 24/t + 5as/ht)": the norms' 8, the two dropout masks' 2 with --dropout)."""
