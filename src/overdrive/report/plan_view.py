"""Plan output: the ranked table, the reasons, the sweep (table, Markdown, plot), the memory-breakdown PNG."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

__all__ = ["fmt_params", "fmt_step", "render_plan", "render_sweep", "sweep_markdown", "write_breakdown_png", "write_sweep_png", "breakdown_figure"]


def fmt_params(params_b: float) -> str:
    """A parameter count readable at any size: 13.02B, 3.3M, 12.5K (a tiny model is not "0.00B")."""
    n = params_b * 1e9
    for div, unit, nd in ((1e9, "B", 2), (1e6, "M", 1), (1e3, "K", 1)):
        if n >= div:
            return f"{n / div:.{nd}f}{unit}"
    return f"{n:.0f}"


def fmt_step(seconds: float) -> str:
    """A step time with its unit, three significant figures at any scale (a 1 ms step is not "0.000")."""
    if seconds >= 1:
        return f"{seconds:.3g} s" if seconds < 100 else f"{seconds:.0f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds * 1e6:.3g} µs"


def _headroom(c: dict) -> str:
    """Headroom, marked when it is below the safety margin the ranking asked for (ranked after the rest)."""
    txt = f"{c['headroom_gib']:.1f} GiB"
    return txt if c.get("margin_ok", True) else f"[yellow]{txt} (tight)[/]"


def assumed(r: dict) -> str:
    """The figures this plan assumed where they moved its pick: the network across nodes (no --inter-gbs, more
    than one node) and the host's µs per eager op (no --host-us, the pick host-bound); '' when neither."""
    top, out = r.get("top") or {}, []
    if r.get("nodes", 1) > 1 and r.get("inter_gbs_source") != "--inter-gbs":
        out.append(f"the network across nodes, {r['inter_gbs']:g} GB/s per GPU ({r['inter_gbs_source']}; "
                   "--inter-gbs gives yours)")
    if top.get("times_s", {}).get("host_exposed") and r.get("host_us_source") != "--host-us":
        out.append(f"the host's {r['host_us']:g} µs per eager op, which bounds the pick ({r['host_us_source']}; "
                   "--host-us gives yours)")
    return "Assumed, not given: " + "; ".join(out) + "." if out else ""


def render_plan(r: dict, console: Console, *, limit: int = 15) -> None:
    m = r["model"]
    par = "".join(f" {k}{r[k]}" for k in ("tp", "pp", "cp") if r.get(k, 1) > 1)
    fitting = [c for c in r["candidates"] if c["fits"]]
    # The model's name comes from the user's file: literal text, never console markup.
    t = Table(title=escape(f"overdrive plan — {m['name']} ({fmt_params(r['params_b'])} params) on {r['nodes']}x"
                           f"{r['gpus_per_node']} {r['gpu']} ({r['capacity_gib']:.1f} GiB){par}, seq {r['seq']}"
                           + (f" of {r['doc_len']}-token documents" if 0 < r.get("doc_len", 0) < r["seq"] else "")
                           + (f", {r['stack']} stack" if r.get("stack", "pytorch") != "pytorch" else "")
                           + (f", vpp {fitting[0]['vpp']}" if r.get("pp", 1) > 1 and fitting else "")
                           + (f", global batch {r['global_batch']}" if r["global_batch"] else "")),
              title_justify="left")
    for col in ("#", "precision", "sharding", "checkpointing", "micro-batch", "memory/GPU", "headroom", "step",
                "tokens/s/GPU", "MFU"):
        t.add_column(col)
    fitting = [c for c in r["candidates"] if c["fits"]]
    for i, c in enumerate(fitting[:limit], 1):
        t.add_row(str(i), escape(c["label"]), escape(c["sharding"]), escape(c["checkpointing"]),
                  str(c["micro_batch"]),
                  f"{c['memory_gib']:.1f} GiB", _headroom(c), fmt_step(c["step_s"]),
                  f"{c['tokens_per_s_per_gpu']:,.0f}", f"{100 * c['mfu']:.0f}%")
    console.print(t)
    n_out = len(r["candidates"]) - len(fitting)
    console.print(f"{len(fitting)} configurations fit ({min(limit, len(fitting))} shown); {n_out} do not.")
    tight = sum(not c.get("margin_ok", True) for c in fitting)
    if tight and r.get("min_headroom_gib") is not None:
        console.print(f"{tight} of them leave less than the {r['min_headroom_gib']:.1f} GiB safety margin "
                      "(--min-headroom) free: ranked after the rest, marked tight", markup=False)
    for n in r.get("notes", []):
        console.print(f"[yellow]{escape(n)}[/]")
    if assumed(r):
        console.print(f"[yellow]{escape(assumed(r))}[/]")
    if r["top"]:
        console.print(f"[bold]{escape(r['why'])}[/]")
    else:
        console.print("[bold red]Nothing fits.[/] What would:")
        for s in r["suggestions"]:
            console.print(f"  - {escape(s)}")
    console.print("[dim]Memory = params + grads + optimizer + activations (incl. logits) + other (FSDP buffers, TE "
                  "weight cache, CUDA context, NCCL buffers, fragmentation); time = per-op roofline + communication (--explain shows each term). "
                  "Errors against published runs: docs/plan-validation.md.[/]")


