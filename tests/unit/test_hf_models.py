"""accelerate() on Hugging Face GPT-2 and Llama built from configs (no download)."""

import pytest
import torch

import overdrive
from fakes import TORCHAO_EMU, machine
from overdrive.convert import find_blocks, norm_kind
from overdrive.env import build_report
from overdrive.models.hf import build_hf_model

pytest.importorskip("transformers")
pytest.importorskip("torchao")
CPU = build_report(machine(None, torchao=TORCHAO_EMU))


def _train(model, recipe, steps=6):
    acc = overdrive.accelerate(model, recipe, env=CPU, lr=3e-3)
    x = torch.randint(0, 256, (4, 24), generator=torch.Generator().manual_seed(0))
    losses = []
    for _ in range(steps):
        with acc.autocast():
            loss = acc.model(input_ids=x, labels=x).loss
        acc.backward(loss)
        acc.step()
        losses.append(loss.item())
    return acc, losses


@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("recipe", ["fp32", "amp-bf16", "fp8",
                                    overdrive.Recipe(precision="fp32", activation_checkpointing="full")])
def test_hf_models_train_under_presets(family, recipe):
    torch.manual_seed(0)
    model = build_hf_model(family, n_layer=2, d_model=64, n_head=4, vocab_size=256)
    sd_keys = set(model.state_dict())
    acc, losses = _train(model, recipe)
    assert losses[-1] < losses[0], losses
    assert set(acc.model.state_dict()) == sd_keys
    fresh = build_hf_model(family, n_layer=2, d_model=64, n_head=4, vocab_size=256)
    fresh.load_state_dict(acc.model.state_dict(), strict=True)
    if getattr(recipe, "activation_checkpointing", "none") == "full":
        assert len(acc.checkpointed) == 2


def test_hf_structure_is_understood():
    llama = build_hf_model("llama", n_layer=2, d_model=64)
    fqn, blocks = find_blocks(llama)
    assert fqn == "model.layers" and len(blocks) == 2
    assert norm_kind(llama.model.norm) == "rmsnorm"
    gpt2 = build_hf_model("gpt2", n_layer=2, d_model=64)
    assert find_blocks(gpt2)[0] == "transformer.h"
    acc = overdrive.accelerate(gpt2, "fp8", env=CPU, build_optimizer=False)
    rep = acc.report()
    assert "transformers Conv1D (a transposed Linear), not an nn.Linear" in rep
    acc = overdrive.accelerate(llama, "fp8", env=CPU, build_optimizer=False)
    decs = {d.fqn: d for d in acc.conversions["fp8"]}
    assert decs["model.layers.0.mlp.gate_proj"].converted and not decs["lm_head"].converted


# -- activation checkpointing on HF models: T5's cache, encoder stacks, the model's own checkpointing -------
def _t5():
    import transformers

    cfg = transformers.T5Config(vocab_size=128, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2,
                                num_heads=4, dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0)
    return transformers.T5ForConditionalGeneration(cfg)


def _grads(model, recipe, x, y):
    acc = overdrive.accelerate(model, recipe, env=CPU, build_optimizer=False)
    acc.model(input_ids=x, labels=y).loss.backward()
    return acc, {n: p.grad.clone() for n, p in acc.model.named_parameters() if p.grad is not None}


def test_t5_full_checkpointing_matches_plain_gradients():
    torch.manual_seed(0)
    plain = _t5()
    ckpt = _t5()
    ckpt.load_state_dict(plain.state_dict())
    x, y = torch.randint(1, 128, (2, 12)), torch.randint(1, 128, (2, 7))
    _, g_ref = _grads(plain, "fp32", x, y)
    acc, g = _grads(ckpt, overdrive.Recipe(precision="fp32", activation_checkpointing="full"), x, y)
    # the decoder's cache used to fill during forward: CheckpointError in backward
    assert acc.checkpointed == ["decoder.block.0", "decoder.block.1", "encoder.block.0", "encoder.block.1"]
    assert any(d.chosen == "use_cache=False" for d in acc.resolved.decisions)
    assert g.keys() == g_ref.keys()
    for n in g_ref:
        assert torch.allclose(g[n], g_ref[n], rtol=1e-5, atol=1e-6), n


def test_hf_own_gradient_checkpointing_is_detected():
    llama = build_hf_model("llama", n_layer=2, d_model=64)
    llama.gradient_checkpointing_enable()
    acc = overdrive.accelerate(llama, overdrive.Recipe(precision="fp32", activation_checkpointing="full"), env=CPU)
    assert acc.checkpointed == []  # not recomputed twice
    assert any("already on" in d.reason for d in acc.resolved.decisions)


class _ViTBlock(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = torch.nn.LayerNorm(d)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 2 * d), torch.nn.GELU(), torch.nn.Linear(2 * d, d))

    def forward(self, x):
        return x + self.mlp(self.norm(x))


class _TimmLikeViT(torch.nn.Module):
    """timm's VisionTransformer keeps its blocks in an nn.Sequential, not an nn.ModuleList."""

    def __init__(self, d=32, depth=3):
        super().__init__()
        self.patch_embed = torch.nn.Linear(12, d)
        self.blocks = torch.nn.Sequential(*[_ViTBlock(d) for _ in range(depth)])
        self.head = torch.nn.Linear(d, 4)

    def forward(self, x):
        return self.head(self.blocks(self.patch_embed(x)).mean(1))


def test_checkpointing_finds_sequential_blocks():
    torch.manual_seed(0)
    vit = _TimmLikeViT()
    ref = _TimmLikeViT()
    ref.load_state_dict(vit.state_dict())
    acc = overdrive.accelerate(vit, overdrive.Recipe(precision="fp32", activation_checkpointing="full"), env=CPU,
                               build_optimizer=False)
    assert acc.checkpointed == ["blocks.0", "blocks.1", "blocks.2"]
    x = torch.randn(2, 5, 12)
    vit(x).square().sum().backward()
    ref(x).square().sum().backward()
    for (n, p), q in zip(vit.named_parameters(), ref.parameters()):
        assert torch.allclose(p.grad, q.grad, rtol=1e-5, atol=1e-7), n
