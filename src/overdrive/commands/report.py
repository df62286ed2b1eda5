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
    from rich.markup import escape

    from overdrive.bench import load_results
    from overdrive.report.console import wide_console
    from overdrive.report.tables import render_bench, render_compare

    if len(args.dirs) > 2:
        raise UserError(f"overdrive report takes one folder (re-render) or two (compare), got {len(args.dirs)}")
    console = wide_console()
    plan_doc = _plan_result(args.dirs[0]) if len(args.dirs) == 1 else None
    if plan_doc is not None:
        from overdrive.report.plan_html import write_plan_html
        from overdrive.report.plan_view import render_plan, write_breakdown_png

        render_plan(plan_doc, console)
        out = args.out or _folder_of(args.dirs[0])
        _writable(out, "--out" if args.out else "report DIR", "the plan")
        png = os.path.join(out, "memory.png")
        page = _written(lambda: (write_breakdown_png(plan_doc, png), write_plan_html(plan_doc, out, png=png))[1])
        console.print(f"re-rendered {escape(page)}")
        _screenshots(args, page, console)
        return 0
    tune_doc = _tune_result(args.dirs[0]) if len(args.dirs) == 1 else None
    if tune_doc is not None:
        from overdrive.report.tune_view import render_tune, write_report

        render_tune(tune_doc, console)
        page = write_report(tune_doc, _folder_of(args.dirs[0]))
        console.print(f"re-rendered {page}")
        _screenshots(args, page, console)
        return 0
    try:
        loaded = [load_results(d) for d in args.dirs]
    except (FileNotFoundError, ValueError) as e:
        raise UserError(str(e)) from None
    except OSError as e:  # a results.json we may not read
        raise UserError(f"cannot read {e.filename or args.dirs}: {e.strerror or type(e).__name__}") from None
    out = args.out or (_folder_of(args.dirs[0]) if len(loaded) == 1 else None)
    flag = "--out" if args.out else "report DIR"
    if any(d["schema"] == "overdrive.latency/1" for d in loaded):
        from overdrive.report.latency_view import render_latency, write_latency_report

        if len(loaded) != 1:
            raise UserError("comparing inference results (with each other or with a bench result) is not supported "
                            "yet: pass one folder")
        render_latency(loaded[0], console)
        _writable(out, flag, "the table")
        page = _written(lambda: write_latency_report(loaded[0], out))[-1]
        console.print(f"re-rendered {escape(page)}")
        _screenshots(args, page, console)
        return 0
    if len(loaded) == 1:
        from overdrive.report.html import write_html
        from overdrive.report.plots import write_plots

        render_bench(loaded[0], console)
        _writable(out, flag, "the table")
        page = _written(lambda: write_html(loaded[0], out, write_plots(loaded[0], out)))
        console.print(f"re-rendered {escape(page)}")
    else:
        from overdrive.report.compare import differences

        diff = differences(loaded[0], loaded[1])
        if diff and not args.allow_different:
            raise UserError(f"{args.dirs[0]} and {args.dirs[1]} are not the same benchmark ({'; '.join(diff)}): "
                            "compare two runs of one suite (re-run one with --suite), or pass --allow-different to "
                            "see their rows side by side without a verdict")
        render_compare(loaded[0], loaded[1], console)
        page = None
        if args.out:
            from overdrive.report.compare import write_compare_html

            _writable(args.out, "--out", "the comparison")
            page = _written(lambda: write_compare_html(loaded[0], loaded[1], args.out, names=tuple(args.dirs)))
            console.print(f"wrote {escape(page)}")
    _screenshots(args, page, console)
    return 0


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


def _tune_result(path: str) -> dict | None:
    """A tune folder's results.json, schema-checked (`tuning.results`); None when the file is not a tune result."""
    from overdrive.tuning.results import load_tune_result

    try:
        return load_tune_result(path)
    except ValueError as e:
        raise UserError(str(e)) from None


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
