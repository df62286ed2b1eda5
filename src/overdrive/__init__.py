"""Overdrive: fast, verified PyTorch Transformer training, with honest fallbacks."""

__version__ = "0.1.0"

__all__ = ["__version__"]
