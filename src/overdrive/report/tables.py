"""Console tables for bench results (rich), and the comparison of two runs."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from overdrive.bench.results import suite_title, throughput

__all__ = ["render_bench", "render_compare", "fmt_ms"]


def fmt_ms(s: dict | None) -> str:
    if not s or s.get("median") is None:
        return "-"
    return f"{s['median']:.1f} [{s['p10']:.1f}–{s['p90']:.1f}]"


def _x(v, ci=None) -> str:
    if v is None:
        return "-"
    return f"{v:.2f}x" + (f" [{ci[0]:.2f}–{ci[1]:.2f}]" if ci and ci[0] != ci[1] else "")


def _pct(v) -> str:
    return "-" if v is None else f"{v:+.1f}%"


def _mfu(m: dict, precision: str) -> str:
    if m.get("mfu_bf16_peak") is None:
        return "-" if m.get("tflops") is None else f"{m['tflops'] * 1e3:.0f} GF/s"
    s = f"{100 * m['mfu_bf16_peak']:.1f}%"
    if precision == "fp8" and m.get("mfu_fp8_peak") is not None:
        s += f" ({100 * m['mfu_fp8_peak']:.1f}% of FP8)"
    return s


def render_bench(results: dict, console: Console | None = None) -> None:
    c = console or Console()
    suite = results["suite"]
    gpt = suite.get("task", "gpt") == "gpt"
    t = Table(title=f"overdrive bench — {results['device']} — {suite_title(results)}", title_justify="left")
    for col in ("config", "model", "step ms (median [p10–p90])", "tokens/s" if gpt else "examples/s",
                "speedup vs baseline",
                "MFU vs BF16 peak (CPU: achieved)" if gpt else "held-out AUC", "peak mem", "mem saved",
                "loss Δ" if gpt else "log-loss Δ", "safe"):
        t.add_column(escape(col), overflow="fold")
    for cfg in results["configs"]:
        emu = " (emulated)" if cfg["emulated"] else ""
        if cfg["status"] in ("failed", "oom", "crashed", "unavailable"):
            t.add_row(escape(cfg.get("label", cfg["name"])), "-", f"[red]{cfg['status']}[/]: {escape(cfg['reason'])}", "", "", "", "",
                      "", "", "[red]no[/]")
            continue
        mem = f"{cfg['peak_mb']:.0f} MB" if cfg.get("peak_mb") is not None else "-"
        for i, role in enumerate(cfg["models"]):
            m = cfg["models"][role]
            rate = throughput(m)[0]
            quality = ("-" if cfg["emulated"] else _mfu(m, cfg["precision"])) if gpt else (
                f"{m['auc']:.4f}" if m.get("auc") is not None else "-")
            speed = "quality only" if cfg["emulated"] else _x(m["speedup"], m["speedup_ci"])
            if cfg["status"] == "stopped":
                speed = "stopped early"
            safe = ("not assessed" if cfg["safe"] is None else "[green]yes[/]" if cfg["safe"] else "[red]UNSAFE[/]") \
                if i == 0 else ""
            name = cfg.get("label", cfg["name"]) + "".join(f" = {a['label']}" for a in cfg.get("also", []))
            t.add_row(escape(name + emu) if i == 0 else "", role, fmt_ms(m["step_ms"]),
                      f"{rate:,.0f}" if rate else "-", speed, quality, mem if i == 0 else "",
                      _pct(cfg.get("memory_saved_pct"))
                      if i == 0 else "", _pct(m["loss_delta_pct"]), safe)
    c.print(t)
    notes = [f"{cfg['name']}: {cfg['reason']}" for cfg in results["configs"] if cfg["status"] == "stopped"]
    notes += [f"{cfg['name']}: {cfg['not_assessed_reason']}" for cfg in results["configs"]
              if cfg.get("not_assessed_reason") and cfg["status"] == "ok"]
    notes += [f"{cfg['name']}: UNSAFE — {cfg['unsafe_reason']}" for cfg in results["configs"] if cfg.get("unsafe_reason")]
    notes += [f"{cfg['name']}: FP8 is emulated here (no FP8 tensor cores): loss parity only, never a speedup"
              for cfg in results["configs"] if cfg["emulated"]]
    for n in notes:
        c.print(f"  note: {escape(n)}")
    micro = [r for r in results.get("micro", []) if r["status"] == "ok"]
    if micro:
        mt = Table(title="micro-benchmarks", title_justify="left")
        for col in ("group", "provider", "ms (median [p10–p90])", "rate"):
            mt.add_column(escape(col))
        for r in micro:
            rate = "-" if r.get("rate") is None else f"{r['rate']:.3f} {r['unit']}"
            mt.add_row(r["group"], r["provider"], fmt_ms(r["ms"]), rate)
        c.print(mt)
        skipped = [r for r in results.get("micro", []) if r["status"] != "ok"]
        if skipped:
            c.print("  micro skipped: " + "; ".join(sorted({f"{r['provider']} ({escape(r['reason'][:70])})"
                                                            for r in skipped})))
    c.print(f"[bold]{escape(results['recommendation']['text'])}[/]")


def render_compare(a: dict, b: dict, console: Console | None = None) -> None:
    """Two runs side by side: per configuration and model, A vs B step time and loss."""
    c = console or Console()
    t = Table(title=f"A: {a['device']} ({a['created']})  vs  B: {b['device']} ({b['created']})", title_justify="left")
    for col in ("config", "model", "A step ms", "B step ms", "B/A time", "A loss", "B loss"):
        t.add_column(col)
    # Rows match on what ran (the label), not the requested name: A's "fp8 → bf16" fallback and
    # B's emulated fp8 are different things, never one row.
    bmap = {cfg.get("label", cfg["name"]): cfg for cfg in b["configs"]}
    for ca in a["configs"]:
        cb = bmap.get(ca.get("label", ca["name"]))
        for role in ca["models"]:
            ma = ca["models"].get(role, {})
            mb = (cb or {}).get("models", {}).get(role, {})
            sa, sb = (ma.get("step_ms") or {}).get("median"), (mb.get("step_ms") or {}).get("median")
            ratio = f"{sb / sa:.2f}" if sa and sb else "-"
            la, lb = ma.get("final_loss"), mb.get("final_loss")
            t.add_row(escape(ca.get("label", ca["name"])), role, fmt_ms(ma.get("step_ms")), fmt_ms(mb.get("step_ms")) if cb else "absent",
                      ratio, f"{la:.3f}" if la else "-", f"{lb:.3f}" if lb else "-")
    c.print(t)
    c.print(f"A: {escape(a['recommendation']['text'])}")
    c.print(f"B: {escape(b['recommendation']['text'])}")
