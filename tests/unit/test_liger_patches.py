"""Liger's own model patches through accelerate(), chosen per HF family, checked by what the modules now run.

Liger's kernels need a GPU, so the machine is a faked H100 with Liger working and the model stays on
this CPU: the patches (Liger's real code) are applied and inspected, never run (tests/gpu runs them).
"""

import dataclasses
import importlib

import pytest
import torch

from fakes import LIGER_OK, machine
from overdrive.accelerated import accelerate
from overdrive.env import build_report
from overdrive.models import GPT, gpt_config
from overdrive.recipes import Recipe, resolve

transformers = pytest.importorskip("transformers")
pytest.importorskip("liger_kernel.transformers.monkey_patch")
from liger_kernel.transformers.rms_norm import LigerRMSNorm  # noqa: E402
from liger_kernel.transformers.swiglu import LigerSwiGLUMLP  # noqa: E402

GPU_LIGER = build_report(machine("h100", liger=LIGER_OK))
FAMILIES = {"llama": "LlamaConfig", "mistral": "MistralConfig", "qwen2": "Qwen2Config", "qwen3": "Qwen3Config",
            "phi3": "Phi3Config", "gemma": "GemmaConfig"}


@pytest.fixture(autouse=True)
def restore_transformers():
    """Liger also rebinds names in transformers' modeling modules (for models built later): undo that here."""
    mods = [importlib.import_module(f"transformers.models.{f}.modeling_{f}") for f in FAMILIES]
    saved = [(m, dict(vars(m))) for m in mods]
    yield
    for m, d in saved:
        for k, v in d.items():
            setattr(m, k, v)


def _resolved(**kw):
    r = resolve(Recipe(precision="fp32", norm="liger", **kw), GPU_LIGER)
    assert r.norm == "liger"
    return dataclasses.replace(r, device="cpu")  # decided as on the GPU, applied on this CPU


def _hf(family):
    cfg = getattr(transformers, FAMILIES[family])(num_hidden_layers=2, hidden_size=64, intermediate_size=128,
                                                  num_attention_heads=4, num_key_value_heads=4, vocab_size=256,
                                                  head_dim=16, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    return transformers.AutoModelForCausalLM.from_config(cfg)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_liger_family_patch(family):
    model = _hf(family)
    keys = set(model.state_dict())
    acc = accelerate(model, _resolved(), build_optimizer=False)
    base = model.model
    norm = base.layers[0].input_layernorm
    assert norm.forward.__func__ is LigerRMSNorm.forward  # Liger's RMSNorm kernel on the user's module
    assert "norm" not in acc.conversions  # no second swap on top of Liger's
    if family == "gemma":
        # Gemma's x·(1+w) norm: Liger's own Gemma patch passes the offset, so zero-initialised weights keep x
        assert norm.offset == 1.0 and norm.casting_mode == "gemma"
        assert base.layers[0].mlp._get_name() == "LigerGEGLUMLP"
    else:
        assert norm.offset == 0.0
        if family != "phi3":
            assert base.layers[0].mlp.forward.__func__ is LigerSwiGLUMLP.forward
    assert set(model.state_dict()) == keys
    rep = acc.report()
    assert f"apply_liger_kernel_to_{family}(rope, rms_norm" in rep
    assert "loss stays torch cross-entropy" in rep


def test_liger_fused_linear_cross_entropy_follows_the_recipe():
    model = _hf("llama")
    acc = accelerate(model, dataclasses.replace(_resolved(), loss="fused-linear-cross-entropy"),
                     build_optimizer=False)
    assert "lce_forward" in model.__dict__["forward"].__wrapped__.__func__.__qualname__
    assert "fused_linear_cross_entropy" in acc.report()


def test_unknown_family_and_plain_models_get_norms_only_with_the_reason():
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=256))
    acc = accelerate(gpt2, _resolved(), build_optimizer=False)
    assert "Liger has no model patch for 'gpt2'" in acc.report()
    assert sum(d.converted for d in acc.conversions["norm"]) == 5  # LigerLayerNorm swaps
    acc = accelerate(GPT(gpt_config("tiny")), _resolved(), build_optimizer=False)
    assert "not a Hugging Face model" in acc.report() and "norm" in acc.conversions
    assert torch.is_tensor(next(acc.model.parameters()))
