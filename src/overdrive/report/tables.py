"""Console tables for bench results (rich), and the comparison of two runs."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from overdrive.recipes.labels import low_precision_format
from overdrive.bench.workloads import Workload, suite_title, workload_of
from overdrive.results.bench import throughput
from overdrive.results.records import BenchRecord, ConfigRecord
from overdrive.bench.workloads.gpt import mfu_cell
from overdrive.report.advice import bench_record, next_step, precision_note
from overdrive.report.compare import LEGEND, compare_rows, relabelled, verdict

__all__ = ["render_bench", "render_compare", "fmt_ms", "mfu_cell", "emulated_note", "rate_text", "bench_workload",
           "bench_notes", "measured_note", "speed_text"]

_SCALES = {"TB/s": ("TB/s", "GB/s", "MB/s", "kB/s"), "TFLOP/s": ("TFLOP/s", "GFLOP/s", "MFLOP/s", "kFLOP/s")}


def rate_text(rate: float | None, unit: str) -> str:
    """A micro-benchmark rate in the unit that gives it three significant digits: a CPU's AdamW step at
    0.0004 TB/s reads 0.4 GB/s (it printed 0.000 TB/s)."""
    if rate is None:
        return "-"
    units = _SCALES.get(unit, (unit,))
    x, i = float(rate), 0
    while 0 < abs(x) < 1 and i + 1 < len(units):
        x, i = x * 1000, i + 1
    return f"{x:.3g} {units[i]}"


def _e(v) -> str:
    """Any value from results.json as literal console text: `[/b]` in a device name or path is not markup."""
    return escape(str(v))


def fmt_ms(s: dict | None) -> str:
    if not s or s.get("median") is None:
        return "-"
    if s.get("p10") is None or s.get("p90") is None:  # too few steps for a spread
        return f"{s['median']:.1f}"
    return f"{s['median']:.1f} [{s['p10']:.1f}–{s['p90']:.1f}]"


def _x(v, ci=None) -> str:
    if v is None:
        return "-"
    return f"{v:.2f}x" + (f" [{ci[0]:.2f}–{ci[1]:.2f}]" if ci and ci[0] != ci[1] else "")


def _pct(v) -> str:
    return "-" if v is None else f"{v:+.1f}%"


def _clip(text: str, n: int = 80) -> str:
    """At most n characters, cut at a word with an ellipsis (never mid-word)."""
    text = " ".join(text.split())
    if len(text) <= n:
        return text
    return text[:n].rsplit(" ", 1)[0].rstrip(",;:(") + " …"


def emulated_note(cfg: ConfigRecord | dict) -> str:
    """Why an emulated configuration shows no speed, naming the format that is emulated."""
    if not isinstance(cfg, ConfigRecord):
        cfg = ConfigRecord(name=cfg["name"], label=cfg["name"], status="ok", reason=None, precision="?", emulated=True,
                           baseline=False, safe=None, also=(), models={},
                           fp8_scaling=(cfg.get("resolved") or {}).get("fp8_scaling"))
    fmt = low_precision_format(cfg.fp8_scaling)
    if fmt != "fp8":
        return (f"{cfg.name}: {fmt.upper()} is emulated here (its GEMMs need SM 10.x): "
                "loss parity only, never a speedup")
    return f"{cfg.name}: FP8 is emulated here (no FP8 tensor cores): loss parity only, never a speedup"


def bench_notes(rec: BenchRecord) -> list[str]:
    """The notes under the table: stopped, not assessed, unsafe, emulated (console and page)."""
    cs = rec.configs
    notes = [f"{c.name}: {c.reason}" for c in cs if c.status == "stopped"]
    notes += [f"{c.name}: {c.not_assessed_reason}" for c in cs if c.not_assessed_reason and c.status == "ok"]
    notes += [f"{c.name}: UNSAFE — {c.unsafe_reason}" for c in cs if c.unsafe_reason]
    return notes + [emulated_note(c) for c in cs if c.emulated]


def measured_note(rec: BenchRecord) -> str | None:
    """How it was measured: the A/A control's note and the threads per worker."""
    meas = [x for x in ((rec.noise.note if rec.noise else None), _threads_note(rec.threads)) if x]
    return "; ".join(meas) or None


def _threads_note(t: dict | None) -> str | None:
    if not t:
        return None
    load = f", load {t['load_1min']:.1f}" if t.get("load_1min") is not None else ""
    how = "--threads" if t.get("source") == "user" else f"{t['cores']} cores, {t['active_workers']} stepping at once{load}"
    return f"{t['threads']} torch thread(s) per worker ({how})"


def bench_workload(rec: BenchRecord) -> Workload:
    """The workload whose columns the table shows; a generic one for a task this version does not know."""
    return workload_of(rec.doc) or Workload()


def speed_text(cfg: ConfigRecord, m: dict) -> str:
    if cfg.emulated:
        return "quality only"
    return cfg.stopped_words if cfg.status == "stopped" else _x(m["speedup"], m["speedup_ci"])


