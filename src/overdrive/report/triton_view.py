"""The real-server part of `bench --workload inference --server triton`: console lines and one plot,
latency against request rate, simulated and measured, with the SLO line."""

from __future__ import annotations

import os

__all__ = ["triton_lines", "write_triton_plot"]


def _rate(x) -> str:
    return f"{x:,.0f} req/s" if x is not None else "none"


def triton_lines(t: dict) -> list[str]:
    """What a reader needs of the real-server run, one fact per line."""
    if t.get("status") != "ok":
        return [f"real Triton server: not run ({t.get('reason')})"]
    q = t["requests"]
    ratio = f"{t['ratio']:.3g}" if t.get("ratio") is not None else "none (no rate tried met the SLO)"
    lines = [f"real Triton server ({t['server']}), setting {t['setting']}:",
             f"  highest rate under p99 <= {t['slo_ms']:g} ms: measured {_rate(t['measured_rate'])} "
             f"(next tried, missed: {_rate(t['missed_above'])}), simulated {_rate(t['simulated_rate'])}; "
             f"measured/simulated {ratio}",
             f"  requests: {q['sent']:,} sent, {q['answered']:,} answered, {q['failed']:,} failed, "
             f"{q['not_sent']:,} not sent (time bound)"]
    if t.get("simulated_verdict", "given") != "given":
        lines.append(f"  the simulated rate is an estimate: the simulation withheld its verdict ({t['simulated_verdict']})")
    fails = {}
    for p in t["points"]:
        for why, n in p["failed"].items():
            fails[why] = fails.get(why, 0) + n
    lines += [f"  failed: {n} x {why}" for why, n in fails.items()]
    for p in t["points"]:
        s, ts = p["latency_ms"], p.get("triton_stats") or {}
        lines.append(f"  {p['rate']:>10,.0f} req/s: p50 " + (f"{s['p50']:.2f} ms" if s["p50"] is not None else "n/e")
                     + ", p99 "
                     + (f"{s['p99']:.2f} ms" if s["p99"] is not None else f"not estimable ({s['note']})")
                     + f", {p['answered']}/{p['scheduled']} answered"
                     + (f"; Triton: queue {ts['queue_ms']:.2f} ms, infer {ts['compute_infer_ms']:.2f} ms per request, "
                        f"mean batch {ts['mean_batch']:.1f}" if ts.get("queue_ms") is not None and ts.get("mean_batch")
                        else "")
                     + f"; client {p['client_cpu_cores']:.2f} cores, server "
                     + (f"{p['server_cpu_cores']:.2f}" if p["server_cpu_cores"] is not None else "?") + " cores"
                     + (" (met)" if p["met"] else " (missed)"))
    if t.get("aa"):
        a = t["aa"]
        lines.append(f"  A/A at {_rate(a['rate'])}: p99 {a['p99_a']:.2f} then "
                     + (f"{a['p99_b']:.2f} ms" if a["p99_b"] is not None else "not estimable")
                     + (f" ({100 * a['relative']:.0f}% apart)" if a.get("relative") is not None else "")
                     + ("" if a["met_again"] else "; missed the SLO the second time: the measured rate is at this "
                        "host's noise"))
    ld = t["load"]
    lines.append(f"  host load {ld['before']['load1']} -> {ld['after']['load1']} on {ld['before']['cores']} cores"
                 + (f"; the client used {t['client_cpu_cores_max']:.2f} cores against the server's "
                    f"{t['server_cpu_cores_max']:.2f}: it competed with the server, so the measured rate is a lower "
                    "bound" if t.get("client_competes") else
                    f"; client at most {t['client_cpu_cores_max']:.2f} cores, below the server's"
                    + (f" {t['server_cpu_cores_max']:.2f}" if t.get("server_cpu_cores_max") is not None else "")))
    lines.append("  no server process left" if not t.get("leftover_processes") else
                 "  WARNING: a server process outlived the run")
    lines.append(f"  {t['note']}")
    return lines


def write_triton_plot(r: dict, out_dir: str) -> str | None:
    """triton_latency_vs_rate.png: p99 against rate, simulated (ONNX Runtime's curve) and measured, SLO line."""
    t = r.get("triton") or {}
    if t.get("status") != "ok":
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    curve = (((r.get("serving") or {}).get("engines") or {}).get(t["engine"]) or {}).get("curve") or {}
    sim = [(p["rate"], p["p99"]) for p in curve.get("points") or [] if p.get("p99") is not None]
    if sim:
        ax.plot(*zip(*sim), "o-", color="#888", label="simulated p99 (measured service times + batcher model)")
    pts = sorted((p["rate"], p["latency_ms"]["p99"]) for p in t["points"] if p["latency_ms"]["p99"] is not None)
    if pts:
        ax.plot(*zip(*pts), "s-", color="#c33", label="measured p99 on tritonserver (open-loop Poisson client)")
    ne = [p["rate"] for p in t["points"] if p["latency_ms"]["p99"] is None]
    for x in ne:
        ax.axvline(x, color="#c33", ls=":", lw=0.8)
    ax.axhline(t["slo_ms"], color="k", ls="--", lw=1, label=f"SLO p99 {t['slo_ms']:g} ms")
    ax.axvline(t["simulated_rate"], color="#888", ls="-.", lw=0.8)
    if t.get("measured_rate"):
        ax.axvline(t["measured_rate"], color="#c33", ls="-.", lw=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("request rate (req/s)")
    ax.set_ylabel("p99 latency (ms)")
    ratio = f"{t['ratio']:.3g}" if t.get("ratio") is not None else "none"
    ax.set_title(f"highest rate under the SLO: measured/simulated {ratio}", fontsize=10)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    path = os.path.join(out_dir, "triton_latency_vs_rate.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
