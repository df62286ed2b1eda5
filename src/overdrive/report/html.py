"""One self-contained report.html for a bench run: verdict and next step first, then the table,
notes, plots (embedded as base64), micro-benchmarks and the environment."""

from __future__ import annotations

import os

from overdrive.bench.workloads import suite_title
from overdrive.results.bench import throughput
from overdrive.io import write_atomic
from overdrive.report.advice import next_step, precision_note, role_order, verdict_text
from overdrive.report.page import esc, img_tag, page, rec_block, table
from overdrive.report.tables import bench_workload, emulated_note, rate_text

__all__ = ["write_html", "bench_rows"]

_FAILED = ("failed", "oom", "crashed", "unavailable")


def _f(v, fmt="{:.2f}") -> str:
    return "-" if v is None or v == "" else (fmt.format(v) if isinstance(v, (int, float)) else esc(str(v)))


def bench_rows(results: dict) -> tuple[list[str], list[list[str]]]:
    """Header and HTML cells, one row per configuration and model, in the run's order."""
    w = bench_workload(results)
    head = ["config", "model", "status", "step ms median", "p10–p90", esc(w.rate_unit), "speedup [95% CI]",
            esc(w.quality_header), "peak MB", "mem saved", esc(w.loss_header), "safe"]
    rows = []
    for c in results.get("configs", []):
        # What ran (fallbacks included), and the candidates that resolved to the same thing here.
        also = "".join(f" = {a.get('label', a.get('name'))}" for a in c.get("also") or [])
        label = (c.get("label") or c["name"]) + also
        name = esc(label + (" (emulated)" if c.get("emulated") else ""))
        st = c.get("status", "?")
        if st in _FAILED:
            rows.append([name, "-", f"<span class='bad'>{esc(st)}</span>", *["-"] * 8,
                         "<span class='unsafe'>no</span>"])
            continue
        for i, role in enumerate(role_order(results, c)):
            m = c["models"][role]
            s = m.get("step_ms") or {}
            ci = m.get("speedup_ci") or [None, None]
            if c.get("emulated"):
                speed = "quality only (emulated)"
            elif st == "stopped":
                speed = "stopped early"
            elif m.get("speedup") is not None:
                speed = f"{m['speedup']:.2f}x" + (f" [{ci[0]:.2f}–{ci[1]:.2f}]" if ci[0] is not None else "")
            else:
                speed = "-"
            p1090 = f"{s['p10']:.1f}–{s['p90']:.1f}" if None not in (s.get("p10"), s.get("p90")) else "-"
            quality = esc(w.quality_cell(m, c))
            safe = ("not assessed" if c.get("safe", True) is None else "yes" if c.get("safe")
                    else "<span class='unsafe'>UNSAFE</span>") if i == 0 else ""
            rows.append([name if i == 0 else "", esc(role), esc(st) if i == 0 else "", _f(s.get("median"), "{:.1f}"),
                         p1090, _f(throughput(m)[0], "{:,.0f}"), speed, quality,
                         _f(c.get("peak_mb"), "{:.0f}") if i == 0 else "",
                         _f(c.get("memory_saved_pct"), "{:+.1f}%") if i == 0 else "",
                         _f(m.get("loss_delta_pct"), "{:+.2f}%"), safe])
    return head, rows


def _notes(results: dict) -> list[str]:
    out = []
    for c in results.get("configs", []):
        for why in (c.get("reason"), c.get("unsafe_reason") and f"UNSAFE — {c['unsafe_reason']}",
                    c.get("not_assessed_reason")):
            if why:
                out.append(f"{c['name']}: {why}")
        if c.get("emulated"):
            out.append(emulated_note(c))
    from overdrive.report.tables import _threads_note

    sched = results.get("schedule") or {}
    meas = [x for x in ((sched.get("noise") or {}).get("note"), _threads_note(sched.get("threads"))) if x]
    if meas:
        out.append("measured: " + "; ".join(meas))
    return out


def write_html(results: dict, out_dir: str, plots: list[str]) -> str:
    env = results.get("env") or {}
    why = precision_note(results)
    body = [f"<h1>overdrive bench</h1><p class='meta'>{esc(str(results.get('device')))} · "
            f"{esc(suite_title(results))} · {esc(str(results.get('created')))} · commit "
            f"{esc(str(results.get('git_commit')))} · torch "
            f"{esc(str((results.get('versions') or {}).get('torch')))}</p>"]
    rec = results.get("recommendation") or {}
    # "too busy to judge" or nothing completed: no verdict, never drawn in the green of a result
    answered = not rec.get("too_busy") and not str(rec.get("text", "")).startswith("no configuration completed")
    body += rec_block(verdict_text(results), next_step(results).html(esc), why, answered=answered)
    head, rows = bench_rows(results)
    body.append(table(head, rows, left=3))
    body += [f"<p class='note'>{esc(n)}</p>" for n in _notes(results)]
    for p in plots:
        body.append(img_tag(os.path.join(out_dir, p), p, p[:-4].replace("_", " ")))
    micro = [m for m in results.get("micro", []) if m.get("status") == "ok"]
    if micro:
        body.append("<h2>Micro-benchmarks</h2>")
        body.append(table(["group", "provider", "ms median", "p10–p90", "rate"], [
            [esc(m["group"]), esc(m["provider"]), f"{m['ms']['median']:.3f}",
             f"{m['ms']['p10']:.3f}–{m['ms']['p90']:.3f}", esc(rate_text(m.get("rate"), m.get("unit", "")))]
            for m in micro], left=2))
    verdict = []
    for v in env.get("verdict", []):
        line = esc(v)
        if why and v.startswith("Best precision here"):
            line += " <i>(the probes' expectation; the measured answer is at the top)</i>"
        verdict.append(f"<li>{line}</li>")
    body.append("<h2>Environment</h2><ul>" + "".join(verdict) + "</ul>")
    body.append("<p class='note'>Raw timings, losses and the full environment are in results.json.</p>")
    path = os.path.join(out_dir, "report.html")
    write_atomic(path, page(f"overdrive bench — {results.get('device')}", body))
    return path