def _fmt_row(r: dict) -> list[str]:
    return [r["model"], f"{r['params_b']:.1f}B", r["gpu"], r["precision"], r["checkpointing"],
            f"{r['longest_seq']:,}" if r["longest_seq"] else "does not fit",
            f"{r['tokens_per_s_per_gpu_8k']:,.0f}" if r.get("tokens_per_s_per_gpu_8k") else "does not fit",
            f"{r['tokens_per_s_per_gpu']:,.0f}" if r["tokens_per_s_per_gpu"] else "-",
            f"{100 * r['mfu']:.0f}%" if r["mfu"] else "-", f"{r['memory_gib']:.0f} GiB" if r["memory_gib"] else "-"]


_SWEEP_COLS = ("model", "params", "GPU", "precision", "checkpointing", "longest seq", "tokens/s/GPU at 8K",
               "tokens/s/GPU at longest", "MFU at longest", "memory/GPU")


def render_sweep(rows: list[dict], console: Console) -> None:
    t = Table(title="overdrive plan --sweep — one node of 8 GPUs, FSDP, micro-batch 1: the longest sequence that "
                    "fits, and the speed at 8K tokens and there", title_justify="left")
    for col in _SWEEP_COLS:
        t.add_column(col)
    for r in rows:
        t.add_row(*(escape(str(v)) for v in _fmt_row(r)))
    console.print(t)


