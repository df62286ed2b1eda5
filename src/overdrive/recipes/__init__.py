"""Recipes: what the user asks for (`Recipe`, presets) and what runs here (`resolve`)."""

from overdrive.recipes.recipe import FIELD_CHOICES, PRESETS, Recipe, get_recipe
from overdrive.recipes.resolve import Decision, RecipeUnavailable, ResolvedRecipe, resolve

__all__ = ["Recipe", "PRESETS", "FIELD_CHOICES", "get_recipe", "resolve", "ResolvedRecipe", "Decision",
           "RecipeUnavailable"]
