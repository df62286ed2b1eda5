"""docs/plan-validation.md's section on InternLM's 7B throughput table, an unseen trainer (its own Hybrid ZeRO,
flash-attn, A100 over 4 x 100 Gb RoCE per node): each row's first-sight error kept beside the error now, the
step each run lost beyond the planned step as first planned, what `--zero-broadcast` now plans for it, and what
the choices it made would read otherwise."""

from __future__ import annotations

import dataclasses
import statistics

from overdrive.plan.estimate import estimate
from overdrive.plan.validation import _setup, expressed_table, load_runs, run_model

INTERNLM = "InternLM/InternLM doc/en/train_performance.md"


def _tokens(r: dict) -> float:
    """Tokens per GPU per optimizer step."""
    return r["global_batch"] * r["seq"] / r["gpus"]


def internlm_rows(val: list[dict]) -> list[dict]:
    return [p for p in val if p["source"].startswith(INTERNLM)]


def _facts(val: list[dict]) -> dict:
    """Per row: published and planned step, the step lost beyond the plan as first planned less what the same TP
    loses on one node, and the broadcast terms planned now."""
    runs = {r["id"]: r for r in load_runs()}
    out = {}
    for p in internlm_rows(val):
        r = runs[p["id"]]
        e = estimate(run_model(r), _setup(r))
        plain = estimate(run_model(r), dataclasses.replace(_setup(r), zero_broadcast=False))
        out[p["id"]] = dict(r=r, p=p, e=e, pub_s=_tokens(r) / p["published"], first_s=_tokens(r) / r["first_planned"],
                            plain_s=plain.step_s, first=r["first_planned"] / r["tps"] - 1)
    for f in out.values():
        base = next(g for g in out.values() if g["r"]["gpus"] == 8 and g["r"].get("tp", 1) == f["r"].get("tp", 1)
                    and g["r"]["checkpointing"] == "none")
        f["lost"] = (f["pub_s"] - f["first_s"]) - (base["pub_s"] - base["first_s"])
        f["bcast_new"] = f["e"].times["zero_bcast_exposed"] + f["e"].times["dp_exposed"] - (
            base["e"].times["zero_bcast_exposed"] + base["e"].times["dp_exposed"])
    return out


def _big_errors(val: list[dict], **patches) -> list[float]:
    """The 1,024-GPU rows' errors with parts of comm.py replaced (unittest.mock): what another choice would read."""
    from unittest import mock

    from overdrive.plan import comm

    runs = {r["id"]: r for r in load_runs()}
    out = []
    with mock.patch.multiple(comm, **patches):
        for p in internlm_rows(val):
            r = runs[p["id"]]
            if r["gpus"] >= 1024:
                out.append(estimate(run_model(r), _setup(r)).tokens_per_s_per_gpu / r["tps"] - 1)
    return out


def _one_hop(nbytes, n, nodes, bus_bps):
    """NCCL's broadcast latency for rings that share their channels: base 8.4 + one 14 µs hop."""
    from overdrive.plan.collectives import RING_BASE_US

    if n <= 1 or nbytes <= 0:
        return 0.0, 0.0
    lat = (RING_BASE_US + 14.0) * 1e-6
    return lat + nbytes / bus_bps, lat


def _with_biases(m, s, n):
    """The owners had the model its attention's QKV and output biases, two more tensors per block."""
    from overdrive.plan.pipeline import param_tensors

    return min(n, len(param_tensors(m, s)) + 2 * m.n_layer)


def internlm_bullet(val: list[dict]) -> str:
    f = _facts(val)
    if not f:
        return ""
    first = [abs(x["first"]) for x in f.values()]
    now = [abs(x["p"]["error"]) for x in f.values()]
    return (f"- **InternLM's 7B table, unseen when first planned** (its own trainer, Hybrid ZeRO on 8 to 1,024 A100s): "
            f"first sight median {100 * statistics.median(first):.1f}%, worst {100 * max(first):.0f}%; now median "
            f"{100 * statistics.median(now):.1f}%, worst {100 * max(now):.0f}% ({len(now)} runs), since it sent us to "
            "`--zero-broadcast` (its section below).")


