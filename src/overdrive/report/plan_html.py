"""report.html for `overdrive plan --out DIR`: the pick and how to run it first, then the ranked
table and the memory breakdown of the pick."""

from __future__ import annotations

import os

from overdrive.io import write_atomic
from overdrive.report.page import esc, img_tag, page, rec_block, table

__all__ = ["write_plan_html", "plan_next_step"]

# Planner precisions -> the recipe preset that trains that way.
_PRESET = {"fp32": "fp32", "fp16": "amp-fp16", "bf16": "amp-bf16", "fp8": "fp8", "fp8-rowwise": "fp8-rowwise",
           "fp8-delayed": "fp8-delayed", "mxfp8": "mxfp8", "nvfp4": "nvfp4"}
# What `overdrive train` runs itself; anything else in the pick is named as a gap, not hidden.
_TRAIN_SHARDING = {"fsdp": None, "none": "off"}
_TRAIN_AC = ("none", "selective", "full")


def plan_next_step(r: dict) -> str:
    """HTML: the top pick as train-config lines and the launch command, and what of it the trainer
    does not do yet (HSDP/ZeRO-1/2, tensor/pipeline/context parallel, per-op checkpointing)."""
    c = r.get("top")
    if not c:
        return ("Next step: change one of the suggestions below (more GPUs, a shorter sequence, FP8 or 8-bit "
                "optimizer states) and plan again.")
    world = r.get("gpus_per_node", 1) * r.get("nodes", 1)
    prec = c.get("precision", "")
    ac = c.get("checkpointing", "none")
    cfg = (f'[train] recipe = "{_PRESET.get(prec, prec)}", activation_checkpointing = '
           f'"{ac if ac in _TRAIN_AC else "selective"}", micro_batch = {c["micro_batch"]}, seq_len = {c["seq"]}')
    sh = c.get("sharding", "fsdp")
    if _TRAIN_SHARDING.get(sh):
        cfg += f', fsdp = "{_TRAIN_SHARDING[sh]}"'
    launch = (f"torchrun --nproc_per_node={r.get('gpus_per_node', 1)}" +
              (f" --nnodes={r['nodes']}" if r.get("nodes", 1) > 1 else "") + " -m overdrive train CONFIG")
    gaps = []
    if sh not in _TRAIN_SHARDING:
        gaps.append(f"{sh} (overdrive train shards with FSDP)")
    if ac not in _TRAIN_AC:
        gaps.append(f"{ac} checkpointing (selective is the nearest)")
    gaps += [f"{k} {c[k]}" for k in ("tp", "pp", "cp") if (c.get(k) or 1) > 1]
    tail = f" Not in overdrive train yet: {', '.join(gaps)}." if gaps else ""
    return (f"Next step: in a train config: <code>{esc(cfg)}</code>; launch on {world} GPUs: "
            f"<code>{esc(launch)}</code>.{esc(tail)}")


def write_plan_html(r: dict, out_dir: str, *, png: str | None = None, limit: int = 15) -> str:
    m = r["model"]
    meta = (f"{m['name']} ({r['params_b']:.2f}B params) on {r['nodes']}x{r['gpus_per_node']} {r['gpu']}, "
            f"seq {r['seq']}" + (f", global batch {r['global_batch']}" if r.get("global_batch") else "") +
            (f" · efficiency {100 * r['efficiency']:.0f}% of peak" if r.get("efficiency") else ""))
    rec = r["why"] if r.get("top") else "Nothing fits: " + "; ".join(r.get("suggestions") or [])
    body = [f"<h1>overdrive plan</h1><p class='meta'>{esc(meta)}</p>", *rec_block(rec, plan_next_step(r))]
    fitting = [c for c in r["candidates"] if c["fits"]]
    rows = [[str(i), esc(c["precision"]), esc(c["sharding"]), esc(c["checkpointing"]), str(c["micro_batch"]),
             f"{c['memory_gib']:.1f} GiB", f"{c['headroom_gib']:.1f} GiB", f"{c['step_s']:.3f}",
             f"{c['tokens_per_s_per_gpu']:,.0f}", f"{100 * c['mfu']:.0f}%"] for i, c in enumerate(fitting[:limit], 1)]
    body.append(table(["#", "precision", "sharding", "checkpointing", "micro-batch", "memory/GPU", "headroom",
                       "step s", "tokens/s/GPU", "MFU"], rows, left=4))
    body.append(f"<p class='note'>{len(fitting)} configurations fit ({min(limit, len(fitting))} shown); "
                f"{len(r['candidates']) - len(fitting)} do not. Memory = params + grads + optimizer + activations "
                "(incl. logits) + other (FSDP buffers, CUDA context, fragmentation); calibration in "
                "docs/plan-validation.md.</p>")
    if png and os.path.exists(png):
        body.append(img_tag(png, "memory breakdown", "memory per GPU of the pick"))
    path = os.path.join(out_dir, "report.html")
    os.makedirs(out_dir, exist_ok=True)
    write_atomic(path, page(f"overdrive plan — {m['name']} on {r['gpu']}", body))
    return path
