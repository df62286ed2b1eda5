"""The results file: versioned, diffable JSON (plus CSV), written atomically."""

from __future__ import annotations

import csv
import io
import json
import math
import os

from overdrive.bench.provenance import git_commit, versions
from overdrive.io import write_atomic

__all__ = ["RESULTS_SCHEMA", "save_results", "load_results", "versions", "git_commit", "csv_rows",
           "suite_title", "throughput"]

RESULTS_SCHEMA = "overdrive.bench/1"


def suite_title(results: dict) -> str:
    """One line saying what was trained, for tables and reports."""
    s = results["suite"]
    if s.get("task", "gpt") == "gpt":
        return (f"suite {s['name']}: teacher {s['teacher']}, student {s['student']}, batch {s['batch']} x "
                f"seq {s['seq']}")
    o = s.get("options", {})
    return (f"suite {s['name']}: DLRM click model, 26 tables ({o.get('total_rows', '?'):,} rows, dim "
            f"{o.get('dim', '?')}), batch {s['batch']}, {o.get('train_examples', '?'):,} training examples")


def throughput(m: dict) -> tuple[float | None, str]:
    if m.get("examples_per_s") is not None:
        return m["examples_per_s"], "examples/s"
    return m.get("tokens_per_s"), "tokens/s"


CSV_FIELDS = ["config", "label", "model", "status", "precision", "emulated", "step_ms_median", "step_ms_p10", "step_ms_p90",
              "tokens_per_s", "examples_per_s", "auc", "speedup", "speedup_lo", "speedup_hi", "tflops", "mfu_bf16_peak", "mfu_fp8_peak",
              "mfu_fp4_peak", "peak_mb", "memory_saved_pct", "final_loss", "loss_delta_pct", "safe", "reason"]


def csv_rows(results: dict) -> list[dict]:
    rows = []
    for c in results["configs"]:
        for role, m in c["models"].items():
            ci = m.get("speedup_ci") or [None, None]
            rows.append({
                "config": c["name"], "label": c.get("label", c["name"]), "model": role, "status": c["status"], "precision": c["precision"],
                "emulated": c["emulated"], "step_ms_median": m["step_ms"]["median"], "step_ms_p10": m["step_ms"]["p10"],
                "step_ms_p90": m["step_ms"]["p90"], "tokens_per_s": m["tokens_per_s"],
                "examples_per_s": m.get("examples_per_s"), "auc": m.get("auc"), "speedup": m["speedup"],
                "speedup_lo": ci[0], "speedup_hi": ci[1], "tflops": m["tflops"], "mfu_bf16_peak": m["mfu_bf16_peak"],
                "mfu_fp8_peak": m["mfu_fp8_peak"], "mfu_fp4_peak": m.get("mfu_fp4_peak"), "peak_mb": c["peak_mb"], "memory_saved_pct": c["memory_saved_pct"],
                "final_loss": m["final_loss"], "loss_delta_pct": m["loss_delta_pct"], "safe": c["safe"],
                "reason": c["reason"] or c.get("unsafe_reason") or c.get("not_assessed_reason") or ""})
    return rows


def save_results(results: dict, out_dir: str) -> None:
    os.makedirs(out_dir, exist_ok=True)
    write_atomic(os.path.join(out_dir, "results.json"), json.dumps(results, indent=1, sort_keys=True) + "\n")
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=CSV_FIELDS)
    w.writeheader()
    w.writerows(csv_rows(results))
    write_atomic(os.path.join(out_dir, "results.csv"), buf.getvalue())


# The figures the report prints or plots: NaN or inf there (a hand edit; the writer never puts one)
# would print "nanx" or crash the plots. Losses and AUC may be NaN (a diverged run) and print as such.
_FIGURES = {"median", "p10", "p90", "mean", "speedup", "speedup_ci", "peak_mb", "memory_saved_pct", "tokens_per_s",
            "examples_per_s", "tflops", "mfu_bf16_peak", "mfu_fp8_peak", "mfu_fp4_peak", "loss_delta_pct", "rate", "p50", "p99",
            "slo_ms", "slo_throughput"}
_NOT_FIGURES = {"raw", "final", "env", "schedule", "versions"}


def _non_finite(doc, at: tuple = ()) -> tuple | None:
    """The path of the first NaN/inf figure in `doc`, or None."""
    if isinstance(doc, dict):
        for k, v in doc.items():
            if k in _NOT_FIGURES:
                continue
            if k in _FIGURES and not isinstance(v, (dict, list)):
                if isinstance(v, float) and not math.isfinite(v):
                    return at + (k,)
                continue
            if k in _FIGURES and isinstance(v, list):
                bad = next((i for i, x in enumerate(v) if isinstance(x, float) and not math.isfinite(x)), None)
                if bad is not None:
                    return at + (k, bad)
                continue
            found = _non_finite(v, at + (k,))
            if found:
                return found
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            found = _non_finite(v, at + (i,))
            if found:
                return found
    return None


def load_results(path: str) -> dict:
    """results.json from a file or a results folder, validated against results.schema.json: a file
    with the right tag but missing keys, wrong types, a NaN figure, or nested past Python's recursion
    limit, is a one-line error naming the field."""
    from importlib import resources

    from overdrive.io import read_json

    p = os.path.join(path, "results.json") if os.path.isdir(path) else path
    schema = json.loads(resources.files("overdrive.bench").joinpath("results.schema.json").read_text())
    fix = ("pass a folder written by `overdrive bench --out DIR`, `tune --out DIR` or `plan --out DIR` (or re-run "
           "the command)")
    doc = read_json(p, schema=schema, what="overdrive bench result", fix=fix)
    bad = _non_finite(doc)
    if bad:
        o = doc
        for k in bad:
            o = o[k]
        raise ValueError(f"{p} is not a valid overdrive bench result: at {'/'.join(map(str, bad))}: {o} is not a "
                         f"finite number: {fix}")
    return doc
