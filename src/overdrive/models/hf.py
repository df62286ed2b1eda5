"""Hugging Face causal LMs built from a config (no weight download): GPT-2 and Llama.

    model = build_hf_model("llama", n_layer=2, d_model=64, vocab_size=256)
    logits = model(input_ids).logits
"""

from __future__ import annotations

from torch import nn

__all__ = ["build_hf_model", "HF_FAMILIES"]

HF_FAMILIES = ("gpt2", "llama")


def build_hf_model(family: str, *, n_layer: int = 2, d_model: int = 64, n_head: int = 4, vocab_size: int = 256,
                   max_positions: int = 128, **extra) -> nn.Module:
    """A randomly initialised transformers model of `family`, sized by the arguments."""
    try:
        import transformers
    except ImportError as e:
        raise ImportError("Hugging Face models need transformers: pip install transformers accelerate (the overdrive[hf] extra)") from e
    if family == "gpt2":
        cfg = transformers.GPT2Config(n_layer=n_layer, n_embd=d_model, n_head=n_head, vocab_size=vocab_size,
                                      n_positions=max_positions, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                      **extra)
        return transformers.GPT2LMHeadModel(cfg)
    if family == "llama":
        cfg = transformers.LlamaConfig(num_hidden_layers=n_layer, hidden_size=d_model, num_attention_heads=n_head,
                                       num_key_value_heads=extra.pop("n_kv_head", n_head),
                                       intermediate_size=extra.pop("ffn", 4 * d_model), vocab_size=vocab_size,
                                       max_position_embeddings=max_positions, **extra)
        return transformers.LlamaForCausalLM(cfg)
    raise ValueError(f"unknown Hugging Face family '{family}': use one of {', '.join(HF_FAMILIES)}")
