"""One self-contained report.html: tables, recommendation and the plots embedded as base64."""

from __future__ import annotations

import base64
import html
import os

from overdrive.bench.results import csv_rows, suite_title
from overdrive.io import write_atomic

__all__ = ["write_html"]

_CSS = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1100px;color:#222}
table{border-collapse:collapse;font-size:13px;margin:1em 0}td,th{border:1px solid #ccc;padding:3px 7px;text-align:right}
th{background:#f3f3f3}td:first-child,td:nth-child(2){text-align:left}.unsafe{color:#b00;font-weight:bold}
.rec{font-size:1.15em;background:#eef7ee;padding:.6em;border-left:4px solid #393}img{max-width:100%}
.note{color:#555;font-size:13px}"""


def _f(v, fmt="{:.2f}"):
    return "-" if v is None or v == "" else (fmt.format(v) if isinstance(v, (int, float)) else html.escape(str(v)))


def write_html(results: dict, out_dir: str, plots: list[str]) -> str:
    e = html.escape
    env = results["env"]
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>overdrive bench — {e(results['device'])}"
             f"</title><style>{_CSS}</style></head><body>",
             f"<h1>overdrive bench</h1><p>{e(results['device'])} · {e(suite_title(results))} · "
             f"{e(results['created'])} · commit {e(str(results.get('git_commit')))} · torch "
             f"{e(str(results['versions'].get('torch')))}</p>",
             f"<p class='rec'>{e(results['recommendation']['text'])}</p>",
             "<table><tr><th>config</th><th>model</th><th>status</th><th>step ms median</th><th>p10–p90</th>"
             "<th>tokens/s or examples/s</th><th>speedup [95% CI]</th><th>MFU vs BF16 peak / AUC</th><th>peak MB</th>"
             "<th>mem saved</th><th>loss Δ</th><th>safe</th></tr>"]
    for r in csv_rows(results):
        speed = "quality only (emulated)" if r["emulated"] else (
            f"{r['speedup']:.2f}x [{r['speedup_lo']:.2f}–{r['speedup_hi']:.2f}]" if r["speedup"] is not None else "-")
        p1090 = f"{r['step_ms_p10']:.1f}–{r['step_ms_p90']:.1f}" if r["step_ms_p10"] is not None else "-"
        mfu = f"{100 * r['mfu_bf16_peak']:.1f}%" if r["mfu_bf16_peak"] is not None else (
            f"AUC {r['auc']:.4f}" if r.get("auc") is not None else "-")
        rate = r["tokens_per_s"] if r["tokens_per_s"] is not None else r.get("examples_per_s")
        safe = "not assessed" if r["safe"] is None else "yes" if r["safe"] else "<span class='unsafe'>UNSAFE</span>"
        parts.append(f"<tr><td>{e(r.get('label') or r['config'])}</td><td>{r['model']}</td><td>{e(r['status'])}</td>"
                     f"<td>{_f(r['step_ms_median'], '{:.1f}')}</td><td>{p1090}</td>"
                     f"<td>{_f(rate, '{:,.0f}')}</td><td>{speed}</td><td>{mfu}</td>"
                     f"<td>{_f(r['peak_mb'], '{:.0f}')}</td><td>{_f(r['memory_saved_pct'], '{:+.1f}%')}</td>"
                     f"<td>{_f(r['loss_delta_pct'], '{:+.2f}%')}</td><td>{safe}</td></tr>")
    parts.append("</table>")
    notes = [f"{c['name']}: {c['reason'] or c.get('unsafe_reason')}" for c in results["configs"]
             if c["reason"] or c.get("unsafe_reason")]
    for n in notes:
        parts.append(f"<p class='note'>{e(n)}</p>")
    for p in plots:
        with open(os.path.join(out_dir, p), "rb") as f:
            b64 = base64.b64encode(f.read()).decode()
        parts.append(f"<h3>{e(p[:-4].replace('_', ' '))}</h3><img alt='{e(p)}' src='data:image/png;base64,{b64}'>")
    micro = [m for m in results.get("micro", []) if m["status"] == "ok"]
    if micro:
        parts.append("<h2>Micro-benchmarks</h2><table><tr><th>group</th><th>provider</th><th>ms median</th>"
                     "<th>p10–p90</th><th>rate</th></tr>")
        for m in micro:
            parts.append(f"<tr><td>{e(m['group'])}</td><td>{e(m['provider'])}</td><td>{m['ms']['median']:.3f}</td>"
                         f"<td>{m['ms']['p10']:.3f}–{m['ms']['p90']:.3f}</td>"
                         f"<td>{_f(m.get('rate'), '{:.3f}')} {e(m.get('unit', ''))}</td></tr>")
        parts.append("</table>")
    parts.append("<h2>Environment</h2><ul>" + "".join(f"<li>{e(v)}</li>" for v in env.get("verdict", [])) + "</ul>")
    parts.append("<p class='note'>Raw timings, losses and the full environment are in results.json.</p>"
                 "</body></html>")
    path = os.path.join(out_dir, "report.html")
    write_atomic(path, "\n".join(parts))
    return path
