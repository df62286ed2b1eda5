"""Models: the reference GPT (named sizes) and builders for Hugging Face models from configs."""

from overdrive.models.gpt import GPT, GPT_SIZES, GPTConfig, gpt_config

__all__ = ["GPT", "GPTConfig", "GPT_SIZES", "gpt_config", "build_hf_model"]


def build_hf_model(*args, **kwargs):
    """See `overdrive.models.hf.build_hf_model` (imports transformers lazily)."""
    from overdrive.models.hf import build_hf_model as _build

    return _build(*args, **kwargs)