def sweep_markdown(rows: list[dict]) -> str:
    """One line per model x GPU: the longest sequence without and with full checkpointing, and tokens/s per
    GPU at 8K tokens with full checkpointing for each precision (the precision does not change memory)."""
    precs = list(dict.fromkeys(r["precision"] for r in rows))
    acs = list(dict.fromkeys(r["checkpointing"] for r in rows))
    ac_t = "full" if "full" in acs else acs[-1]
    head = (["model", "params", "8x GPU"] + [f"longest seq, AC {a}" for a in acs]
            + [f"{p} tok/s/GPU @8K (AC {ac_t})" for p in precs])
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for key in dict.fromkeys((r["model"], r["gpu"]) for r in rows):
        sel = {(r["precision"], r["checkpointing"]): r for r in rows if (r["model"], r["gpu"]) == key}
        first = next(iter(sel.values()))
        cells = [key[0], f"{first['params_b']:.1f}B", key[1]]
        cells += [f"{sel[(precs[0], a)]['longest_seq']:,}" if sel[(precs[0], a)]["longest_seq"] else "does not fit"
                  for a in acs]
        cells += [f"{sel[(p, ac_t)]['tokens_per_s_per_gpu_8k']:,.0f}" if sel[(p, ac_t)]["tokens_per_s_per_gpu_8k"]
                  else "does not fit" for p in precs]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def write_sweep_png(rows: list[dict], path: str) -> None:
    """Per GPU: the longest sequence that fits (top; the precision does not change it, activations are
    kept in 16 bits) and tokens/s per GPU at 8K tokens with full checkpointing (bottom), by model."""
    plt = _plt()
    gpus = list(dict.fromkeys(r["gpu"] for r in rows))
    models = list(dict.fromkeys(r["model"] for r in rows))
    precs = list(dict.fromkeys(r["precision"] for r in rows))
    acs = list(dict.fromkeys(r["checkpointing"] for r in rows))
    fig, axes = plt.subplots(2, len(gpus), figsize=(5.5 * len(gpus), 7), sharey="row", squeeze=False)
    x = range(len(models))

    def pick(g, m, p, ac, key):
        return next((r[key] or 0) for r in rows if (r["gpu"], r["model"], r["precision"], r["checkpointing"])
                    == (g, m, p, ac))

    for col, g in enumerate(gpus):
        top, bot = axes[0][col], axes[1][col]
        w = 0.8 / len(acs)
        for j, ac in enumerate(acs):
            ys = [pick(g, m, precs[0], ac, "longest_seq") / 1024 for m in models]
            bars = top.bar([i + (j - (len(acs) - 1) / 2) * w for i in x], ys, w, label=f"checkpointing {ac}")
            top.bar_label(bars, [f"{y:.0f}K" for y in ys], fontsize=7)
        top.set_title(f"8x {g}, FSDP, micro-batch 1", fontsize=10)
        top.set_yscale("log", base=2)
        w = 0.8 / len(precs)
        ac = "full" if "full" in acs else acs[-1]
        for j, p in enumerate(precs):
            ys = [pick(g, m, p, ac, "tokens_per_s_per_gpu_8k") for m in models]
            bot.bar([i + (j - (len(precs) - 1) / 2) * w for i in x], ys, w, label=p)
        bot.set_yscale("log")
        for ax in (top, bot):
            ax.set_xticks(list(x), models, fontsize=8)
            ax.grid(axis="y", alpha=0.3)
    axes[0][0].set_ylabel("longest sequence that fits (tokens)")
    axes[1][0].set_ylabel(f"tokens/s per GPU at 8K, checkpointing {ac}")
    axes[0][-1].legend(fontsize=8, loc="lower left")
    axes[1][-1].legend(fontsize=8, loc="lower left")
    fig.suptitle("overdrive plan --sweep (a model, see docs/plan-validation.md for its errors)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_breakdown_png(r: dict, path: str) -> None:
    plt = _plt()
    fig = breakdown_figure(r)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def breakdown_figure(r: dict):
    """The memory breakdown of the top pick (or the leanest candidate) against the GPU's capacity."""
    plt = _plt()
    c = r["top"] or min(r["candidates"], key=lambda x: x["memory_gib"])
    parts = c["breakdown"]
    cap = r["capacity_gib"]
    fig, ax = plt.subplots(figsize=(7.5, 2.8))
    left = 0.0
    for k, v in parts.items():
        ax.barh([0], [v], left=left, label=f"{k} {v:.1f}")
        left += v
    ax.axvline(cap, color="k", ls="--", lw=1)
    # The label sits inside the axes, right-aligned to the line, so it is never cut at the edge.
    ax.set_xlim(0, max(cap, left) * 1.05)
    ax.text(cap, 0.45, f"{r['gpu']} {cap:.0f} GiB ", va="center", ha="right", fontsize=8)
    ax.set_yticks([])
    ax.set_xlabel("GiB per GPU")
    ax.set_title(f"{r['model']['name']}: {c['label']} · {c['sharding']} · AC {c['checkpointing']} · "
                 f"mb {c['micro_batch']} · seq {c['seq']}" + ("" if c["fits"] else " (does not fit)"), fontsize=9)
    ax.legend(ncol=5, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.35))
    fig.tight_layout()
    return fig