def safe_text(cfg: ConfigRecord) -> str:
    return "not assessed" if cfg.safe is None else "[green]yes[/]" if cfg.safe else "[red]UNSAFE[/]"


def _bench_table(rec: BenchRecord) -> Table:
    w = bench_workload(rec)
    t = Table(title=_e(f"overdrive bench — {rec.device} — {suite_title(rec.doc)}"), title_justify="left")
    for col in ("config", "model", "step ms (median [p10–p90])", w.rate_unit, "speedup vs baseline", w.quality_header,
                "peak mem", "mem saved", w.loss_header, "safe"):
        t.add_column(escape(col), overflow="fold")
    for cfg in rec.configs:
        emu = " (emulated)" if cfg.emulated and "emulated" not in cfg.label else ""
        if cfg.failed:
            t.add_row(_e(cfg.label), "-", f"[red]{_e(cfg.status)}[/]: {_e(cfg.reason)}", "", "", "", "", "", "",
                      "[red]no[/]")
            continue
        mem = f"{cfg.peak_mb:.0f} MB" if cfg.peak_mb is not None else "-"
        for i, role in enumerate(rec.role_order(cfg)):
            m = cfg.models[role]
            rate = throughput(m)[0]
            name = cfg.label + "".join(f" = {a}" for a in cfg.also)
            first = i == 0
            t.add_row(escape(name + emu) if first else "", _e(role), fmt_ms(m["step_ms"]), f"{rate:,.0f}" if rate else "-",
                      speed_text(cfg, m), _e(w.quality_cell(m, cfg.doc)), mem if first else "",
                      _pct(cfg.memory_saved_pct) if first else "", _pct(m["loss_delta_pct"]),
                      safe_text(cfg) if first else "")
    return t


def _micro_table(rec: BenchRecord, c: Console) -> None:
    micro = [r for r in rec.micro if r["status"] == "ok"]
    if not micro:
        return
    mt = Table(title="micro-benchmarks", title_justify="left")
    for col in ("group", "provider", "ms (median [p10–p90])", "rate"):
        mt.add_column(escape(col))
    for r in micro:
        mt.add_row(_e(r["group"]), _e(r["provider"]), fmt_ms(r["ms"]), _e(rate_text(r.get("rate"), r.get("unit", ""))))
    c.print(mt)
    skipped = [r for r in rec.micro if r["status"] != "ok"]
    if skipped:
        c.print("  micro skipped: " + "; ".join(sorted({f"{_e(r['provider'])} ({_e(_clip(str(r['reason'])))})"
                                                        for r in skipped})))


def render_bench(results: BenchRecord | dict, console: Console | None = None) -> None:
    rec = bench_record(results)
    c = console or Console()
    c.print(_bench_table(rec))
    for n in bench_notes(rec):
        c.print(f"  note: {escape(n)}")
    _micro_table(rec, c)
    meas = measured_note(rec)
    if meas:
        c.print("  measured: " + escape(meas))
    # The verdict without the file's own "Apply:", then the next step rebuilt from the winner's recipe
    # (the workload's apply_hint): said once, and whole even when an older writer's hint dropped part of it.
    c.print(f"[bold]{escape(rec.recommendation.verdict)}[/]")
    c.print(escape(next_step(rec).text))
    why = precision_note(rec)
    if why:
        c.print(f"[yellow]{escape(why)}[/]")


def render_compare(a: dict, b: dict, console: Console | None = None) -> None:
    """Two runs side by side, one row per (configuration, what ran, model): see report.compare."""
    c = console or Console()
    t = Table(title=_e(f"A: {a.get('device')} ({a.get('created')})  vs  B: {b.get('device')} ({b.get('created')})"),
              title_justify="left")
    for col in ("config", "ran as", "model", "A status", "B status", "A step ms", "B step ms", "B/A time", "A loss",
                "B loss"):
        t.add_column(col, overflow="fold")
    rows = compare_rows(a, b)
    for r in rows:
        t.add_row(_e(r["config"]), _e(r["ran"]), _e(r["model"]), _e(r["a_status"]), _e(r["b_status"]),
                  fmt_ms(r["a_ms"]) if r["a_status"] != "absent" else "absent",
                  fmt_ms(r["b_ms"]) if r["b_status"] != "absent" else "absent",
                  f"{r['ratio']:.2f}" if r["ratio"] is not None else "-",
                  f"{r['a_loss']:.3f}" if r["a_loss"] is not None else "-",
                  f"{r['b_loss']:.3f}" if r["b_loss"] is not None else "-")
    c.print(t)
    c.print(f"[dim]{escape(LEGEND)}[/]")
    for n in relabelled(rows):
        c.print(f"  note: {escape(n)}")
    c.print(f"[bold]{escape(verdict(a, b, rows))}[/]")
    c.print(f"A: {escape(a['recommendation']['text'])}")
