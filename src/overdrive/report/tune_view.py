"""A tune run in the console and in report.html (the shared page frame, `report.page`): the winner's
line and how to apply it, the table of what ran, two plots (speedup with its interval; loss curves
against the fp32 baseline), and the per-layer FP8 decisions if any. Reads `results.records.TuneRecord`."""

from __future__ import annotations

import base64
import io
import os

from overdrive.report.page import esc, page, rec_block, table
from overdrive.results.records import TuneRecord, TuneRow

__all__ = ["write_report", "render_tune", "measured_line"]


def measured_line(rec: TuneRecord) -> str:
    """How it was measured: the A/A noise floor, the load and the threads per worker."""
    bits = []
    n = rec.noise
    if n is not None and n.aa is not None:
        aa = n.aa
        bits.append(f"A/A (baseline vs its twin, {aa.rounds} rounds) {aa.ratio:.3f}x [{aa.ci[0]:.2f}–{aa.ci[1]:.2f}], "
                    f"noise floor ±{aa.spread_pct:.1f}%" + (" — too busy to judge" if n.too_busy else ""))
    elif n is not None:
        bits.append("no A/A noise floor (too few rounds or no twin)")
    if n is not None and n.load_1min is not None:
        bits.append(f"load {n.load_1min:.1f} on {n.cores} cores")
    if rec.threads is not None:
        how = {"user": "--threads", "auto": "auto"}.get(rec.threads_source, str(rec.threads_source))
        bits.append(f"{rec.threads} torch thread(s) per worker ({how})")
    return "; ".join(bits)


