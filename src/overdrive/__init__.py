"""Overdrive: fast, verified PyTorch Transformer training, with honest fallbacks.

    import overdrive
    acc = overdrive.accelerate(model, recipe="auto", lr=3e-4)
"""

__version__ = "0.1.0"

from overdrive.accelerate import Accelerated, accelerate  # noqa: E402
from overdrive.env import get_env  # noqa: E402
from overdrive.recipes import PRESETS, Recipe, RecipeUnavailable, ResolvedRecipe, resolve  # noqa: E402

__all__ = ["__version__", "accelerate", "Accelerated", "get_env", "Recipe", "PRESETS", "resolve", "ResolvedRecipe",
           "RecipeUnavailable"]
