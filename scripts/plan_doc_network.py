"""docs/plan-validation.md's sections on the tail against the plan's two assumed figures, the network across nodes
and the host's µs per eager op: for every published run the plan misses by more than `TAIL` where the figure moves
the plan, the value at which the plan would meet it (`overdrive.plan.validation.implied_network`,
`implied_host_us`), beside the value it was planned at. A diagnostic, not a fit: nothing is refitted or changed by
it. A source whose tail rows all imply one value may have run there (most publish neither); rows of one source that
imply values far apart, or none, miss something else."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from statistics import median
from typing import Callable

from overdrive.env.catalog import gpu_by_key
from overdrive.plan.choices import HOST_US_RANGE
from overdrive.plan.host import HOST_US_PER_OP, host_time, host_us
from overdrive.plan.setup import gbs_text
from overdrive.plan.validation import (NETWORK_RANGE, _setup, implied_host_us, implied_network, load_runs, predict,
                                       run_model)

TAIL = 0.25
"""|tokens/s error| above which a run counts in the tail (the issue's worst-case target)."""
AGREE = 1.5
"""A source's tail rows agree on a value when their implied values are within this ratio of each other."""
HOST_CEILING = 10 * HOST_US_PER_OP
"""µs per op past which a host is not what a gap is: ten times the published host's (a CPU host dispatches an op in
3.6 µs, a B200's host in 8.6, older transformers' reentrant checkpointing in 10.2)."""


@dataclass(frozen=True)
class Figure:
    """One assumed figure: the setup field that sets it, its unit and range, and the runs it moves."""
    key: str
    unit: str
    what: str
    span: tuple[float, float]
    implied: Callable[[dict], float | None]
    planned: Callable[[dict], float]
    moves: Callable[[dict], bool]
    default: str


def _host_moves(r: dict) -> bool:
    return host_time(run_model(r), _setup(r)) > 0


NETWORK = Figure("inter_gbs", "GB/s per GPU", "network", NETWORK_RANGE, implied_network, lambda r: _setup(r).net_gbs,
                 lambda r: _setup(r).nodes > 1, "the GPU's reference system")
HOST = Figure("host_us", "µs per op", "host", HOST_US_RANGE, implied_host_us, lambda r: host_us(_setup(r)),
              _host_moves, "a B200 host's")


def _text(v: float) -> str:
    return gbs_text(v)


def _source(r: dict) -> str:
    return r["source"].split(" (")[0].split(",")[0].split(" @")[0]


def _counted(r: dict) -> bool:
    """Runs as rated: throughput runs, not one its own source flags as a defect."""
    return not r.get("memory_only") and not r.get("stack_bug")


def tail_rows(f: Figure) -> list[dict]:
    """The tail's runs that `f` moves, with the value at which the plan meets each."""
    out = []
    for i, r in enumerate(load_runs()):
        if not _counted(r) or not f.moves(r):
            continue
        p = predict(r)
        if abs(p["error"]) <= TAIL:
            continue
        out.append({"id": r["id"], "source": _source(r), "gpu": r["gpu"], "error": p["error"], "planned": f.planned(r),
                    "given": f.key in r, "implied": f.implied(r), "order": i})
    return sorted(out, key=lambda x: (x["source"], x["order"]))


def network_rows() -> list[dict]:
    return tail_rows(NETWORK)


def _others_at(f: Figure, group: tuple[str, str], tail: set[str], v: float) -> str:
    """The source's other runs on the same GPU (one cluster, one kind of host) replanned at `v`: how far their
    error moves (they must stand the same value)."""
    others = [r for r in load_runs() if (_source(r), r["gpu"]) == group and r["id"] not in tail and _counted(r)
              and f.moves(r)]
    if not others:
        return f"; the source has no other run on that GPU for the {f.what} to check it against"
    pairs = [(abs(predict(r)["error"]), abs(predict({**r, f.key: v})["error"])) for r in others]
    if all(abs(a - b) < 1e-4 for a, b in pairs):
        return (f"; its {len(others)} other run{'s' if len(others) > 1 else ''} on that GPU do not move at that "
                "value: nothing to check it against")
    now, then = sorted(a for a, _ in pairs), sorted(b for _, b in pairs)
    if len(others) == 1:
        return f"; its other run on that GPU would read {100 * then[0]:.0f}% there (now {100 * now[0]:.0f}%)"
    return (f"; its {len(others)} other runs on that GPU would read median {100 * median(then):.0f}%, worst "
            f"{100 * then[-1]:.0f}% there (now {100 * median(now):.0f}%, {100 * now[-1]:.0f}%)")


def _verdict(f: Figure, rows: list[dict]) -> str:
    got = [x["implied"] for x in rows if x["implied"] is not None]
    if not got:
        return f"no {f.what} in range closes {'them' if len(rows) > 1 else 'it'}"
    if len(got) < len(rows):
        return f"not the {f.what}: some of its rows close at no value in range"
    if f is HOST and min(got) > HOST_CEILING:
        return (f"not the host: {_text(min(got))} µs per op and up, over ten times the published host's "
                f"{HOST_US_PER_OP:g}")
    if max(got) / min(got) > AGREE:
        return f"not the {f.what} alone: its rows imply {_text(min(got))} to {_text(max(got))} {f.unit}"
    ratios = sorted(x["implied"] / x["planned"] for x in rows)
    scale = (f"{ratios[0]:.2g}-{ratios[-1]:.2g}x" if len(rows) > 1 else f"{ratios[0]:.2g}x") + " the planned"
    said = (f"one {f.what} would explain them, {_text(min(got))}-{_text(max(got))} {f.unit} ({scale})"
            if len(rows) > 1 else f"{_text(got[0])} {f.unit} ({scale}) would close it")
    if any(x["given"] for x in rows):
        said += (f"; the row{'s' if len(rows) > 1 else ''} set the planned {f.what}: if the cluster ran at that, "
                 "the plan's communication is what is off, not the network")
    return said + _others_at(f, (rows[0]["source"], rows[0]["gpu"]), {x["id"] for x in rows},
                             (min(got) * max(got)) ** 0.5)


def _table(f: Figure) -> str:
    rows = tail_rows(f)
    lo, hi = f.span
    head = f"| Run | Error | Planned at ({f.unit}) | Meets the published figure at |"
    table = [head, "|---|---:|---:|---:|"]
    for x in rows:
        at = f"{_text(x['implied'])} {f.unit}" if x["implied"] is not None else f"none in {lo:g}-{hi:g}"
        planned = _text(x["planned"]) + (" (set in the row)" if x["given"] else f" ({f.default})")
        table.append(f"| {x['id']} | {100 * x['error']:+.0f}% | {planned} | {at} |")
    groups: dict[tuple[str, str], list[dict]] = {}
    for x in rows:   # one source on one GPU: one cluster, one kind of host
        groups.setdefault((x["source"], x["gpu"]), []).append(x)
    verdicts = "\n".join(textwrap.fill(f"- {src}, {gpu} ({len(v)} run{'s' if len(v) > 1 else ''}): "
                                       f"{_verdict(f, v)}", width=118, subsequent_indent="  ", break_on_hyphens=False)
                         for (src, gpu), v in groups.items())
    return "\n".join(table) + "\n\n" + verdicts


def network_section() -> str:
    lo, hi = NETWORK_RANGE
    a100, h100 = (gbs_text(gpu_by_key(k).nic_gbs) for k in ("a100-80", "h100-sxm"))
    hlo, hhi = HOST_US_RANGE
    return f"""## The tail and the plan's two assumed figures: what network, what host would close each gap

Many sources do not publish their network, and the plan then assumes the GPU's reference system (DGX A100:
{a100} GB/s per GPU, DGX H100: {h100}). For every run on more than one node that the plan misses by more than
{100 * TAIL:.0f}%, the table gives the per-GPU inter-node bandwidth (one way, as `--inter-gbs`) at which the plan
would meet the published tokens/s: `overdrive.plan.validation.implied_network`, a bisection over `--inter-gbs` from
{lo:g} to {hi:g} GB/s. It changes nothing; it says whether the network could be what the plan misses. The runs of
one source on one GPU share a cluster: when their bandwidths agree (within {AGREE:g}x), one network would explain
them, and the source's other runs on that GPU are replanned at it to check; when they disagree, or a run closes at
no bandwidth, the gap is something else. Where a row sets the network (from its source, its platform, or as an
assumption its note states), a bandwidth that closes the gap says the plan's communication is off if the cluster
ran at the row's figure. `overdrive plan --explain` prints the same sensitivity for a plan on an
assumed network (at a half and a quarter of it).

{_table(NETWORK)}

No source publishes its host's speed either: the plan's host-bound floor (host.py) prices an eager ATen op at
{HOST_US_PER_OP:g} µs, one B200 host's published step, unless `--host-us` gives the host's own. For every run the
plan misses by more than {100 * TAIL:.0f}% whose plan has a host floor (eager PyTorch, DeepSpeed ZeRO-3's hooks,
nanotron's sliced ZeRO-1), the µs per op at which the plan would meet it (`implied_host_us`, {hlo:g} to {hhi:g}
µs); past {HOST_CEILING:g} µs (ten times the published host's) the host is not the gap. The runs of one source
on one GPU ran on one kind of host, and the same check applies. `overdrive plan --explain` replans a host-bound
plan at twice and half its µs per op.

{_table(HOST)}
"""
