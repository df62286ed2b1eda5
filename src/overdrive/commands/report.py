"""`overdrive report` — re-render a result folder, or compare two; the rendering is in overdrive.report."""

from __future__ import annotations

import argparse
import os

from overdrive.errors import UserError

__all__ = ["register"]


def _folder_of(path: str) -> str:
    return path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))


def _cmd_report(args: argparse.Namespace) -> int:
    from overdrive.bench import load_results
    from overdrive.report.console import wide_console
    from overdrive.report.tables import render_bench, render_compare

    if len(args.dirs) > 2:
        raise UserError(f"overdrive report takes one folder (re-render) or two (compare), got {len(args.dirs)}")
    console = wide_console()
    try:
        loaded = [load_results(d) for d in args.dirs]
    except (FileNotFoundError, ValueError) as e:
        raise UserError(str(e)) from None
    if any(d["schema"] == "overdrive.latency/1" for d in loaded):
        from overdrive.report.latency_view import render_latency, write_latency_report

        if len(loaded) != 1:
            raise UserError("comparing two inference results is not supported yet: pass one folder")
        render_latency(loaded[0], console)
        page = write_latency_report(loaded[0], _folder_of(args.dirs[0]))[-1]
        console.print(f"re-rendered {page}")
        _screenshots(args, page, console)
        return 0
    if len(loaded) == 1:
        from overdrive.report.html import write_html
        from overdrive.report.plots import write_plots

        render_bench(loaded[0], console)
        out = _folder_of(args.dirs[0])
        page = write_html(loaded[0], out, write_plots(loaded[0], out))
        console.print(f"re-rendered {page}")
    else:
        render_compare(loaded[0], loaded[1], console)
        page = None
        if args.out:
            from overdrive.report.compare import write_compare_html

            page = write_compare_html(loaded[0], loaded[1], args.out, names=tuple(args.dirs))
            console.print(f"wrote {page}")
    _screenshots(args, page, console)
    return 0


def _screenshots(args: argparse.Namespace, page: str | None, console) -> None:
    """--screenshot: full-page PNGs of the page just written (a headless Chromium must be here)."""
    if not args.screenshot:
        return
    from overdrive.report.browser import BrowserUnavailable, screenshot_report

    if page is None:
        raise UserError("--screenshot with two folders needs --out DIR for the comparison page")
    try:
        shots = screenshot_report(page)
    except BrowserUnavailable as e:
        raise UserError(f"--screenshot: {e}; {page} was written") from None
    console.print("screenshots: " + ", ".join(shots))


def register(sub) -> None:
    r = sub.add_parser("report", help="re-render a bench result folder, or compare two",
                       description="overdrive report DIR re-renders the table, plots and report.html from "
                                   "DIR/results.json; overdrive report DIR_A DIR_B compares two runs.")
    r.add_argument("dirs", nargs="+", metavar="DIR", help="one or two result folders (or results.json files)")
    r.add_argument("--out", help="with two folders: also write the comparison to OUT/compare.html")
    r.add_argument("--screenshot", action="store_true", help="also save full-page PNGs of the page at 1280 and 390 "
                   "px wide beside it (needs a headless Chromium: apt-get install chromium; pip install "
                   "'overdrive[browser]')")
    r.set_defaults(func=_cmd_report)