def _f(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def _rate(r: TuneRow) -> str:
    """Achieved TFLOP/s, with the MFU where a peak is known."""
    if r.tflops is None:
        return "-"
    return f"{r.tflops:.3g}" + (f" ({100 * r.mfu:.1f}%)" if r.mfu is not None else "")


def _flops_line(rec: TuneRecord) -> str:
    from overdrive.tuning.flops import flops_line

    return flops_line(rec.doc)


def render_tune(rec: TuneRecord, console=None) -> None:
    """The console table of a tune run."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    t = Table(title=escape(f"overdrive tune — {rec.workload} on {rec.device} ({rec.elapsed_s:.0f} of "
                           f"{rec.budget_s:g} s, {rec.rounds} rounds)"))
    for col in ("candidate", "status", "step ms", "speedup [95% CI]", "TFLOP/s (MFU)", "warm-up ms", "loss Δ", "safe",
                "what ran / why"):
        t.add_column(col, overflow="fold")
    for r in rec.rows:
        safe = {True: "yes", False: "[red]UNSAFE[/]", None: "-"}[r.safe]
        why = escape(r.ran + (f" — {r.reason}" if r.reason else ""))
        name = ("[bold green]" + escape(r.label) + "[/]") if r.name == rec.best else escape(r.label)
        t.add_row(name, escape(r.status), _f(r.step_ms, ".1f"), escape(r.speedup_text), _rate(r),
                  _f(r.warmup_first_step_ms, ".0f"), _f(r.loss_delta_pct, "+.2f") + ("%" if r.loss_delta_pct is not None
                                                                                  else ""), safe, why)
    c = console or Console(width=max(120, Console().width))
    c.print(t)
    c.print(escape(rec.summary))
    if _flops_line(rec):
        c.print(escape(_flops_line(rec)))
    m = measured_line(rec)
    if m:
        c.print(escape(f"Measured: {m}."))
    if rec.memory_limit:
        c.print(escape(f"Memory was the limit ({rec.memory_limit}): activation checkpointing was tried."))
    c.print(escape(f"Safety rule: {rec.tolerance}."))
    if rec.cache_note:
        c.print(escape(rec.cache_note))
    elif rec.cached_at:
        c.print(escape(f"Cached for accelerate(model, recipe=\"tuned\") on this machine: {rec.cached_at}"))


def _png(fig, caption: str) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return (f"<figure><figcaption>{esc(caption)}</figcaption><img alt='{esc(caption)}' "
            f"src='data:image/png;base64,{base64.b64encode(buf.getvalue()).decode()}'></figure>")


def _plots(rec: TuneRecord) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = []
    rows = [r for r in rec.rows if r.speedup is not None and r.speedup_ci or r.baseline]
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(rows) + 1.2))
    ys = list(range(len(rows)))
    ci = [r.speedup_ci or (r.speedup, r.speedup) for r in rows]
    err = [[max(0.0, r.speedup - c[0]) for r, c in zip(rows, ci)], [max(0.0, c[1] - r.speedup) for r, c in zip(rows, ci)]]
    ax.barh(ys, [r.speedup for r in rows], xerr=err, capsize=3,
            color=["#393" if r.name == rec.best else "#88a" for r in rows])
    ax.axvline(1.0, color="k", lw=0.8, ls="--")
    ax.set_yticks(ys, [r.name for r in rows])
    ax.set_xlabel("speedup vs baseline (median ratio, 95% bootstrap CI)")
    fig.tight_layout()
    out.append(_png(fig, "speedup against the baseline"))
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(8, 3.5))
    for r in rec.rows:
        if r.losses:
            ax.plot(r.losses, label=r.name, lw=2.5 if r.baseline else 1)
    ax.set_xlabel("step (same batches and seed)")
    ax.set_ylabel("training loss")
    if any(r.losses for r in rec.rows):
        ax.legend(fontsize=7)
    fig.tight_layout()
    out.append(_png(fig, "loss curves (same batches and seed)"))
    plt.close(fig)
    return out


def _table(rec: TuneRecord) -> str:
    rows = []
    for r in rec.rows:
        safe = {True: "yes", False: "<span class='unsafe'>UNSAFE</span>", None: "-"}[r.safe]
        dl = "-" if r.loss_delta_pct is None else f"{r.loss_delta_pct:+.2f}% ({_f(r.loss_delta_nats, '+.4f')})"
        rows.append([esc(r.label), esc(r.status), _f(r.step_ms, ".1f"), esc(r.speedup_text), _rate(r),
                     _f(r.warmup_first_step_ms, ".0f"), dl, safe, esc(r.ran), esc(r.reason or r.safety)])
    return table(["candidate", "status", "step ms", "speedup [95% CI]", "TFLOP/s (MFU)", "warm-up (first step) ms",
                  "loss Δ", "safe", "what ran", "note"], rows, wrap=(8, 9))


def _fp8_tables(rec: TuneRecord) -> list[str]:
    out = []
    for r in rec.rows:
        if r.fp8_layers:
            out.append(f"<h3>Per-layer FP8 filter for {esc(r.name)}</h3>")
            out.append(table(["layer", "shape", "M", "bf16 ms", "fp8 ms", "decision"], [
                [esc(str(d["fqn"])), esc(str(d["shape"])), esc(str(d["tokens"])), _f(d["bf16_ms"], ".3f"),
                 _f(d["fp8_ms"], ".3f"), esc(d["reason"])] for d in r.fp8_layers], wrap=(5,)))
    return out


def write_report(rec: TuneRecord, out_dir: str) -> str:
    """report.html in the shared frame: the verdict and how to apply it first, then the table and plots."""
    from overdrive.io import write_atomic

    nxt = (f"Apply it: <code>accelerate(model, recipe=Recipe.load({esc(repr(os.path.join(out_dir, 'recipe.json')))}))"
           f"</code>" + (f" or <code>accelerate(model, recipe=\"tuned\")</code> on this machine" if rec.cached_at
                         and not rec.cache_note else ""))
    body = [f"<h1>overdrive tune</h1><p class='meta'>{esc(str(rec.workload))} on {esc(str(rec.device))} · "
            f"{esc(rec.created)} · budget {rec.budget_s:g} s, took {rec.elapsed_s:.0f} s, {rec.rounds} timed rounds</p>",
            # no verdict (a host too busy to judge) is not drawn in the green of a result
            *rec_block(rec.summary, nxt, answered=rec.answered),
            f"<p class='note'>Measured: {esc(measured_line(rec) or '-')}.</p>",
            f"<p class='note'>{esc(_flops_line(rec))}</p>",
            f"<p class='note'>Safety: {esc(rec.tolerance)}. Speedups are against the baseline ({esc(rec.baseline)}); "
            "emulated FP8 is checked for safety only.</p>", _table(rec), *_fp8_tables(rec)]
    try:
        import warnings

        with warnings.catch_warnings():  # huge figures overflow matplotlib's ticks: our note, not its warning
            warnings.simplefilter("error", RuntimeWarning)
            body += _plots(rec)
    except Exception as ex:  # a plot must never cost the results
        body.append(f"<p class='note'>plots unavailable: {esc(str(ex))}</p>")
    p = os.path.join(out_dir, "report.html")
    write_atomic(p, page(f"overdrive tune — {rec.device}", body))
    return p
