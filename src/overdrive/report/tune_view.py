"""report.html for a tune run: the winner's line, the table of what ran, two plots (speedup with
its interval; loss curves against the fp32 baseline), and the per-layer FP8 decisions if any."""

from __future__ import annotations

import base64
import html
import io
import os

__all__ = ["write_report", "render_tune", "measured_line"]


def measured_line(res: dict) -> str:
    """How it was measured: the A/A noise floor, the load and the threads per worker."""
    bits = []
    n = res.get("noise") or {}
    aa = n.get("aa")
    if aa:
        bits.append(f"A/A (baseline vs its twin, {aa['rounds']} rounds) {aa['ratio']:.3f}x [{aa['ci'][0]:.2f}–"
                    f"{aa['ci'][1]:.2f}], noise floor ±{aa['spread_pct']:.1f}%" + (" — too busy to judge" if
                                                                                   n.get("too_busy") else ""))
    elif n:
        bits.append("no A/A noise floor (too few rounds or no twin)")
    if n.get("load_1min") is not None:
        bits.append(f"load {n['load_1min']:.1f} on {n.get('cores')} cores")
    t = res.get("threads") or {}
    if t:
        how = {"user": "--threads", "auto": "auto"}.get(t.get("source"), str(t.get("source")))
        bits.append(f"{t['threads']} torch thread(s) per worker ({how})")
    return "; ".join(bits)


def render_tune(res: dict, console=None) -> None:
    """The console table of a tune result (a TuneResult.to_dict() or a tune folder's results.json)."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from overdrive.tuning.api import speedup_text

    t = Table(title=escape(f"overdrive tune — {res.get('workload')} on {res.get('gpu') or res.get('cpu')} "
                           f"({res['elapsed_s']:.0f} of {res['budget_s']:g} s, {res['rounds']} rounds)"))
    for col in ("candidate", "status", "step ms", "speedup [95% CI]", "TFLOP/s (MFU)", "warm-up ms", "loss Δ", "safe",
                "what ran / why"):
        t.add_column(col, overflow="fold")
    for r in res["candidates"]:
        step = "-" if r["step_ms"] is None else f"{r['step_ms']:.1f}"
        warm = "-" if r["warmup_first_step_ms"] is None else f"{r['warmup_first_step_ms']:.0f}"
        dl = "-" if r["loss_delta_pct"] is None else f"{r['loss_delta_pct']:+.2f}%"
        safe = {True: "yes", False: "[red]UNSAFE[/]", None: "-"}[r["safe"]]
        why = escape(r["ran"] + (f" — {r['reason']}" if r["reason"] else ""))
        name = ("[bold green]" + escape(r["label"]) + "[/]") if r["name"] == res["best"] else escape(r["label"])
        t.add_row(name, escape(r["status"]), step, escape(speedup_text(r)), _rate(r), warm, dl, safe, why)
    c = console or Console(width=max(120, Console().width))
    c.print(t)
    c.print(escape(res["summary"]))
    from overdrive.tuning.flops import flops_line

    if flops_line(res):
        c.print(escape(flops_line(res)))
    m = measured_line(res)
    if m:
        c.print(escape(f"Measured: {m}."))
    if res.get("memory_limit"):
        c.print(escape(f"Memory was the limit ({res['memory_limit']}): activation checkpointing was tried."))
    c.print(escape(f"Safety rule: {res['tolerance']}."))
    if res.get("cache_note"):
        c.print(escape(res["cache_note"]))
    elif res.get("cached_at"):
        c.print(escape(f"Cached for accelerate(model, recipe=\"tuned\") on this machine: {res['cached_at']}"))

_CSS = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1150px;color:#222}
table{border-collapse:collapse;font-size:13px;margin:1em 0}td,th{border:1px solid #ccc;padding:3px 7px;text-align:left}
th{background:#f3f3f3}.unsafe{color:#b00;font-weight:bold}img{max-width:100%}
.rec{font-size:1.1em;background:#eef7ee;padding:.6em;border-left:4px solid #393}.note{color:#555;font-size:13px}
.rec.none{background:#f3f3f3;border-left-color:#8a5a00}"""


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return "<img src='data:image/png;base64," + base64.b64encode(buf.getvalue()).decode() + "'>"


def _plots(res: dict) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = []
    rows = [r for r in res["candidates"] if r["speedup"] is not None and r["speedup_ci"] or r["baseline"]]
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(rows) + 1.2))
    ys = list(range(len(rows)))
    sp = [r["speedup"] for r in rows]
    err = [[max(0.0, r["speedup"] - (r["speedup_ci"] or [r["speedup"]] * 2)[0]) for r in rows],
           [max(0.0, (r["speedup_ci"] or [r["speedup"]] * 2)[1] - r["speedup"]) for r in rows]]
    ax.barh(ys, sp, xerr=err, capsize=3, color=["#393" if r["name"] == res["best"] else "#88a" for r in rows])
    ax.axvline(1.0, color="k", lw=0.8, ls="--")
    ax.set_yticks(ys, [r["name"] for r in rows])
    ax.set_xlabel("speedup vs baseline (median ratio, 95% bootstrap CI)")
    fig.tight_layout()
    out.append(_png(fig))
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(8, 3.5))
    for r in res["candidates"]:
        if r["losses"]:
            ax.plot(r["losses"], label=r["name"], lw=2.5 if r["baseline"] else 1)
    ax.set_xlabel("step (same batches and seed)")
    ax.set_ylabel("training loss")
    ax.legend(fontsize=7)
    fig.tight_layout()
    out.append(_png(fig))
    plt.close(fig)
    return out


