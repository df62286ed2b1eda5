"""The reference GPT: pre-norm decoder, SDPA attention, LayerNorm or RMSNorm, optional tying.

Readable top to bottom, in the manner of nanoGPT. Named sizes in `GPT_SIZES`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["GPTConfig", "GPT", "GPT_SIZES", "gpt_config"]


@dataclass(frozen=True, kw_only=True)
class GPTConfig:
    vocab_size: int = 256
    """Tokens; 256 for the built-in byte-level data."""
    block_size: int = 128
    """Longest sequence (learned positional embeddings)."""
    n_layer: int = 2
    n_head: int = 2
    n_embd: int = 64
    mlp_ratio: int = 4
    """FFN hidden = mlp_ratio * n_embd (GELU MLP)."""
    norm: str = "layernorm"
    """"layernorm" or "rmsnorm"."""
    tie_embeddings: bool = True
    """Share the token embedding with the output head."""
    bias: bool = True
    dropout: float = 0.0

    def __post_init__(self) -> None:
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd={self.n_embd} must be divisible by n_head={self.n_head}")
        if self.norm not in ("layernorm", "rmsnorm"):
            raise ValueError(f"norm={self.norm!r}: use 'layernorm' or 'rmsnorm'")

    def n_params(self, *, non_embedding: bool = True) -> int:
        """Parameter count from the dims (matches GPT.num_params)."""
        d, L, f = self.n_embd, self.n_layer, self.mlp_ratio * self.n_embd
        b = 1 if self.bias else 0
        norm = 2 * d if (self.norm == "layernorm" and self.bias) else d
        attn = d * 3 * d + 3 * d * b + d * d + d * b
        mlp = d * f + f * b + f * d + d * b
        per_block = attn + mlp + 2 * norm
        n = L * per_block + norm + self.vocab_size * d  # blocks, final norm, head (tied or not)
        # "Non-embedding" as nanoGPT/Kaplan count it: without the position table, and without the
        # token table unless it doubles as the head (then it does a matmul per token).
        if non_embedding:
            return n
        return n + self.block_size * d + (0 if self.tie_embeddings else self.vocab_size * d)


GPT_SIZES: dict[str, GPTConfig] = {
    # CPU sizes: tests and the CPU bench.
    "tiny": GPTConfig(n_layer=2, n_head=2, n_embd=64, block_size=64),
    "cpu-student": GPTConfig(n_layer=2, n_head=4, n_embd=128, block_size=128),
    "cpu-teacher": GPTConfig(n_layer=4, n_head=4, n_embd=256, block_size=128),
    # GPU sizes (vocab 32K as a Llama-style tokenizer would give; dims multiples of 128 for tensor cores).
    "gpt-125m": GPTConfig(vocab_size=32768, block_size=2048, n_layer=12, n_head=12, n_embd=768),
    "gpt-350m": GPTConfig(vocab_size=32768, block_size=2048, n_layer=24, n_head=16, n_embd=1024),
    "gpt-760m": GPTConfig(vocab_size=32768, block_size=2048, n_layer=24, n_head=16, n_embd=1536),
    "gpt-1b": GPTConfig(vocab_size=32768, block_size=2048, n_layer=24, n_head=16, n_embd=2048),
}


def gpt_config(size: str, **overrides) -> GPTConfig:
    if size not in GPT_SIZES:
        raise ValueError(f"unknown GPT size '{size}': sizes are {', '.join(GPT_SIZES)}")
    return dataclasses.replace(GPT_SIZES[size], **overrides)


def _norm(cfg: GPTConfig) -> nn.Module:
    if cfg.norm == "rmsnorm":
        return nn.RMSNorm(cfg.n_embd, eps=1e-6)
    return nn.LayerNorm(cfg.n_embd, bias=cfg.bias)


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.dropout = cfg.dropout

    def forward(self, x: torch.Tensor, cache: dict | None = None) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        # (B, T, C) -> (B, nh, T, hs): SDPA picks flash / memory-efficient / cuDNN / math itself.
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        causal = True
        if cache is not None:  # decoding: attend to everything cached so far plus the new tokens
            if "k" in cache:
                k, v = torch.cat([cache["k"], k], 2), torch.cat([cache["v"], v], 2)
                causal = T > 1  # one new token may see every cached one
            cache["k"], cache["v"] = k, v
        y = F.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                           dropout_p=self.dropout if self.training else 0.0)
        return self.proj(y.transpose(1, 2).contiguous().view(B, T, C))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(cfg.n_embd, cfg.mlp_ratio * cfg.n_embd, bias=cfg.bias)
        self.proj = nn.Linear(cfg.mlp_ratio * cfg.n_embd, cfg.n_embd, bias=cfg.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.norm1, self.attn = _norm(cfg), CausalSelfAttention(cfg)
        self.norm2, self.mlp = _norm(cfg), MLP(cfg)

    def forward(self, x: torch.Tensor, cache: dict | None = None) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), cache)
        return x + self.mlp(self.norm2(x))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.config = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.pos_emb = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.norm_f = _norm(cfg)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight
        self.apply(self._init)
        # GPT-2's scaled init of the residual projections: std 0.02 / sqrt(2 * n_layer).
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def num_params(self, *, non_embedding: bool = True) -> int:
        n = sum(p.numel() for p in self.parameters())  # parameters() counts a tied weight once
        if non_embedding:
            n -= self.pos_emb.weight.numel()
            if not self.config.tie_embeddings:
                n -= self.tok_emb.weight.numel()
        return n

    def hidden(self, idx: torch.Tensor) -> torch.Tensor:
        """Final-norm hidden states (B, T, C), before the head: for fused linear cross-entropy."""
        B, T = idx.shape
        if T > self.config.block_size:
            raise ValueError(f"sequence length {T} exceeds block_size {self.config.block_size}")
        pos = torch.arange(T, device=idx.device)
        x = self.tok_emb(idx) + self.pos_emb(pos)  # (B, T, C)
        for block in self.blocks:
            x = block(x)
        return self.norm_f(x)

    @torch.no_grad()
    def decode(self, idx: torch.Tensor, caches: list[dict], start: int) -> torch.Tensor:
        """Logits for `idx` (B, T) at positions start..start+T-1, extending the per-block KV caches.

        Prefill: caches = [{} for each block], start = 0. Decode: one token at a time after that.
        """
        B, T = idx.shape
        if start + T > self.config.block_size:
            raise ValueError(f"position {start + T} exceeds block_size {self.config.block_size}")
        pos = torch.arange(start, start + T, device=idx.device)
        x = self.tok_emb(idx) + self.pos_emb(pos)
        for block, cache in zip(self.blocks, caches):
            x = block(x, cache)
        return self.lm_head(self.norm_f(x[:, -1:]))  # (B, 1, V): only the last position is needed

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        logits = self.lm_head(self.hidden(idx))  # (B, T, V)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), targets.reshape(-1))
        return logits, loss
