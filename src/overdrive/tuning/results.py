"""A tune folder's results.json read back (by `overdrive report`): untrusted, so checked against a
schema of every field the console table and report.html read before anything renders it. A wrong
type or a missing key is one line naming the field, never a traceback; text fields are text (the
page escapes them), numbers are numbers."""

from __future__ import annotations

import math
import os

__all__ = ["TUNE_RESULT_SCHEMA", "load_tune_result"]

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
        "schema": {"const": "overdrive.tune/1"}, "best": _STR, "summary": _STR, "workload": _STR_OR_NULL,
        "budget_s": _NUM, "elapsed_s": _NUM, "rounds": {"type": "integer", "minimum": 0}, "tolerance": _STR,
        "created": _STR, "baseline": _STR, "gpu": _STR_OR_NULL, "cpu": _STR_OR_NULL, "device": _STR_OR_NULL,
        "memory_limit": _STR_OR_NULL, "cache_note": _STR, "cached_at": _STR,
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


def _non_finite(doc: dict) -> str | None:
    """The first figure (not a loss) that is NaN or infinite: a tampered file, and a plot that would warn."""
    for k in ("budget_s", "elapsed_s"):
        if not math.isfinite(doc[k]):
            return k
    for i, r in enumerate(doc["candidates"]):
        for k in ("step_ms", "speedup", "warmup_first_step_ms", "loss_delta_pct", "loss_delta_nats"):
            if r[k] is not None and not math.isfinite(r[k]):
                return f"candidates/{i}/{k}"
        if any(v is not None and not math.isfinite(v) for v in r["speedup_ci"] or []):
            return f"candidates/{i}/speedup_ci"
    return None


def load_tune_result(path: str) -> dict | None:
    """A tune folder's results.json (or the file), schema-checked; None when it is not a tune result
    (no `overdrive.tune/1` tag); ValueError (one line, naming the field) when it is one but malformed."""
    from overdrive.io import read_json

    p = os.path.join(path, "results.json") if os.path.isdir(path) else path
    try:
        doc = read_json(p)
    except (FileNotFoundError, ValueError):
        return None  # load_results says what is wrong, in its own words
    if not (isinstance(doc, dict) and doc.get("schema") == "overdrive.tune/1"):
        return None
    fix = "re-run `overdrive tune --out DIR`"
    doc = read_json(p, schema=TUNE_RESULT_SCHEMA, what="overdrive tune result", fix=fix)
    bad = _non_finite(doc)
    if bad:
        raise ValueError(f"{p} is not a valid overdrive tune result: at {bad}: not a finite number: {fix}")
    return doc
