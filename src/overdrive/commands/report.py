"""`overdrive report` — re-render a result folder, or compare two; the rendering is in overdrive.report."""

from __future__ import annotations

import argparse
import os

from overdrive.errors import UserError
from overdrive.io import check_writable

__all__ = ["register"]


def _folder_of(path: str) -> str:
    return path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))


def _writable(folder: str, flag: str, what: str) -> None:
    """Refuse, in one line, a folder the page and plots cannot be written to (read-only, not ours)."""
    check_writable(folder, flag=flag, fix=f"{what} was printed above; pass --out DIR to write the page and plots "
                                          "to a folder you can write")


def _written(fn):
    """A write that fails half-way (disk full, a folder vanishing) is one line too, not a traceback."""
    try:
        return fn()
    except OSError as e:
        raise UserError(f"could not write the report ({e.strerror or type(e).__name__}: "
                        f"{e.filename or ''}): free space or pass --out DIR") from None


def _cmd_report(args: argparse.Namespace) -> int:
    from overdrive.report.console import wide_console

    if len(args.dirs) > 2:
        raise UserError(f"overdrive report takes one folder (re-render) or two (compare), got {len(args.dirs)}")
    console = wide_console()
    if len(args.dirs) == 2:
        page = _compare(args, [_loaded(d) for d in args.dirs], console)
        _screenshots(args, page, console)
        return 0
    path = args.dirs[0]
    plan_doc = _plan_result(path)
    if plan_doc is not None:
        page = _plan(args, plan_doc, console)
    elif _kind(path) == "tune":
        page = _tune(path, console)
    else:
        page = _one(args, _loaded(path), console)
    console.print(f"re-rendered {escape(page)}")
    _screenshots(args, page, console)
    return 0


def escape(text: str) -> str:
    from rich.markup import escape as rich_escape  # rich loads when a report is rendered, not when parsing

    return rich_escape(text)


def _kind(path: str) -> str | None:
    from overdrive.results import kind_of

    return kind_of(path)


def _loaded(path: str) -> dict:
    """A bench or inference bench result, through the results module's one reader."""
    from overdrive.results import load_results

    try:
        return load_results(path)
    except (FileNotFoundError, ValueError) as e:
        raise UserError(str(e)) from None
    except OSError as e:  # a results.json we may not read
        raise UserError(f"cannot read {e.filename or path}: {e.strerror or type(e).__name__}") from None


def _plan(args: argparse.Namespace, plan_doc: dict, console) -> str:
    from overdrive.report.plan_html import write_plan_html
    from overdrive.report.plan_view import render_plan, write_breakdown_png

    render_plan(plan_doc, console)
    out = args.out or _folder_of(args.dirs[0])
    _writable(out, "--out" if args.out else "report DIR", "the plan")
    png = os.path.join(out, "memory.png")
    return _written(lambda: (write_breakdown_png(plan_doc, png), write_plan_html(plan_doc, out, png=png))[1])


def _tune(path: str, console) -> str:
    from overdrive.report.tune_view import render_tune, write_report
    from overdrive.results import load_tune
    from overdrive.results.records import TuneRecord

    try:
        rec = TuneRecord.of(load_tune(path))
    except (FileNotFoundError, ValueError) as e:
        raise UserError(str(e)) from None
    render_tune(rec, console)
    return write_report(rec, _folder_of(path))


def _one(args: argparse.Namespace, doc: dict, console) -> str:
    """One bench or inference bench folder: the console table, then the page (and plots) re-rendered."""
    from overdrive.results import LATENCY_SCHEMA

    out = args.out or _folder_of(args.dirs[0])
    flag = "--out" if args.out else "report DIR"
    if doc["schema"] == LATENCY_SCHEMA:
        from overdrive.report.latency_view import render_latency, write_latency_report

        render_latency(doc, console)
        _writable(out, flag, "the table")
        return _written(lambda: write_latency_report(doc, out))[-1]
    from overdrive.report.html import write_html
    from overdrive.report.plots import write_plots
    from overdrive.report.tables import render_bench

    render_bench(doc, console)
    _writable(out, flag, "the table")
    return _written(lambda: write_html(doc, out, write_plots(doc, out)))


