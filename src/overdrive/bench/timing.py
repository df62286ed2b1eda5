"""Moved to `overdrive.measure.rounds` (the measurement core); kept so old imports keep working."""

from overdrive.measure.rounds import Clock, interleaved_rounds, rotated, speedup_ci, summarize, time_fn, verdict

__all__ = ["Clock", "time_fn", "rotated", "interleaved_rounds", "speedup_ci", "summarize", "verdict"]
