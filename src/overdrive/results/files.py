"""Reading and writing a results file, for every kind: one reader (a regular file of bounded size,
text JSON, a schema, finite figures) and one writer (the same schema checked before anything is
written, then atomic writes). A results file is untrusted when read back: every way it can be wrong
is one line naming the field, never a traceback."""

from __future__ import annotations

import csv
import io
import json
import math
import os

from overdrive.io import check_schema, load_json_bounded, write_atomic

__all__ = ["MAX_RESULTS_BYTES", "results_path", "read_doc", "check_doc", "write_json", "write_csv", "non_finite",
           "json_schema", "read_json_bounded"]

MAX_RESULTS_BYTES = 256 << 20
"""The largest results.json read back (a bench's raw timings are a few MB; a device or a sparse
file of gigabytes is no results file)."""


def results_path(path: str) -> str:
    """results.json in a results folder, or the file itself."""
    return os.path.join(path, "results.json") if os.path.isdir(path) else path


def read_json_bounded(p: str, *, what: str, tail: str):
    """JSON from a regular file of at most MAX_RESULTS_BYTES (`io.load_json_bounded`, the one bounded reader)."""
    return load_json_bounded(p, what=f"an {what}", tail=tail, limit=MAX_RESULTS_BYTES)


def check_doc(doc, schema: dict, *, where: str, what: str, tail: str = "", figures=None) -> None:
    """ValueError (one line: where, the field, what is wrong) unless `doc` matches `schema` and
    `figures(doc)` (the path of the first non-finite figure, or None) finds none."""
    check_schema(doc, schema, where=where, what=what, a_what=f"an {what}", tail=tail)
    bad = figures(doc) if figures else None
    if bad:
        o = doc
        for k in bad:
            o = o[k]
        raise ValueError(f"{where} is not a valid {what}: at {'/'.join(map(str, bad))}: {o} is not a finite "
                         f"number{tail}")


def read_doc(path: str, schema: dict, *, what: str, fix: str, figures=None) -> dict:
    """The one reader: results.json (or its folder) as a dict matching `schema`, its figures finite."""
    p = results_path(path)
    tail = f": {fix}" if fix else ""
    doc = read_json_bounded(p, what=what, tail=tail)
    check_doc(doc, schema, where=p, what=what, tail=tail, figures=figures)
    return doc


def write_json(out_dir: str, doc: dict, schema: dict, *, what: str, figures=None, sort_keys: bool = True,
               indent: int = 1) -> str:
    """results.json: the text that will be written is read back and checked against the schema first,
    so a writer's bug fails here, in one line, not in the report that reads the file later."""
    text = json.dumps(doc, indent=indent, sort_keys=sort_keys) + "\n"
    check_doc(json.loads(text), schema, where=f"the {what} about to be written", what=what, figures=figures)
    os.makedirs(out_dir, exist_ok=True)
    p = os.path.join(out_dir, "results.json")
    write_atomic(p, text)
    return p


def write_csv(out_dir: str, fields: list[str], rows: list[dict], *, name: str = "results.csv") -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=fields)
    w.writeheader()
    w.writerows(rows)
    p = os.path.join(out_dir, name)
    write_atomic(p, buf.getvalue())
    return p


def non_finite(doc, figures: set[str], skip: set[str], at: tuple = ()) -> tuple | None:
    """The path of the first NaN/inf among the keys named in `figures` (numbers or lists of numbers),
    not looking inside the keys in `skip`; None when every one is finite."""
    if isinstance(doc, dict):
        for k, v in doc.items():
            if k in skip:
                continue
            if k in figures and not isinstance(v, dict):
                vs = v if isinstance(v, list) else [v]
                bad = next((i for i, x in enumerate(vs) if isinstance(x, float) and not math.isfinite(x)), None)
                if bad is not None:
                    return at + ((k, bad) if isinstance(v, list) else (k,))
                continue
            found = non_finite(v, figures, skip, at + (k,))
            if found:
                return found
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            found = non_finite(v, figures, skip, at + (i,))
            if found:
                return found
    return None


def json_schema() -> dict:
    """results.schema.json: the bench and latency kinds (tune's schema is `results.tune.TUNE_RESULT_SCHEMA`)."""
    from importlib import resources

    return json.loads(resources.files("overdrive.results").joinpath("results.schema.json").read_text())