def _compare(args: argparse.Namespace, loaded: list[dict], console) -> str | None:
    from overdrive.report.compare import differences
    from overdrive.report.tables import render_compare
    from overdrive.results import LATENCY_SCHEMA

    if any(d["schema"] == LATENCY_SCHEMA for d in loaded):
        raise UserError("comparing inference results (with each other or with a bench result) is not supported "
                        "yet: pass one folder")
    diff = differences(loaded[0], loaded[1])
    if diff and not args.allow_different:
        raise UserError(f"{args.dirs[0]} and {args.dirs[1]} are not the same benchmark ({'; '.join(diff)}): "
                        "compare two runs of one suite (re-run one with --suite), or pass --allow-different to "
                        "see their rows side by side without a verdict")
    render_compare(loaded[0], loaded[1], console)
    if not args.out:
        return None
    from overdrive.report.compare import write_compare_html

    _writable(args.out, "--out", "the comparison")
    page = _written(lambda: write_compare_html(loaded[0], loaded[1], args.out, names=tuple(args.dirs)))
    console.print(f"wrote {escape(page)}")
    return page


def _plan_result(path: str) -> dict | None:
    """A plan folder's plan.json (what `overdrive plan --out DIR` writes), or None when there is none."""
    from overdrive.io import read_json

    p = os.path.join(path, "plan.json") if os.path.isdir(path) else path
    if os.path.basename(p) != "plan.json" or not os.path.isfile(p):
        return None
    if os.path.isdir(path) and os.path.exists(os.path.join(path, "results.json")):
        return None  # a bench or tune folder that also holds a plan: its results come first
    try:
        doc = read_json(p, what="plan result")
    except ValueError as e:
        raise UserError(str(e)) from None
    if not (isinstance(doc, dict) and isinstance(doc.get("candidates"), list) and "model" in doc):
        raise UserError(f"{p} is not an overdrive plan result (no candidates/model): re-run `overdrive plan --out DIR`")
    return doc


def _screenshots(args: argparse.Namespace, page: str | None, console) -> None:
    """--screenshot: full-page PNGs of the page just written (a headless Chromium must be here)."""
    if not args.screenshot:
        return
    from rich.markup import escape

    from overdrive.report.browser import BrowserUnavailable, screenshot_report

    if page is None:
        raise UserError("--screenshot with two folders needs --out DIR for the comparison page")
    try:
        shots = screenshot_report(page)
    except BrowserUnavailable as e:
        raise UserError(f"--screenshot: {e}; {page} was written") from None
    console.print("screenshots: " + escape(", ".join(shots)))


def register(sub) -> None:
    r = sub.add_parser("report", help="re-render a result folder (bench, inference bench, tune, plan), or compare two "
                                      "bench folders",
                       description="overdrive report DIR re-renders the table, plots and report.html from "
                                   "DIR/results.json (DIR/plan.json for a plan); overdrive report DIR_A DIR_B compares "
                                   "two bench runs.")
    r.add_argument("dirs", nargs="+", metavar="DIR", help="one or two result folders (or results.json files)")
    r.add_argument("--out", help="with two folders: also write the comparison to OUT/compare.html; with one: write "
                   "the re-rendered page and plots to OUT instead of DIR (e.g. when DIR is read-only)")
    r.add_argument("--allow-different", action="store_true", help="with two folders of different benchmarks "
                   "(suite, models, batch, sequence): show the rows anyway, without a verdict")
    r.add_argument("--screenshot", action="store_true", help="also save full-page PNGs of the page at 1280 and 390 "
                   "px wide beside it (needs a headless Chromium: apt-get install chromium; pip install "
                   "playwright, the overdrive[browser] extra)")
    r.set_defaults(func=_cmd_report)