def _flops_line(res: dict) -> str:
    from overdrive.tuning.flops import flops_line

    return flops_line(res)


def _rate(r: dict) -> str:
    """Achieved TFLOP/s, with the MFU where a peak is known."""
    if r.get("tflops") is None:
        return "-"
    return f"{r['tflops']:.3g}" + (f" ({100 * r['mfu']:.1f}%)" if r.get("mfu") is not None else "")


def write_report(res: dict, out_dir: str) -> str:
    from overdrive.io import write_atomic
    from overdrive.tuning.api import speedup_text

    e = html.escape
    no_verdict = bool((res.get("noise") or {}).get("too_busy")) and not str(res.get("summary")).startswith("Winner")
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>overdrive tune</title><style>{_CSS}"
             "</style></head><body><h1>overdrive tune</h1>",
             f"<p>{e(str(res.get('workload')))} on {e(str(res.get('gpu') or res.get('cpu')))} · {e(res['created'])}"
             f" · budget {res['budget_s']:g} s, took {res['elapsed_s']:.0f} s, {res['rounds']} timed rounds</p>",
             # no verdict (a host too busy to judge) is not drawn in the green of a result
             f"<p class='rec{' none' if no_verdict else ''}'>{e(res['summary'])}</p>",
             f"<p class='note'>Measured: {e(measured_line(res) or '-')}.</p>",
             f"<p class='note'>{e(_flops_line(res))}</p>",
             f"<p class='note'>Safety: {e(res['tolerance'])}. Speedups are against the baseline "
             f"({e(res['baseline'])}); emulated FP8 is checked for safety only.</p>",
             "<table><tr><th>candidate</th><th>status</th><th>step ms</th><th>speedup [95% CI]</th><th>TFLOP/s (MFU)</th>"
             "<th>warm-up "
             "(first step) ms</th><th>loss Δ</th><th>safe</th><th>what ran</th><th>note</th></tr>"]
    for r in res["candidates"]:
        safe = {True: "yes", False: "<span class='unsafe'>UNSAFE</span>", None: "-"}[r["safe"]]
        step = "-" if r["step_ms"] is None else f"{r['step_ms']:.1f}"
        warm = "-" if r["warmup_first_step_ms"] is None else f"{r['warmup_first_step_ms']:.0f}"
        dl = "-" if r["loss_delta_pct"] is None else f"{r['loss_delta_pct']:+.2f}% ({r['loss_delta_nats']:+.4f})"
        parts.append(f"<tr><td>{e(r['label'])}</td><td>{e(r['status'])}</td><td>{step}</td>"
                     f"<td>{e(speedup_text(r))}</td><td>{_rate(r)}</td><td>{warm}</td><td>{dl}</td><td>{safe}</td><td>{e(r['ran'])}</td>"
                     f"<td>{e(r['reason'] or r['safety'])}</td></tr>")
    parts.append("</table>")
    for r in res["candidates"]:
        f = r.get("fp8_filter")
        if f and f.get("layers"):
            parts.append(f"<h3>Per-layer FP8 filter for {e(r['name'])}</h3><table><tr><th>layer</th><th>shape</th>"
                         "<th>M</th><th>bf16 ms</th><th>fp8 ms</th><th>decision</th></tr>")
            for d in f["layers"]:
                parts.append(f"<tr><td>{e(str(d['fqn']))}</td><td>{e(str(d['shape']))}</td><td>{e(str(d['tokens']))}</td>"
                             f"<td>{'-' if d['bf16_ms'] is None else format(d['bf16_ms'], '.3f')}</td>"
                             f"<td>{'-' if d['fp8_ms'] is None else format(d['fp8_ms'], '.3f')}</td>"
                             f"<td>{e(d['reason'])}</td></tr>")
            parts.append("</table>")
    try:
        import warnings

        with warnings.catch_warnings():  # huge figures overflow matplotlib's ticks: our note, not its warning
            warnings.simplefilter("error", RuntimeWarning)
            parts += _plots(res)
    except Exception as ex:  # a plot must never cost the results
        parts.append(f"<p class='note'>plots unavailable: {e(str(ex))}</p>")
    parts.append("</body></html>")
    p = os.path.join(out_dir, "report.html")
    write_atomic(p, "\n".join(parts))
    return p