def internlm_section(val: list[dict]) -> str:
    f = _facts(val)
    if not f:
        return ""
    lines = ["| run | GPUs | TP | published | first planned | first error | now | published step s | planned step s "
             "| step lost as first planned (beyond one node) | weight broadcasts: calls, ms (latency ms) "
             "| data-parallel time exposed now (beyond one node) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|"]
    for k, x in f.items():
        r, p, c = x["r"], x["p"], x["e"].comm
        lines.append(f"| {k} | {r['gpus']} | {r.get('tp', 1)} | {p['published']:,.0f} | {r['first_planned']:,.1f} | "
                     f"{100 * x['first']:+.0f}% | {100 * p['error']:+.0f}% | {x['pub_s']:.2f} | {x['e'].step_s:.2f} | "
                     f"{x['lost']:+.2f} s | {c['dp_bcast_calls']}, {1e3 * c['dp_bcast']:,.0f} "
                     f"({1e3 * c['dp_bcast_latency']:,.0f}) | {x['bcast_new']:+.2f} s |")
    big = {x["r"].get("tp", 1): x for x in f.values() if x["r"]["gpus"] >= 1024}
    first = [abs(x["first"]) for x in f.values()]
    single = [abs(x["first"]) for x in f.values() if x["r"]["gpus"] == 8]
    now = [abs(x["p"]["error"]) for x in f.values()]
    per_rank = {tp: x["lost"] / x["e"].comm["dp_bcast_calls"] / x["e"].setup.shards * 1e6 for tp, x in big.items()}
    mb = {tp: x["e"].model.n_params() / tp * 2 / x["e"].comm["dp_bcast_calls"] / 1e6 for tp, x in big.items()}
    table = "\n".join(lines)
    return f"""## An unseen trainer: InternLM's 7B table (A100 80GB, Hybrid ZeRO)

{len(f)} runs from InternLM's training-performance page ({INTERNLM} @ 20fe5ac2), added after every other term on this
page and planned on arrival; the trainer is neither Megatron nor FSDP (its own ZeRO-1, flash-attn kernels, eager),
expressed as the PyTorch stack in eager mode with ZeRO-1 (each run's note says every setting and where it comes
from). First sight: median {100 * statistics.median(first):.1f}%, worst {100 * max(first):.0f}% ({len(first)} runs); on one
node ({len(single)} runs) median {100 * statistics.median(single):.1f}%, all planned fast. Then it sent us to
`--zero-broadcast`; now median {100 * statistics.median(now):.1f}%, worst {100 * max(now):.0f}%. It shaped that term, so it is not
counted among the sources that shaped nothing.

{table}

Why the first plan fell behind as the data-parallel group grew, from the trainer's source as it stood when the
table was written (the page dates from c18bec9, 2023-07-08; internlm/solver/optimizer/hybrid_zero_optim.py @
20fe5ac2, the page's commit): its ZeRO-1 is not a bucketed reduce-scatter + all-gather. The gradients are
all-reduced whole in the model's dtype (`reduce_tensor` with no destination rank: `dist.all_reduce` per
`reduce_bucket_size`, 512M elements in configs/7B_sft.py) under the last micro-batch's backward; after the step
`broadcast_params(overlap=False)` sends each rank's updated weights to the whole ZeRO group with one
`dist.broadcast` per rank that owns any, and waits for every one ("TODO: support broadcast overlap").
`_partition_param_list` gives the tensors, largest first, to the least-loaded rank, so at 1,024 ranks every tensor
has a rank of its own: {big[1]['e'].comm['dp_bcast_calls']} broadcasts a step at TP 1 and TP 2 alike, the same time on the wire
({mb[1]:.0f} MB a call at TP 1, whose group has 8 members a node sharing its network, {mb[2]:.0f} MB at TP 2 with 4). NCCL runs
a broadcast as a ring of nRanks steps and its cost model charges it nRanks x 14 µs of latency across nodes
(src/graph/tuning.cc, the branch for rings whose channels differ), {big[1]['e'].comm['dp_bcast_latency'] / big[1]['e'].comm['dp_bcast_calls'] * 1e3:.1f} ms a call over 1,024 ranks. The data
say the latency grows with the ranks: at TP 1 (1,024 ranks) the step lost {big[1]['lost']:.2f} s beyond the first plan, at
TP 2 (512 ranks) {big[2]['lost']:.2f} s, for the same calls of the same time on the wire.

What was chosen, and what the other choices would read on the two 1,024-GPU rows:
- NCCL's model has a second branch, one hop (22 µs a call) when the rings share their channels (search.cc tries
  that first): {' and '.join(f'{100 * e:+.0f}%' for e in _big_errors(val, broadcast_s=_one_hop))}. The data picked the nRanks branch, which is why InternLM now counts as a source that
  shaped a term.
- The real model also has biases on its attention's QKV and output projections (64 more tensors, 64 more
  broadcasts at 1,024 ranks), which the rows cannot express without adding biases to every linear:
  {' and '.join(f'{100 * e:+.0f}%' for e in _big_errors(val, zero_owners=_with_biases))} with them.
- InternLM's later code (August 2023 on: `ParamBcastSyncHandler` assigns tensors in module order and the next
  forward waits for its blocks' broadcasts) is not what ran the table, and is not planned.

Left: the same table's zero1=8 rows (a ZeRO group smaller than the data-parallel group, whose broadcasts stay inside
a node: 3625 against 2271 tokens/s per GPU at 1,024 GPUs), which `--sharding zero1` cannot express.

{expressed_table(internlm_rows(val))}
"""
