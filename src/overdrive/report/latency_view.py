"""Latency results: a table per workload, a p99-vs-batch plot with the SLO line, and the HTML page."""

from __future__ import annotations

import html
import os
import shlex

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from overdrive.io import write_atomic

__all__ = ["render_latency", "render_serving", "write_latency_report"]

_TITLES = {"recsys": "click model", "gpt_prefill": "GPT prefill", "gpt_decode": "GPT decode (one token)"}


def _batches(w: dict) -> list[str]:
    seen: list[str] = []
    for md in w["modes"].values():
        for b in md["batches"]:
            if b not in seen:
                seen.append(b)
    return sorted(seen, key=int)


def _verdict(st: dict, slo: float) -> str:
    """The recorded SLO verdict; results written before it existed: from their p99."""
    if st.get("slo"):
        return st["slo"]
    return "unknown" if st.get("p99") is None else ("meets" if st["p99"] <= slo else "misses")


def _ms(x: float | None, n: int | None = None) -> str:
    """A latency in ms, or why there is none (too few samples to bound that percentile)."""
    if x is None:
        return f"n/e (n={n})" if n is not None else "n/e"
    return f"{x:.2f}"


def _load_text(ld: dict | None) -> str:
    if not ld:
        return "host load: not measured"
    b, a = ld["before"], ld["after"]
    busy = " — BUSY: more runnable work than cores; these figures are this host's, now" if ld.get("busy") else ""
    return f"host load (1 min) {b['load1']} before, {a['load1']} after, on {b['cores']} cores{busy}"


def _floor_text(nf: dict | None) -> str:
    if not nf:
        return "A/A noise floor: not measured"
    f = lambda x: "n/e" if x is None else f"{100 * x:.1f}%"  # noqa: E731
    if "pairs" in nf:  # the serving floor: per twin pair, per round and in rate
        parts = []
        for p in nf["pairs"]:
            rf = p.get("round_floor")
            rate = (f", rates {100 * (p['rate_ratio'] - 1):.1f}% apart" if p.get("rate_ratio") is not None else
                    ", one twin met the SLO, the other not" if p.get("rate_split") else "")
            parts.append(f"{p['of']}: ±{rf['spread_pct']:.1f}% per round over {rf['rounds']} rounds{rate}"
                         if rf else f"{p['of']}: too few rounds")
        return "A/A noise floor (measured twice, same rounds): " + "; ".join(parts) if parts else \
            "A/A noise floor: not measured"
    return f"A/A noise floor ({nf['of']} measured twice): p50 {f(nf['p50_rel'])}, p99 {f(nf['p99_rel'])}"


def _holds(best: dict) -> str:
    """The rate's interval and the rate the setting keeps in 90% of resamples (older results: how often it
    was chosen, or the share that held)."""
    if best.get("ci") and best.get("held") is not None:
        from overdrive.serve.serving import held_text

        lo, hi = best["ci"]
        return f" [{lo:,.0f}-{hi:,.0f}], {held_text(best)}"
    if best.get("ci"):
        lo, hi = best["ci"]
        return f" [{lo:,.0f}-{hi:,.0f}], setting chosen in {best.get('stability', 0):.0%} of resamples"
    h = best.get("holds_in")
    return "" if h is None else f" (90% of it holds in {h:.0%} of resamples)"


def _withheld(e: dict) -> str:
    return f"no verdict: {e['withheld']}" if e.get("withheld") else "none"


def _setting_text(c: dict) -> str:
    pref = f", preferred {c['preferred_batch_size']}" if c.get("preferred_batch_size") else ""
    return (f"max_batch_size {c['max_batch_size']}{pref}, delay {c['max_queue_delay_us']} µs, "
            f"{c.get('instances', 1)} instance")


def served_name(sv: dict) -> str:
    """What the serving results measured: "click model" (built in) or the user's FILE.py:FACTORY."""
    return ((sv.get("model_identity") or {}).get("given") or {}).get("factory") or "click model"


