"""PNG plots of bench results (matplotlib, headless)."""

from __future__ import annotations

import os
import warnings

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

__all__ = ["write_plots", "loss_deltas", "judged_window"]

def _roles(results: dict) -> list[str]:
    return list(results["suite"].get("roles") or ("teacher", "student"))


def _speedup(results: dict, path: str) -> None:
    cfgs = [c for c in results["configs"] if c["status"] == "ok" and not c["emulated"]]
    fig, ax = plt.subplots(figsize=(8, 3.8))
    roles = _roles(results)
    w = 0.8 / len(roles)
    for j, role in enumerate(roles):
        xs, ys, lo, hi = [], [], [], []
        for i, c in enumerate(cfgs):
            m = c["models"][role]
            if m["speedup"] is None:
                continue
            xs.append(i + (j - (len(roles) - 1) / 2) * w)
            ys.append(m["speedup"])
            ci = m["speedup_ci"] or [m["speedup"], m["speedup"]]
            lo.append(m["speedup"] - ci[0])
            hi.append(ci[1] - m["speedup"])
        ax.bar(xs, ys, w, yerr=[lo, hi], capsize=3, label=role)
    ax.axhline(1.0, color="k", lw=0.8, ls="--")
    ax.set_xticks(range(len(cfgs)), [c["name"] for c in cfgs], rotation=20, ha="right")
    ax.set_ylabel("speedup vs baseline (95% CI)")
    ax.set_title(f"Step-time speedup — {results['device']}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _memory(results: dict, path: str) -> None:
    cfgs = [c for c in results["configs"] if c.get("peak_mb") is not None]
    kind = next(((c.get("memory") or {}).get("kind") for c in cfgs), "")
    fig, ax = plt.subplots(figsize=(8, 3.5))
    ax.bar([c["name"] for c in cfgs], [c["peak_mb"] for c in cfgs], color="tab:purple")
    ax.set_ylabel("peak MB (" + ("CUDA max allocated" if kind == "cuda_max_allocated" else
                                 "process peak RSS above start") + ")")
    ax.set_title("Peak memory per configuration (its own process)")
    plt.setp(ax.get_xticklabels(), rotation=20, ha="right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def loss_deltas(results: dict, role: str) -> tuple[list[float], dict[str, list[float]]]:
    """(tolerance bands in %, {configuration: per-step loss minus the baseline's, in % of the baseline's}).

    Same seed and data order for every configuration, so a recipe that changes nothing lies on 0."""
    base = next((c for c in results["configs"] if c.get("baseline")), None)
    ref = (base or {}).get("raw", {}).get(f"{role}_loss") or []
    tols = sorted({(c.get("models", {}).get(role) or {}).get("loss_tolerance_pct") for c in results["configs"]}
                  - {None}, reverse=True)
    out = {}
    for c in results["configs"]:
        ys = c.get("raw", {}).get(f"{role}_loss") or []
        n = min(len(ys), len(ref))
        if c is not base and n:
            out[c["name"] + (" (emulated)" if c.get("emulated") else "")] = [
                100 * (y - r) / abs(r) if r else 0.0 for y, r in zip(ys[:n], ref[:n])]
    return tols, out


def judged_window(deltas: dict[str, list[float]], tols: list[float], steps: int) -> tuple[int, float | None]:
    """(first judged step, 1-based; the y half-range to draw, or None when nothing needs clipping).
    The tail is what the loss-parity verdict averages (last quarter, at least 3 steps)."""
    start = max(1, steps - max(3, steps // 4) + 1)
    tail = [abs(v) for d in deltas.values() for v in d[start - 1:steps]]
    lim = 1.3 * max([*tols, *tail, 1.0])
    return start, lim if any(abs(v) > lim for d in deltas.values() for v in d) else None


def _losses(results: dict, path: str) -> None:
    """Differences against the baseline inside the tolerance band the safety verdict uses: absolute
    curves of near-identical recipes sit on top of each other and hide exactly what matters."""
    roles = _roles(results)
    safe = {c["name"] + (" (emulated)" if c.get("emulated") else ""): c.get("safe", True) for c in results["configs"]}
    fig, axes = plt.subplots(1, len(roles), figsize=(5 * len(roles), 3.8), sharey=False, squeeze=False)
    axes = axes[0]
    for ax, role in zip(axes, roles):
        tols, deltas = loss_deltas(results, role)
        for tol in tols:  # nested bands: the inner (stricter) ones read darker
            ax.axhspan(-tol, tol, color="tab:green", alpha=0.07, lw=0)
            ax.text(1.0, tol, f" ±{tol:g}%", transform=ax.get_yaxis_transform(), va="center", fontsize=7,
                    color="tab:green")
        ax.axhline(0.0, color="k", lw=1.0, label="baseline")
        for name, d in deltas.items():
            ax.plot(range(1, len(d) + 1), d, marker="o" if len(d) < 4 else None, ms=3, label=name, lw=1.2,
                    ls="-" if safe.get(name, True) else ":")
        steps = int((results.get("suite") or {}).get("parity_steps") or max(map(len, deltas.values()), default=0))
        if steps:
            # The verdict reads the tail (last quarter, at least 3 steps): shade it. The first steps of a
            # fresh model swing by tens of percent; scale to the tail and the bands, and say what is clipped.
            start, lim = judged_window(deltas, tols, steps)
            ax.axvspan(start - 0.5, steps + 0.5, color="0.85", alpha=0.5, lw=0, zorder=0)
            ax.text(start - 0.5, 1.0, " judged", transform=ax.get_xaxis_transform(), va="top", fontsize=7)
            if lim is not None:
                ax.set_ylim(-lim, lim)
                ax.text(0.01, 0.02, "early steps clipped", transform=ax.transAxes, fontsize=7, color="0.4")
        ax.set_title(f"{role}: loss vs the baseline's" + {"student": " (CE + KL to the teacher)"}.get(role, ""),
                     fontsize=10)
        ax.set_xlabel("step (same data order and seed for every configuration)")
        ax.set_ylabel("loss − baseline (% of baseline)")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _distributions(results: dict, path: str) -> None:
    roles = _roles(results)
    cfgs = [c for c in results["configs"] if c["raw"][f"{roles[0]}_ms"]]
    fig, ax = plt.subplots(figsize=(8, 3.8))
    data = [[sum(v) for v in zip(*(c["raw"][f"{r}_ms"] for r in roles))] for c in cfgs]
    if data:
        ax.boxplot(data, whis=(10, 90), showfliers=True)
        ax.set_xticks(range(1, len(cfgs) + 1), [c["name"] for c in cfgs], rotation=20, ha="right")
    ax.set_ylabel(" + ".join(roles) + " step (ms)")
    ax.set_title("Step-time distributions (whiskers p10–p90)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_plots(results: dict, out_dir: str) -> list[str]:
    """Write the PNGs into out_dir; returns their file names (a failing plot is skipped, not fatal)."""
    os.makedirs(out_dir, exist_ok=True)
    done = []
    for name, fn in (("speedup.png", _speedup), ("memory.png", _memory), ("loss_curves.png", _losses),
                     ("step_time_distributions.png", _distributions)):
        try:
            with warnings.catch_warnings():  # figures near 1e308 overflow matplotlib's ticks: our line, not its
                warnings.simplefilter("error", RuntimeWarning)
                fn(results, os.path.join(out_dir, name))
            done.append(name)
        except Exception as e:  # noqa: BLE001 — a plot is a convenience; the JSON is the result
            plt.close("all")
            print(f"overdrive: warning: could not draw {name}: {e}")
    return done
