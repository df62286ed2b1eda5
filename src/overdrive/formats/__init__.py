"""The low-precision formats: one frozen `Format` per format in `FORMATS`, and the engines' shape rules.

    >>> from overdrive.formats import FORMATS
    >>> [f.name for f in FORMATS.values()]
    ['fp8-tensorwise', 'fp8-rowwise', 'fp8-delayed', 'mxfp8', 'nvfp4']

Everything that depends on a format (resolve, convert, plan, doctor, labels, quality, reports) reads
its record here; a new variant is one entry.
"""

from overdrive.formats.registry import (EMULATED, CastBytes, FORMATS, HIGH_PRECISION_TOLERANCE, TE, TORCHAO, Engine, Format,
                                        dims_multiple, engine_rules, find_format, format_of, get_format, kinds,
                                        loss_tolerance, planned_format, planned_presets, tokens_multiple,
                                        version_tuple)
from overdrive.formats.shape_rules import SCALED_MM, SHAPE_RULES, EngineRules, Rule

__all__ = ["CastBytes", "Format", "Engine", "FORMATS", "find_format", "get_format", "format_of", "kinds", "loss_tolerance",
           "HIGH_PRECISION_TOLERANCE", "version_tuple", "engine_rules", "tokens_multiple", "dims_multiple",
           "SHAPE_RULES", "EngineRules", "Rule", "SCALED_MM", "TE", "TORCHAO", "EMULATED", "planned_format",
           "planned_presets"]
