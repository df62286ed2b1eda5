"""One self-contained report.html for a bench run: verdict and next step first, then the table,
notes, plots (embedded as base64), micro-benchmarks and the environment."""

from __future__ import annotations

import os

from overdrive.bench.workloads import suite_title
from overdrive.io import write_atomic
from overdrive.report.advice import bench_record, next_step, precision_note
from overdrive.report.page import esc, img_tag, page, rec_block, table
from overdrive.report.tables import bench_workload, emulated_note, measured_note, rate_text
from overdrive.results.bench import throughput
from overdrive.results.records import BenchRecord, ConfigRecord

__all__ = ["write_html", "bench_rows"]


def _f(v, fmt="{:.2f}") -> str:
    return "-" if v is None or v == "" else (fmt.format(v) if isinstance(v, (int, float)) else esc(str(v)))


def _speed(c: ConfigRecord, m: dict) -> str:
    ci = m.get("speedup_ci") or [None, None]
    if c.emulated:
        return "quality only (emulated)"
    if c.status == "stopped":
        return c.stopped_words
    if m.get("speedup") is None:
        return "-"
    return f"{m['speedup']:.2f}x" + (f" [{ci[0]:.2f}–{ci[1]:.2f}]" if ci[0] is not None else "")


def _model_cells(c: ConfigRecord, m: dict, w) -> list[str]:
    """step ms median, p10–p90, rate, speedup, the workload's quality cell (HTML, escaped)."""
    s = m.get("step_ms") or {}
    p1090 = f"{s['p10']:.1f}–{s['p90']:.1f}" if None not in (s.get("p10"), s.get("p90")) else "-"
    return [_f(s.get("median"), "{:.1f}"), p1090, _f(throughput(m)[0], "{:,.0f}"), _speed(c, m),
            esc(w.quality_cell(m, c.doc))]


def bench_rows(results: BenchRecord | dict) -> tuple[list[str], list[list[str]]]:
    """Header and HTML cells, one row per configuration and model, in the run's order."""
    rec = bench_record(results)
    w = bench_workload(rec)
    head = ["config", "model", "status", "step ms median", "p10–p90", esc(w.rate_unit), "speedup [95% CI]",
            esc(w.quality_header), "peak MB", "mem saved", esc(w.loss_header), "safe"]
    rows = []
    for c in rec.configs:
        # What ran (fallbacks included), and the candidates that resolved to the same thing here.
        name = esc(c.label + "".join(f" = {a}" for a in c.also) + (" (emulated)" if c.emulated else ""))
        if c.failed:
            rows.append([name, "-", f"<span class='bad'>{esc(c.status)}</span>", *["-"] * 8,
                         "<span class='unsafe'>no</span>"])
            continue
        safe = "not assessed" if c.safe is None else "yes" if c.safe else "<span class='unsafe'>UNSAFE</span>"
        for i, role in enumerate(rec.role_order(c)):
            m, first = c.models[role], i == 0
            rows.append([name if first else "", esc(role), esc(c.status) if first else "", *_model_cells(c, m, w),
                         _f(c.peak_mb, "{:.0f}") if first else "",
                         _f(c.memory_saved_pct, "{:+.1f}%") if first else "",
                         _f(m.get("loss_delta_pct"), "{:+.2f}%"), safe if first else ""])
    return head, rows


def _notes(rec: BenchRecord) -> list[str]:
    out = []
    for c in rec.configs:
        for why in (c.reason, c.unsafe_reason and f"UNSAFE — {c.unsafe_reason}", c.not_assessed_reason):
            if why:
                out.append(f"{c.name}: {why}")
        if c.emulated:
            out.append(emulated_note(c))
    meas = measured_note(rec)
    if meas:
        out.append("measured: " + meas)
    return out


def _micro(rec: BenchRecord) -> list[str]:
    micro = [m for m in rec.micro if m.get("status") == "ok"]
    if not micro:
        return []
    return ["<h2>Micro-benchmarks</h2>", table(["group", "provider", "ms median", "p10–p90", "rate"], [
        [esc(m["group"]), esc(m["provider"]), f"{m['ms']['median']:.3f}", f"{m['ms']['p10']:.3f}–{m['ms']['p90']:.3f}",
         esc(rate_text(m.get("rate"), m.get("unit", "")))] for m in micro], left=2)]


def _environment(rec: BenchRecord, why: str | None) -> str:
    verdict = []
    for v in rec.env_verdict:
        line = esc(v)
        if why and v.startswith("Best precision here"):
            line += " <i>(the probes' expectation; the measured answer is at the top)</i>"
        verdict.append(f"<li>{line}</li>")
    return "<h2>Environment</h2><ul>" + "".join(verdict) + "</ul>"


def write_html(results: BenchRecord | dict, out_dir: str, plots: list[str]) -> str:
    rec = bench_record(results)
    why = precision_note(rec)
    body = [f"<h1>overdrive bench</h1><p class='meta'>{esc(str(rec.device))} · {esc(suite_title(rec.doc))} · "
            f"{esc(str(rec.created))} · commit {esc(str(rec.git_commit))} · torch {esc(str(rec.torch))}</p>"]
    # "too busy to judge" or nothing completed: no verdict, never drawn in the green of a result
    body += rec_block(rec.recommendation.verdict, next_step(rec).html(esc), why, answered=rec.recommendation.answered)
    head, rows = bench_rows(rec)
    body.append(table(head, rows, left=3))
    body += [f"<p class='note'>{esc(n)}</p>" for n in _notes(rec)]
    for p in plots:
        body.append(img_tag(os.path.join(out_dir, p), p, p[:-4].replace("_", " ")))
    body += _micro(rec)
    body.append(_environment(rec, why))
    body.append("<p class='note'>Raw timings, losses and the full environment are in results.json.</p>")
    path = os.path.join(out_dir, "report.html")
    write_atomic(path, page(f"overdrive bench — {rec.device}", body))
    return path
