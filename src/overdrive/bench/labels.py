"""Moved to `overdrive.recipes.labels` (the labels of what ran belong with the recipes); kept so old
imports keep working."""

from overdrive.recipes.labels import effective_key, low_precision_format, ran_label, what_runs

__all__ = ["ran_label", "what_runs", "effective_key", "low_precision_format"]
