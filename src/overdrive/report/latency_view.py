"""Latency results: a table per workload, a p99-vs-batch plot with the SLO line, and the HTML page."""

from __future__ import annotations

import html
import os

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from overdrive.io import write_atomic

__all__ = ["render_latency", "write_latency_report"]

_TITLES = {"recsys": "click model", "gpt_prefill": "GPT prefill", "gpt_decode": "GPT decode (one token)"}


def _batches(w: dict) -> list[str]:
    seen: list[str] = []
    for md in w["modes"].values():
        for b in md["batches"]:
            if b not in seen:
                seen.append(b)
    return sorted(seen, key=int)


def render_latency(r: dict, console: Console) -> None:
    slo = r["slo_ms"]
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
                    style = "green" if st["p99"] <= slo else "red"
                    cells.append(f"{st['p50']:.2f} / [{style}]{st['p99']:.2f}[/]")
            slo_txt = f"{md['slo_batch']} ({md['slo_throughput']:,.0f} {w['unit']})" if md.get("slo_batch") else "none"
            t.add_row(escape(str(mode)), *cells, escape(slo_txt))
        console.print(t)
        console.print(f"  [bold]{escape(str(w['best']['text']))}[/]")


def _plot(r: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ws = r["workloads"]
    fig, axes = plt.subplots(1, len(ws), figsize=(5 * len(ws), 3.8), squeeze=False)
    for ax, (key, w) in zip(axes[0], ws.items()):
        for mode, md in w["modes"].items():
            pts = [(int(b), st["p99"]) for b, st in md["batches"].items() if "p99" in st]
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


def latency_next_step(r: dict, out_dir: str) -> str:
    """HTML: export the click model sized to the batch that met the SLO (the export reads this folder)."""
    ws = r.get("workloads") or {}
    best = (ws.get("recsys") or {}).get("best") or {}
    if best.get("batch"):
        cmd = f"overdrive export --model recsys --slo-from {out_dir} --out export/"
        return (f"Next step: serve {html.escape(str(best.get('mode')))} at batch {best['batch']}: "
                f"<code>{html.escape(cmd)}</code> writes model.pt2 and a Triton repository with that max batch.")
    return (f"Next step: no batch met p99 &le; {r['slo_ms']:g} ms here — re-run with a larger "
            "<code>--slo-ms</code> or on the GPU you serve from, then <code>overdrive export --model recsys "
            f"--slo-from DIR</code>.")


def write_latency_report(r: dict, out_dir: str) -> list[str]:
    """results.json was written by the caller; here the PNG and report.html."""
    from overdrive.report.page import img_tag, page, rec_block, table

    os.makedirs(out_dir, exist_ok=True)
    png = os.path.join(out_dir, "latency_p99.png")
    _plot(r, png)
    e = html.escape
    rec = (r.get("recommendation") or {}).get("text") or "; ".join(w["best"]["text"] for w in r["workloads"].values())
    body = [f"<h1>overdrive bench --workload inference</h1><p class='meta'>{e(r['device'])} · SLO p99 &le; "
            f"{r['slo_ms']:g} ms · {e(r['created'])} · commit {e(str(r.get('git_commit')))}</p>",
            *rec_block(rec, latency_next_step(r, out_dir))]
    for key, w in r["workloads"].items():
        bs = _batches(w)
        body.append(f"<h2>{e(_TITLES.get(key, key))}: {e(w['model'])}</h2><p><b>{e(w['best']['text'])}</b></p>")
        rows = []
        for mode, md in w["modes"].items():
            row = [e(mode)]
            for b in bs:
                st = md["batches"].get(b, {})
                row.append(f"{st['p50']:.2f} / <span class='{'' if st['p99'] <= r['slo_ms'] else 'bad'}'>"
                           f"{st['p99']:.2f}</span>" if "p50" in st else e(st.get("status", "-")))
            row.append(str(md.get("slo_batch") or e(md.get("reason", "none"))))
            rows.append(row)
        body.append(table(["mode", *(f"batch {b} p50/p99 ms" for b in bs), "largest batch in SLO"], rows))
    body.append(img_tag(png, "p99 latency", "p99 latency per batch size, SLO dashed"))
    path = os.path.join(out_dir, "report.html")
    write_atomic(path, page(f"overdrive latency — {r['device']}", body))
    return [png, path]