def export_command(sv: dict | None, out_dir: str | None, *, max_batch: str | None = None) -> str:
    """The `overdrive export` for the model these results measured (the user's FILE.py:FACTORY, or the click
    model): with --slo-from the folder, or with --max-batch when the bench gave no setting to take."""
    given = ((sv or {}).get("model_identity") or {}).get("given")
    args = ["--model", given["factory"], "--inputs", given["inputs"]] + [
        a for d in given.get("dynamic") or [] for a in ("--dynamic", d)] if given else ["--model", "recsys"]
    how = ["--slo-from", out_dir] if out_dir else ["--max-batch", max_batch or "N"]
    return f"overdrive export {shlex.join(args + how)} --out export/".replace("'N'", "N")


def render_serving(sv: dict, console: Console) -> None:
    t = Table(title=f"{escape(served_name(sv))} under a Poisson request stream — highest rate with p99 <= "
                    f"{sv['slo_ms']:g} ms "
                    f"(Triton dynamic batcher, simulated from measured service times)", title_justify="left")
    for col in ("engine", "service ms p50 / p99 at batch 1", "highest rate (req/s)", "batcher settings", "note"):
        t.add_column(col, overflow="fold")
    for name, e in sv["engines"].items():
        if e["status"] != "ok":
            t.add_row(name, "", "", "", f"[dim]{escape(e['status'])}: {escape(str(e.get('reason')))}[/]")
            continue
        s1 = e["service"][min(e["service"], key=int)]
        best = e.get("best")
        t.add_row(f"{name} ({escape(e['label'])})", f"{_ms(s1['p50'])} / {_ms(s1['p99'], s1['n'])}",
                  f"{best['rate']:,.0f}{_holds(best)}" if best else escape(_withheld(e)),
                  _setting_text(best["config"]) if best else "-",
                  f"max |Δ| vs eager {e['max_abs_error_vs_eager']:.1g}" if e.get("max_abs_error_vs_eager") is not None
                  else "")
    console.print(t)
    if sv.get("withheld"):
        console.print(f"  [bold]no verdict[/]: {escape(sv['withheld'])}")
    console.print(f"  {escape(_load_text(sv.get('load')))}; {escape(_floor_text(sv.get('noise_floor')))}; "
                  f"threads per engine {escape(str(sv.get('threads_why', sv.get('threads'))))}")
    console.print(f"  [dim]{escape(sv['note'])}[/]")


def render_latency(r: dict, console: Console) -> None:
    slo = r["slo_ms"]
    if r.get("serving"):
        render_serving(r["serving"], console)
    for key, w in r["workloads"].items():
        bs = _batches(w)
        t = Table(title=escape(f"{_TITLES.get(key, key)} — {w['model']} — latency ms p50 / p99 per batch "
                               f"(SLO p99 <= {slo:g} ms) — {r['device']}"), title_justify="left")
        t.add_column("mode")
        for b in bs:
            t.add_column(escape(f"batch {b}"))
        t.add_column("largest batch in SLO")
        for mode, md in w["modes"].items():
            if md["status"] != "ok":
                t.add_row(escape(str(mode)), *[""] * len(bs), f"[dim]{escape(str(md['reason']))}[/]")
                continue
            cells = []
            for b in bs:
                st = md["batches"].get(b, {})
                if "p50" not in st:
                    cells.append(f"[dim]{escape(str(st.get('status', '-'))[:30])}[/]")
                else:
                    style = {"meets": "green", "misses": "red"}.get(_verdict(st, slo), "yellow")
                    cells.append(f"{_ms(st['p50'])} / [{style}]{_ms(st['p99'], st.get('n'))}[/]")
            slo_txt = f"{md['slo_batch']} ({md['slo_throughput']:,.0f} {w['unit']})" if md.get("slo_batch") else "none"
            t.add_row(escape(str(mode)), *cells, escape(slo_txt))
        console.print(t)
        console.print(f"  [bold]{escape(str(w['best']['text']))}[/]")
    if r["workloads"]:
        console.print(f"  fixed batches: {escape(_load_text(r.get('load')))}; n/e = too few samples to bound that "
                      "percentile (p95 needs 72, p99 368): a batch meets the SLO only with an estimated p99")


