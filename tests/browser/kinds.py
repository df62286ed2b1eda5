"""The report kinds the browser tests render: one PAGES line per kind (tune adds one when it lands)."""

from __future__ import annotations

import os


def _bench_page(run: str, out: str) -> str:
    from overdrive.bench import load_results
    from overdrive.report.html import write_html
    from overdrive.report.plots import write_plots

    res = load_results(run)
    return write_html(res, out, write_plots(res, out))


def _compare_page(a: str, b: str, out: str) -> str:
    from overdrive.bench import load_results
    from overdrive.report.compare import write_compare_html

    return write_compare_html(load_results(a), load_results(b), out, names=("bench", "bench_b"))


def _latency_page(run: str, out: str) -> str:
    from overdrive.bench import load_results
    from overdrive.report.latency_view import write_latency_report

    return write_latency_report(load_results(run), out)[-1]


def _plan_page(run: str, out: str) -> str:
    import json

    from overdrive.report.plan_html import write_plan_html
    from overdrive.report.plan_view import write_breakdown_png

    with open(os.path.join(run, "plan.json")) as f:
        r = json.load(f)
    png = os.path.join(out, "memory.png")
    write_breakdown_png(r, png)
    return write_plan_html(r, out, png=png)


# kind -> (the runs it reads (runs.RUNS), render(*run_dirs, out_dir) -> page path, has plots).
# render None: the report.html the run itself wrote (a new kind, e.g. tune, then needs one RUNS line
# and one line here).
PAGES = {
    "bench": (("bench",), _bench_page, True),
    "compare": (("bench", "bench_b"), _compare_page, False),
    "recsys": (("recsys",), _bench_page, True),
    "inference": (("inference",), _latency_page, True),
    "plan": (("plan",), _plan_page, True),
}
