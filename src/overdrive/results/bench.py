"""The bench's results file (`overdrive.bench/1`): results.json (versioned, diffable, checked against
results.schema.json on write and on read) and results.csv (one row per configuration and model)."""

from __future__ import annotations

from overdrive.results.files import json_schema, non_finite, read_doc, write_csv, write_json

__all__ = ["BENCH_SCHEMA", "CSV_FIELDS", "csv_rows", "save_bench", "load_bench", "throughput", "bench_figures",
           "WHAT", "FIX"]

BENCH_SCHEMA = "overdrive.bench/1"
WHAT = "overdrive bench result"
FIX = ("pass a folder written by `overdrive bench --out DIR`, `tune --out DIR` or `plan --out DIR` (or re-run "
       "the command)")

CSV_FIELDS = ["config", "label", "model", "status", "precision", "emulated", "step_ms_median", "step_ms_p10",
              "step_ms_p90", "tokens_per_s", "examples_per_s", "auc", "speedup", "speedup_lo", "speedup_hi", "tflops",
              "mfu_bf16_peak", "mfu_fp8_peak", "mfu_fp4_peak", "peak_mb", "memory_saved_pct", "final_loss",
              "loss_delta_pct", "safe", "reason"]

# The figures the report prints or plots: NaN or inf there (a hand edit; the writer never puts one)
# would print "nanx" or crash the plots. Losses and AUC may be NaN (a diverged run) and print as such.
_FIGURES = {"median", "p10", "p90", "mean", "speedup", "speedup_ci", "peak_mb", "memory_saved_pct", "tokens_per_s",
            "examples_per_s", "tflops", "mfu_bf16_peak", "mfu_fp8_peak", "mfu_fp4_peak", "loss_delta_pct", "rate",
            "p50", "p99", "slo_ms", "slo_throughput"}
_NOT_FIGURES = {"raw", "final", "env", "schedule", "versions"}


def bench_figures(doc) -> tuple | None:
    """The path of the first NaN/inf figure of a bench or latency result, or None."""
    return non_finite(doc, _FIGURES, _NOT_FIGURES)


def throughput(m: dict) -> tuple[float | None, str]:
    """A model row's rate and its unit (examples/s for a click model, tokens/s for a GPT)."""
    if m.get("examples_per_s") is not None:
        return m["examples_per_s"], "examples/s"
    return m.get("tokens_per_s"), "tokens/s"


def csv_rows(results: dict) -> list[dict]:
    rows = []
    for c in results["configs"]:
        for role, m in c["models"].items():
            ci = m.get("speedup_ci") or [None, None]
            rows.append({
                "config": c["name"], "label": c.get("label", c["name"]), "model": role, "status": c["status"],
                "precision": c["precision"], "emulated": c["emulated"], "step_ms_median": m["step_ms"]["median"],
                "step_ms_p10": m["step_ms"]["p10"], "step_ms_p90": m["step_ms"]["p90"],
                "tokens_per_s": m["tokens_per_s"], "examples_per_s": m.get("examples_per_s"), "auc": m.get("auc"),
                "speedup": m["speedup"], "speedup_lo": ci[0], "speedup_hi": ci[1], "tflops": m["tflops"],
                "mfu_bf16_peak": m["mfu_bf16_peak"], "mfu_fp8_peak": m["mfu_fp8_peak"],
                "mfu_fp4_peak": m.get("mfu_fp4_peak"), "peak_mb": c["peak_mb"],
                "memory_saved_pct": c["memory_saved_pct"], "final_loss": m["final_loss"],
                "loss_delta_pct": m["loss_delta_pct"], "safe": c["safe"],
                "reason": c["reason"] or c.get("unsafe_reason") or c.get("not_assessed_reason") or ""})
    return rows


def save_bench(results: dict, out_dir: str) -> None:
    """results.json and results.csv, checked against the schema first (a writer's bug fails here, not in
    the report that reads the file back)."""
    if results.get("schema") != BENCH_SCHEMA:
        raise ValueError(f"not a bench result (schema {results.get('schema')!r}, expected {BENCH_SCHEMA})")
    write_json(out_dir, results, json_schema(), what=WHAT, figures=bench_figures)
    write_csv(out_dir, CSV_FIELDS, csv_rows(results))


def load_bench(path: str) -> dict:
    """A bench results.json (or its folder), validated: missing keys, wrong types, a NaN figure or
    nesting past Python's recursion limit are one line naming the field."""
    doc = read_doc(path, json_schema(), what=WHAT, fix=FIX, figures=bench_figures)
    if doc.get("schema") != BENCH_SCHEMA:
        raise ValueError(f"{path} is not a bench result (schema {doc.get('schema')!r}): {FIX}")
    return doc
