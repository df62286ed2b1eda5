"""report.html for `overdrive plan --out DIR`: the pick and how to run it first, then the ranked
table and the memory breakdown of the pick."""

from __future__ import annotations

import os

from overdrive.io import write_atomic
from overdrive.report.page import esc, img_tag, page, rec_block, table
from overdrive.report.plan_view import assumed, fmt_params, fmt_step

__all__ = ["write_plan_html", "plan_next_step"]

def plan_next_step(r: dict) -> str:
    """HTML: the accelerate(...) call that trains the top pick and its launch line, and what of the pick
    Overdrive does not run (another stack's feature), from plan()'s `how_to_run`."""
    from overdrive.plan.runnable import how_to_run

    c = r.get("top")
    if not c:
        return ("Next step: change one of the suggestions below (more GPUs, a shorter sequence, FP8 or 8-bit "
                "optimizer states) and plan again.")
    h = how_to_run(c, gpus_per_node=r.get("gpus_per_node", 1), nodes=r.get("nodes", 1),
                   grad_accum=c.get("grad_accum", 1))
    gaps = h["not_in_overdrive"]
    tail = (" Not run by Overdrive: " + "; ".join(gaps) + ".") if gaps else ""
    lead = ("Next step (parts of the pick are not Overdrive's, below; the nearest in Overdrive)" if h.get("other_stack")
            else "Next step")
    return (f"{lead}: in your training script, <code>{esc(h['call'])}</code> with micro-batch "
            f"{h['micro_batch']} at sequence {h['seq']}; launch: <code>{esc(h['launch'])}</code>.{esc(tail)}")


def write_plan_html(r: dict, out_dir: str, *, png: str | None = None, limit: int = 15) -> str:
    m = r["model"]
    meta = (f"{m['name']} ({fmt_params(r['params_b'])} params) on {r['nodes']}x{r['gpus_per_node']} {r['gpu']}, "
            f"seq {r['seq']}" + (f", global batch {r['global_batch']}" if r.get("global_batch") else "") +
            (f" · efficiency {100 * r['efficiency']:.0f}% of peak" if r.get("efficiency") else ""))
    rec = r["why"] if r.get("top") else "Nothing fits: " + "; ".join(r.get("suggestions") or [])
    body = [f"<h1>overdrive plan</h1><p class='meta'>{esc(meta)}</p>", *rec_block(rec, plan_next_step(r))]
    if assumed(r):
        body.append(f"<p class='note'>{esc(assumed(r))}</p>")
    fitting = [c for c in r["candidates"] if c["fits"]]
    rows = [[str(i), esc(c["precision"]), esc(c["sharding"]), esc(c["checkpointing"]), str(c["micro_batch"]),
             f"{c['memory_gib']:.1f} GiB", f"{c['headroom_gib']:.1f} GiB" + ("" if c.get("margin_ok", True) else " (tight)"), fmt_step(c["step_s"]),
             f"{c['tokens_per_s_per_gpu']:,.0f}", f"{100 * c['mfu']:.0f}%"] for i, c in enumerate(fitting[:limit], 1)]
    body.append(table(["#", "precision", "sharding", "checkpointing", "micro-batch", "memory/GPU", "headroom",
                       "step", "tokens/s/GPU", "MFU"], rows, left=4))
    body.append(f"<p class='note'>{len(fitting)} configurations fit ({min(limit, len(fitting))} shown); "
                f"{len(r['candidates']) - len(fitting)} do not. Memory = params + grads + optimizer + activations "
                "(incl. logits) + other (FSDP buffers, TE weight cache, CUDA context, NCCL buffers, fragmentation, DeepSpeed's start-up); "
                "calibration in "
                "docs/plan-validation.md.</p>")
    if png and os.path.exists(png):
        body.append(img_tag(png, "memory breakdown", "memory per GPU of the pick"))
    path = os.path.join(out_dir, "report.html")
    os.makedirs(out_dir, exist_ok=True)
    write_atomic(path, page(f"overdrive plan — {m['name']} on {r['gpu']}", body))
    return path