def _plot(r: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ws = r["workloads"]
    fig, axes = plt.subplots(1, len(ws), figsize=(5 * len(ws), 3.8), squeeze=False)
    for ax, (key, w) in zip(axes[0], ws.items()):
        for mode, md in w["modes"].items():
            pts = [(int(b), st["p99"]) for b, st in md["batches"].items() if st.get("p99") is not None]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=mode)
        ax.axhline(r["slo_ms"], color="k", ls="--", lw=1, label=f"SLO {r['slo_ms']:g} ms")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("batch size")
        ax.set_ylabel("p99 latency (ms)")
        ax.set_title(_TITLES.get(key, key))
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_rate(sv: dict, path: str) -> None:
    """p99 (and p50) end-to-end latency against the request rate, per engine at its best setting, SLO dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for name, e in sv["engines"].items():
        pts = [(p["rate"], p["p99"]) for p in (e.get("curve") or {}).get("points", []) if p["p99"] is not None]
        if pts:
            line, = ax.plot(*zip(*pts), marker="o", ms=3, label=f"{name} p99 ({_setting_text(e['curve']['config'])})")
            p50 = [(p["rate"], p["p50"]) for p in e["curve"]["points"] if p["p50"] is not None]
            ax.plot(*zip(*p50), ls=":", color=line.get_color(), lw=1)
    ax.axhline(sv["slo_ms"], color="k", ls="--", lw=1, label=f"SLO {sv['slo_ms']:g} ms")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("request rate (req/s, Poisson)")
    ax.set_ylabel("end-to-end latency (ms): p99 solid, p50 dotted")
    ax.set_title(f"{served_name(sv)}: latency against request rate")
    ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _serving_html(sv: dict, png: str) -> list[str]:
    from overdrive.report.page import img_tag, table

    e = html.escape
    rows = []
    for name, en in sv["engines"].items():
        if en["status"] != "ok":
            rows.append([e(name), "-", "-", e(f"{en['status']}: {en.get('reason')}")])
            continue
        best = en.get("best")
        rows.append([e(f"{name} ({en['label']})"), f"{best['rate']:,.0f}{e(_holds(best))}" if best else e(_withheld(en)),
                     e(_setting_text(best["config"])) if best else "-",
                     e(f"max |Δ| vs eager {en['max_abs_error_vs_eager']:.1g}")
                     if en.get("max_abs_error_vs_eager") is not None else ""])
    what = served_name(sv)
    title = "Click model" if what == "click model" else what
    return [f"<h2>{e(title)} under a request stream (SLO p99 &le; {sv['slo_ms']:g} ms)</h2>",
            f"<p><b>{e(sv['text'])}</b></p>",
            f"<p class='meta'>{e(_load_text(sv.get('load')))}; {e(_floor_text(sv.get('noise_floor')))}; threads "
            f"per engine {e(str(sv.get('threads_why', sv.get('threads'))))}. "
            f"{e(sv['note'])}.</p>",
            table(["engine", "highest rate under the SLO (req/s)", "batcher settings (config.pbtxt)", "outputs"], rows,
                  wrap=(1, 2)),
            img_tag(png, "latency against request rate", "p99 end-to-end latency per request rate, SLO dashed")]


def latency_next_step(r: dict, out_dir: str) -> str:
    """HTML: export the click model sized to the batch that met the SLO (the export reads this folder)."""
    ws = r.get("workloads") or {}
    best = (ws.get("recsys") or {}).get("best") or {}
    ort = ((r.get("serving") or {}).get("engines") or {}).get("onnxruntime") or {}
    if ort.get("best"):
        cmd = export_command(r["serving"], out_dir)
        return (f"Next step: serve the ONNX model with ONNX Runtime at {ort['best']['rate']:,.0f} req/s: "
                f"<code>{html.escape(cmd)}</code> writes a Triton repository whose config.pbtxt carries "
                f"{html.escape(_setting_text(ort['best']['config']))}.")
    sv = r.get("serving")
    if sv and ((sv.get("model_identity") or {}).get("given") or not best.get("batch")):
        # A bench of the user's model (or of the click model under a stream only) that gave ONNX Runtime no
        # setting: say why, and how to export that same model without one.
        why = ort.get("withheld") or sv.get("withheld") or (
            "no setting met the SLO" if ort.get("status") == "ok" else f"ONNX Runtime {ort.get('status') or 'not measured'}")
        return (f"Next step: no ONNX Runtime setting to export for {html.escape(served_name(sv))} ({html.escape(why)}). "
                "Re-run the bench on a quieter host (or with a larger <code>--slo-ms</code>), or export with a batch "
                f"you choose: <code>{html.escape(export_command(sv, None))}</code>.")
    if best.get("batch"):
        cmd = export_command(None, out_dir)
        return (f"Next step: serve {html.escape(str(best.get('mode')))} at batch {best['batch']}: "
                f"<code>{html.escape(cmd)}</code> writes model.pt2 and a Triton repository with that max batch.")
    return (f"Next step: no batch met p99 &le; {r['slo_ms']:g} ms here — re-run with a larger "
            f"<code>--slo-ms</code> or on the GPU you serve from, then <code>{html.escape(export_command(sv, 'DIR'))}"
            "</code>.")


def _answered(r: dict) -> bool:
    """Whether the page's first line is a result: a serving verdict given, or a fixed-batch best found."""
    sv = r.get("serving") or {}
    return (bool(sv) and sv.get("verdict") == "given") or any(
        (w.get("best") or {}).get("batch") for w in (r.get("workloads") or {}).values())


