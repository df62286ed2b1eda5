"""Models: the reference GPT (named sizes). Hugging Face builders live in `overdrive.models.hf`
(it imports transformers)."""

from overdrive.models.gpt import GPT, GPT_SIZES, GPTConfig, gpt_config

__all__ = ["GPT", "GPTConfig", "GPT_SIZES", "gpt_config"]
