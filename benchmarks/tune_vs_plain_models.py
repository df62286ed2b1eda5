"""Two user models overdrive never saw, for benchmarks/tune_vs_plain.py: a tiny HF Llama (transformers) and a small ViT."""
import torch
from torch import nn


def llama():
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=2048, hidden_size=256, intermediate_size=688, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256)
    return LlamaForCausalLM(cfg)


def llama_batch(step):
    g = torch.Generator().manual_seed(step)
    ids = torch.randint(0, 2048, (8, 128), generator=g)
    return {"input_ids": ids, "labels": ids}


class ViT(nn.Module):
    def __init__(self, dim=256, depth=4, heads=8, patch=4, img=32, classes=10):
        super().__init__()
        self.patch = nn.Conv2d(3, dim, patch, patch)
        n = (img // patch) ** 2
        self.pos = nn.Parameter(torch.zeros(1, n, dim))
        layer = nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0, batch_first=True, norm_first=True)
        self.enc = nn.TransformerEncoder(layer, depth)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        h = self.patch(x).flatten(2).transpose(1, 2) + self.pos
        return self.head(self.norm(self.enc(h)).mean(1))


def vit():
    return ViT()


def vit_batch(step):
    g = torch.Generator().manual_seed(step)
    return (torch.randn(32, 3, 32, 32, generator=g), torch.randint(0, 10, (32,), generator=g))


def vit_loss(model, batch):
    x, y = batch
    return nn.functional.cross_entropy(model(x), y)