def write_latency_report(r: dict, out_dir: str) -> list[str]:
    """results.json was written by the caller; here the PNG and report.html."""
    from overdrive.report.page import img_tag, page, rec_block, table

    os.makedirs(out_dir, exist_ok=True)
    png = os.path.join(out_dir, "latency_p99.png")
    if r["workloads"]:
        _plot(r, png)
    e = html.escape
    rec = (r.get("recommendation") or {}).get("text") or "; ".join(w["best"]["text"] for w in r["workloads"].values())
    body = [f"<h1>overdrive bench --workload inference</h1><p class='meta'>{e(r['device'])} · SLO p99 &le; "
            f"{r['slo_ms']:g} ms · {e(r['created'])} · commit {e(str(r.get('git_commit')))}</p>",
            *rec_block(rec, latency_next_step(r, out_dir), answered=_answered(r))]
    written = [png] if r["workloads"] else []
    if r.get("serving"):
        rate_png = os.path.join(out_dir, "latency_vs_rate.png")
        _plot_rate(r["serving"], rate_png)
        body += _serving_html(r["serving"], rate_png)
        written.append(rate_png)
    for key, w in r["workloads"].items():
        bs = _batches(w)
        body.append(f"<h2>{e(_TITLES.get(key, key))}: {e(w['model'])}</h2><p><b>{e(w['best']['text'])}</b></p>")
        rows = []
        for mode, md in w["modes"].items():
            row = [e(mode)]
            for b in bs:
                st = md["batches"].get(b, {})
                row.append(f"{_ms(st['p50'])} / <span class='{'bad' if _verdict(st, r['slo_ms']) == 'misses' else ''}'>"
                           f"{e(_ms(st['p99'], st.get('n')))}</span>" if "p50" in st else e(st.get("status", "-")))
            row.append(str(md.get("slo_batch") or e(md.get("reason", "none"))))
            rows.append(row)
        body.append(table(["mode", *(f"batch {b} p50/p99 ms" for b in bs), "largest batch in SLO"], rows))
    if r["workloads"]:
        body.append(img_tag(png, "p99 latency", "p99 latency per batch size, SLO dashed"))
    path = os.path.join(out_dir, "report.html")
    write_atomic(path, page(f"overdrive latency — {r['device']}", body))
    return [*written, path]
