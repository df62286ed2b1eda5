"""Moved to `overdrive.measure.stats` (the measurement core); kept so old imports keep working."""

from overdrive.measure.stats import speedup_ci, summarize

__all__ = ["summarize", "speedup_ci"]
