"""tune's results file (`overdrive.tune/1`): results.json, checked against a schema of every field the
console table and report.html read, when written and when read back (by `overdrive report`,
`overdrive emit`). A wrong type or a missing key is one line naming the field, never a traceback;
text fields are text (the page escapes them), numbers are numbers."""

from __future__ import annotations

import math

from overdrive.results.files import read_doc, write_json

__all__ = ["TUNE_SCHEMA", "TUNE_RESULT_SCHEMA", "save_tune", "load_tune"]

TUNE_SCHEMA = "overdrive.tune/1"
WHAT = "overdrive tune result"
FIX = "re-run `overdrive tune --out DIR`"

_NUM = {"type": "number"}
_NUM_OR_NULL = {"type": ["number", "null"]}
_STR = {"type": "string"}
_STR_OR_NULL = {"type": ["string", "null"]}

_LAYER = {"type": "object", "required": ["fqn", "shape", "tokens", "bf16_ms", "fp8_ms", "reason"],
          "properties": {"fqn": _STR, "shape": {"type": "string", "pattern": "^[0-9]+x[0-9]+$"},
                         "tokens": {"type": "integer", "minimum": 0}, "bf16_ms": _NUM_OR_NULL, "fp8_ms": _NUM_OR_NULL,
                         "reason": _STR, "convert": {"type": "boolean"}}}

_CANDIDATE = {
    "type": "object",
    "required": ["name", "label", "baseline", "status", "reason", "ran", "step_ms", "speedup", "speedup_ci",
                 "warmup_first_step_ms", "loss_delta_pct", "loss_delta_nats", "safe", "safety", "losses"],
    "properties": {
        "name": _STR, "label": _STR, "names": {"type": "array", "items": _STR}, "baseline": {"type": "boolean"},
        "status": _STR, "reason": _STR, "ran": _STR, "safety": _STR, "safe": {"type": ["boolean", "null"]},
        "emulated": {"type": "boolean"}, "step_ms": _NUM_OR_NULL, "speedup": _NUM_OR_NULL,
        "speedup_ci": {"oneOf": [{"type": "null"}, {"type": "array", "items": _NUM_OR_NULL, "minItems": 2,
                                                    "maxItems": 2}]},
        "warmup_first_step_ms": _NUM_OR_NULL, "loss_delta_pct": _NUM_OR_NULL, "loss_delta_nats": _NUM_OR_NULL,
        "verdict": _STR, "rounds": {"type": "integer"},
        "losses": {"type": "array", "items": _NUM},  # a NaN loss is a finding, shown as such
        "fp8_filter": {"oneOf": [{"type": "null"}, {"type": "object", "properties": {
            "layers": {"type": "array", "items": _LAYER}, "error": _STR, "summary": _STR}}]},
    },
}

TUNE_RESULT_SCHEMA = {
    "type": "object",
    "required": ["schema", "best", "summary", "candidates", "workload", "budget_s", "elapsed_s", "rounds",
                 "tolerance", "created", "baseline"],
    "properties": {
        "schema": {"const": TUNE_SCHEMA}, "best": _STR, "summary": _STR, "workload": _STR_OR_NULL,
        "budget_s": _NUM, "elapsed_s": _NUM, "rounds": {"type": "integer", "minimum": 0}, "tolerance": _STR,
        "created": _STR, "baseline": _STR, "gpu": _STR_OR_NULL, "cpu": _STR_OR_NULL, "device": _STR_OR_NULL,
        "memory_limit": _STR_OR_NULL, "cache_note": _STR, "cached_at": _STR,
        "kept": _STR, "recommended": {"type": "boolean"},
        "candidates": {"type": "array", "minItems": 1, "items": _CANDIDATE},
        "threads": {"oneOf": [{"type": "null"}, {"type": "object", "properties": {
            "threads": {"type": "integer"}, "source": _STR}}]},
        "noise": {"oneOf": [{"type": "null"}, {"type": "object", "properties": {
            "aa": {"oneOf": [{"type": "null"}, {"type": "object", "required": ["rounds", "ratio", "ci", "spread_pct"],
                                                "properties": {"rounds": {"type": "integer"}, "ratio": _NUM,
                                                               "ci": {"type": "array", "items": _NUM, "minItems": 2},
                                                               "spread_pct": _NUM}}]},
            "too_busy": {"type": "boolean"}, "load_1min": _NUM_OR_NULL,
            "cores": {"type": ["integer", "null"]}}}]},
    },
}


def _non_finite(doc: dict) -> tuple | None:
    """The first figure (not a loss) that is NaN or infinite: a tampered file, and a plot that would warn."""
    for k in ("budget_s", "elapsed_s"):
        if not math.isfinite(doc[k]):
            return (k,)
    for i, r in enumerate(doc["candidates"]):
        for k in ("step_ms", "speedup", "warmup_first_step_ms", "loss_delta_pct", "loss_delta_nats"):
            if r[k] is not None and not math.isfinite(r[k]):
                return ("candidates", i, k)
        bad = next((j for j, v in enumerate(r["speedup_ci"] or []) if v is not None and not math.isfinite(v)), None)
        if bad is not None:
            return ("candidates", i, "speedup_ci", bad)
    return None


def save_tune(doc: dict, out_dir: str) -> str:
    """results.json of a tune run (`TuneResult.to_dict()`), checked against the schema first."""
    return write_json(out_dir, doc, TUNE_RESULT_SCHEMA, what=WHAT, figures=_non_finite, sort_keys=False, indent=2)


def load_tune(path: str) -> dict:
    """A tune folder's results.json (or the file), schema-checked: ValueError (one line, naming the
    field) when it is malformed or not a tune result."""
    return read_doc(path, TUNE_RESULT_SCHEMA, what=WHAT, fix=FIX, figures=_non_finite)
