"""Plan output: the ranked table, the reasons, the sweep, and the memory-breakdown PNG."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

__all__ = ["render_plan", "render_sweep", "write_breakdown_png"]


def render_plan(r: dict, console: Console, *, limit: int = 15) -> None:
    m = r["model"]
    t = Table(title=f"overdrive plan — {m['name']} ({r['params_b']:.2f}B params) on {r['nodes']}x{r['gpus_per_node']} "
                    f"{r['gpu']}, seq {r['seq']}" + (f", global batch {r['global_batch']}" if r["global_batch"] else ""),
              title_justify="left")
    for col in ("#", "precision", "sharding", "checkpointing", "micro-batch", "memory/GPU", "headroom", "step s",
                "tokens/s/GPU", "MFU"):
        t.add_column(col)
    fitting = [c for c in r["candidates"] if c["fits"]]
    for i, c in enumerate(fitting[:limit], 1):
        t.add_row(str(i), c["precision"], c["sharding"], c["checkpointing"], str(c["micro_batch"]),
                  f"{c['memory_gib']:.1f} GiB", f"{c['headroom_gib']:.1f} GiB", f"{c['step_s']:.3f}",
                  f"{c['tokens_per_s_per_gpu']:,.0f}", f"{100 * c['mfu']:.0f}%")
    console.print(t)
    n_out = len(r["candidates"]) - len(fitting)
    console.print(f"{len(fitting)} configurations fit ({min(limit, len(fitting))} shown); {n_out} do not.")
    if r["top"]:
        console.print(f"[bold]{escape(r['why'])}[/]")
    else:
        console.print("[bold red]Nothing fits.[/] What would:")
        for s in r["suggestions"]:
            console.print(f"  - {escape(s)}")
    console.print(f"[dim]Efficiency {100 * r['efficiency']:.0f}% of peak (calibration: docs/plan-validation.md); "
                  "memory = params + grads + optimizer + activations (incl. logits) + other (FSDP buffers, "
                  "CUDA context, fragmentation).[/]")


def render_sweep(rows: list[dict], console: Console) -> None:
    t = Table(title="overdrive plan --sweep — one node of 8 GPUs, FSDP, full checkpointing, micro-batch 1: "
                    "the longest sequence that fits", title_justify="left")
    for col in ("model", "params", "GPU", "precision", "longest seq", "tokens/s/GPU", "MFU", "memory/GPU"):
        t.add_column(col)
    for r in rows:
        t.add_row(r["model"], f"{r['params_b']:.1f}B", r["gpu"], r["precision"],
                  f"{r['longest_seq']:,}" if r["longest_seq"] else "does not fit",
                  f"{r['tokens_per_s_per_gpu']:,.0f}" if r["tokens_per_s_per_gpu"] else "-",
                  f"{100 * r['mfu']:.0f}%" if r["mfu"] else "-",
                  f"{r['memory_gib']:.0f} GiB" if r["memory_gib"] else "-")
    console.print(t)


def write_breakdown_png(r: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    c = r["top"] or min(r["candidates"], key=lambda x: x["memory_gib"])
    parts = c["breakdown"]
    fig, ax = plt.subplots(figsize=(7, 2.6))
    left = 0.0
    for k, v in parts.items():
        ax.barh([0], [v], left=left, label=f"{k} {v:.1f}")
        left += v
    from overdrive.env import gpu_by_key

    cap = gpu_by_key(r["gpu"]).mem_gib
    ax.axvline(cap, color="k", ls="--", lw=1)
    ax.text(cap, 0.45, f" {r['gpu']} {cap:.0f} GiB", va="center")
    ax.set_yticks([])
    ax.set_xlabel("GiB per GPU")
    ax.set_title(f"{r['model']['name']}: {c['precision']} · {c['sharding']} · AC {c['checkpointing']} · "
                 f"mb {c['micro_batch']} · seq {c['seq']}" + ("" if c["fits"] else " (does not fit)"), fontsize=9)
    ax.legend(ncol=5, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.35))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
