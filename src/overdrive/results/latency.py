"""The inference bench's results file (`overdrive.latency/1`): results.json (checked against
results.schema.json on write and on read) and results.csv (one row per table, mode and batch, and
one per serving engine's best setting)."""

from __future__ import annotations

from overdrive.results.bench import FIX, WHAT, bench_figures
from overdrive.results.files import json_schema, read_doc, write_csv, write_json

__all__ = ["LATENCY_SCHEMA", "LATENCY_CSV_FIELDS", "latency_rows", "save_latency", "load_latency"]

LATENCY_SCHEMA = "overdrive.latency/1"

LATENCY_CSV_FIELDS = ["table", "model", "mode", "batch", "status", "p50_ms", "p95_ms", "p99_ms", "n", "throughput",
                      "unit", "slo"]


def latency_rows(r: dict) -> list[dict]:
    """Every fixed-batch cell (table x mode x batch), then each serving engine's highest rate under the SLO."""
    rows = []
    for key, w in (r.get("workloads") or {}).items():
        for mode, md in w["modes"].items():
            if md["status"] != "ok":
                rows.append({"table": key, "model": w["model"], "mode": mode, "status": md["status"],
                             "unit": w["unit"]})
                continue
            for b, st in md["batches"].items():
                rows.append({"table": key, "model": w["model"], "mode": mode, "batch": int(b),
                             "status": "ok" if "p50" in st else st.get("status"), "p50_ms": st.get("p50"),
                             "p95_ms": st.get("p95"), "p99_ms": st.get("p99"), "n": st.get("n"),
                             "throughput": st.get("throughput"), "unit": w["unit"], "slo": st.get("slo")})
    sv = r.get("serving") or {}
    for name, e in (sv.get("engines") or {}).items():
        best = (e or {}).get("best") or {}
        rows.append({"table": "serving", "model": e.get("label", name) if isinstance(e, dict) else name, "mode": name,
                     "batch": (best.get("config") or {}).get("max_batch_size"), "status": (e or {}).get("status"),
                     "throughput": best.get("rate"), "unit": "req/s", "slo": "meets" if best else None})
    return rows


def save_latency(r: dict, out_dir: str) -> None:
    if r.get("schema") != LATENCY_SCHEMA:
        raise ValueError(f"not a latency result (schema {r.get('schema')!r}, expected {LATENCY_SCHEMA})")
    write_json(out_dir, r, json_schema(), what=WHAT, figures=bench_figures, sort_keys=False)
    write_csv(out_dir, LATENCY_CSV_FIELDS, latency_rows(r))


def load_latency(path: str) -> dict:
    doc = read_doc(path, json_schema(), what=WHAT, fix=FIX, figures=bench_figures)
    if doc.get("schema") != LATENCY_SCHEMA:
        raise ValueError(f"{path} is not an inference bench result (schema {doc.get('schema')!r}): {FIX}")
    return doc
