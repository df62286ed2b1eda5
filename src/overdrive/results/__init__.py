"""Results files, one module per kind, each with one writer and one reader checked against the same
schema: `bench` (`overdrive.bench/1`), `latency` (`overdrive.latency/1`, the inference bench), `tune`
(`overdrive.tune/1`). Readers return the documents as written; `records` gives the report typed views.
"""

from __future__ import annotations

from overdrive.results.bench import BENCH_SCHEMA, load_bench, save_bench
from overdrive.results.files import json_schema, read_doc, results_path
from overdrive.results.latency import LATENCY_SCHEMA, load_latency, save_latency
from overdrive.results.tune import TUNE_SCHEMA, load_tune, save_tune

__all__ = ["BENCH_SCHEMA", "LATENCY_SCHEMA", "TUNE_SCHEMA", "save_bench", "load_bench", "save_latency",
           "load_latency", "save_tune", "load_tune", "kind_of", "load_results", "save_results"]

_KINDS = {BENCH_SCHEMA: "bench", LATENCY_SCHEMA: "latency", TUNE_SCHEMA: "tune"}


def kind_of(path: str) -> str | None:
    """"bench", "latency" or "tune" by the file's schema tag; None when it is unreadable or untagged (the
    kind's reader then says what is wrong, in its own words)."""
    from overdrive.results.files import read_json_bounded

    try:
        doc = read_json_bounded(results_path(path), what="results file", tail="")
    except (OSError, ValueError):  # a device, a huge or broken file: never read past the bound
        return None
    return _KINDS.get(doc.get("schema")) if isinstance(doc, dict) else None


def load_results(path: str) -> dict:
    """A bench or inference bench results.json (or its folder), validated against results.schema.json."""
    from overdrive.results.bench import FIX, WHAT, bench_figures

    return read_doc(path, json_schema(), what=WHAT, fix=FIX, figures=bench_figures)


def save_results(doc: dict, out_dir: str) -> None:
    """The writer of the document's kind (by its schema tag): results.json and results.csv."""
    if doc.get("schema") == LATENCY_SCHEMA:
        save_latency(doc, out_dir)
    else:
        save_bench(doc, out_dir)
