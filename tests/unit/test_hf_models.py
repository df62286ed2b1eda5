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
    assert "transformers Conv1D, not an nn.Linear" in rep
    acc = overdrive.accelerate(llama, "fp8", env=CPU, build_optimizer=False)
    decs = {d.fqn: d for d in acc.conversions["fp8"]}
    assert decs["model.layers.0.mlp.gate_proj"].converted and not decs["lm_head"].converted
