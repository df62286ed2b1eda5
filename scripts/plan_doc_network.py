"""docs/plan-validation.md's section on the tail and the network: for every published run the plan misses by more
than `TAIL` on more than one node, the per-GPU inter-node bandwidth at which the plan would meet it
(`overdrive.plan.validation.implied_network`), beside the bandwidth it was planned at. A diagnostic, not a fit:
nothing is refitted or changed by it. A source whose tail rows all imply one bandwidth may have run on that network
(most do not publish theirs); rows of one source that imply bandwidths far apart, or none, miss something else."""

from __future__ import annotations

import textwrap
from statistics import median

from overdrive.env.catalog import gpu_by_key
from overdrive.plan.setup import gbs_text
from overdrive.plan.validation import NETWORK_RANGE, _setup, implied_network, load_runs, predict

TAIL = 0.25
"""|tokens/s error| above which a run counts in the tail (the issue's worst-case target)."""
AGREE = 1.5
"""A source's tail rows agree on a network when their implied bandwidths are within this ratio of each other."""


def _source(r: dict) -> str:
    return r["source"].split(" (")[0].split(",")[0].split(" @")[0]


def network_rows() -> list[dict]:
    """The tail's multi-node runs (as rated: not a run its own source flags as a defect) with their implied network."""
    out = []
    for i, r in enumerate(load_runs()):
        if r.get("memory_only") or r.get("stack_bug") or _setup(r).nodes <= 1:
            continue
        p = predict(r)
        if abs(p["error"]) <= TAIL:
            continue
        out.append({"id": r["id"], "source": _source(r), "error": p["error"], "planned_gbs": _setup(r).net_gbs,
                    "given": "inter_gbs" in r, "implied": implied_network(r), "order": i})
    return sorted(out, key=lambda x: (x["source"], x["order"]))


def _others_at(src: str, tail: set[str], gbs: float) -> str:
    """The source's other multi-node runs replanned at `gbs`: how far their error moves (the same cluster's runs
    must stand the same network)."""
    others = [r for r in load_runs() if _source(r) == src and r["id"] not in tail and not r.get("memory_only")
              and not r.get("stack_bug") and _setup(r).nodes > 1]
    if not others:
        return "; the source has no other run on more than one node to check it against"
    now = sorted(abs(predict(r)["error"]) for r in others)
    then = sorted(abs(predict({**r, "inter_gbs": gbs})["error"]) for r in others)
    if len(others) == 1:
        return (f"; its other multi-node run would read {100 * then[0]:.0f}% at that bandwidth "
                f"(now {100 * now[0]:.0f}%)")
    return (f"; its {len(others)} other multi-node runs would read median {100 * median(then):.0f}%, worst "
            f"{100 * then[-1]:.0f}% at that bandwidth (now {100 * median(now):.0f}%, {100 * now[-1]:.0f}%)")


def _verdict(rows: list[dict]) -> str:
    got = [x["implied"] for x in rows if x["implied"] is not None]
    if not got:
        return "no bandwidth closes it"
    if len(got) < len(rows):
        return "not the network: some of its rows close at no bandwidth"
    if max(got) / min(got) <= AGREE:
        g = (min(got) * max(got)) ** 0.5
        said = (f"one network would explain them, {gbs_text(min(got))}-{gbs_text(max(got))} GB/s per GPU"
                if len(rows) > 1 else f"{gbs_text(got[0])} GB/s per GPU would explain it")
        return said + _others_at(rows[0]["source"], {x["id"] for x in rows}, g)
    return f"not the network alone: its rows imply {gbs_text(min(got))} to {gbs_text(max(got))} GB/s per GPU"


def network_section() -> str:
    rows = network_rows()
    lo, hi = NETWORK_RANGE
    a100, h100 = (gbs_text(gpu_by_key(k).nic_gbs) for k in ("a100-80", "h100-sxm"))
    table = ["| Run | Error | Planned at (GB/s per GPU) | Meets the published figure at |", "|---|---:|---:|---:|"]
    for x in rows:
        at = f"{gbs_text(x['implied'])} GB/s" if x["implied"] is not None else f"none in {lo:g}-{hi:g}"
        planned = gbs_text(x["planned_gbs"]) + (" (the row's)" if x["given"] else " (the GPU's reference system)")
        table.append(f"| {x['id']} | {100 * x['error']:+.0f}% | {planned} | {at} |")
    by_src: dict[str, list[dict]] = {}
    for x in rows:
        by_src.setdefault(x["source"], []).append(x)
    verdicts = "\n".join(textwrap.fill(f"- {src} ({len(v)} run{'s' if len(v) > 1 else ''}): {_verdict(v)}",
                                       width=118, subsequent_indent="  ", break_on_hyphens=False)
                         for src, v in by_src.items())
    return f"""## The tail and the network: what bandwidth would close each gap

Many sources do not publish their network, and the plan then assumes the GPU's reference system (DGX A100:
{a100} GB/s per GPU, DGX H100: {h100}). For every run on more than one node that the plan misses by more than
{100 * TAIL:.0f}%, the table gives the per-GPU inter-node bandwidth (one way, as `--inter-gbs`) at which the plan
would meet the published tokens/s: `overdrive.plan.validation.implied_network`, a bisection over `--inter-gbs` from
{lo:g} to {hi:g} GB/s. It changes nothing; it says whether the network could be what the plan misses. The runs of
one source share a cluster: when their bandwidths agree (within {AGREE:g}x), one network would explain them, and
the source's other multi-node runs are replanned at it to check; when they disagree, or a run closes at no
bandwidth, the gap is something else. `overdrive plan --explain` prints the same sensitivity for a plan on an
assumed network (at a half and a quarter of it).

{chr(10).join(table)}

{verdicts}
"""
