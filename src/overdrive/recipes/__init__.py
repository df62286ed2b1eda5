"""Recipes: what the user asks for (`Recipe`, presets, names) and what runs here (`resolve`)."""

from overdrive.recipes.names import (ALIASES, ECOSYSTEM, KNOBS, canonical_name, names, parse_recipe_name,
                                     recipe_name)
from overdrive.recipes.names import get_recipe
from overdrive.recipes.recipe import FIELD_CHOICES, PRESETS, Recipe
from overdrive.recipes.resolve import Decision, RecipeUnavailable, ResolvedRecipe, resolve

__all__ = ["Recipe", "PRESETS", "FIELD_CHOICES", "get_recipe", "resolve", "ResolvedRecipe", "Decision",
           "RecipeUnavailable", "names", "parse_recipe_name", "recipe_name", "canonical_name", "ALIASES", "KNOBS",
           "ECOSYSTEM"]
