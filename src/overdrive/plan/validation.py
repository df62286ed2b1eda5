"""The planner against published runs: src/overdrive/plan/published_runs.json holds each run's
configuration, its source and what it measured; `role` says whether the run calibrates the model's
constants (scripts/plan_calibrate.py fits them on those only) or validates it (never fitted on).
docs/plan-validation.md is rendered from here, and tests/unit/test_plan_validation.py recomputes it."""

from __future__ import annotations

import json
import statistics
from importlib import resources

from overdrive.env.catalog import gpu_by_key
from overdrive.plan.estimate import estimate
from overdrive.plan.setup import TrainSetup
from overdrive.plan.specs import MPT_SIZES, get_model, mpt

__all__ = ["load_runs", "predict", "evaluate", "summary", "markdown_table", "why_not_fitting"]

_SETUP_KEYS = ("seq", "micro_batch", "global_batch", "precision", "sharding", "tp", "pp", "vpp", "cp", "checkpointing",
               "pure_bf16", "fp8_all_gather", "compile", "async_tp", "inter_gbs", "optimizer_dtype", "stack", "loss", "fp8_activations", "grad_dtype", "recompute_layers",
               "recompute_modules", "offload_activations", "embedding_in_pipeline_split")


def load_runs() -> list[dict]:
    return json.loads(resources.files("overdrive.plan").joinpath("published_runs.json").read_text())["runs"]


def _setup(r: dict) -> TrainSetup:
    per_node = r.get("gpus_per_node", min(8, r["gpus"]))
    return TrainSetup(gpu=gpu_by_key(r["gpu"]), gpus_per_node=per_node, nodes=r["gpus"] // per_node,
                      **{k: r[k] for k in _SETUP_KEYS if k in r})


def predict(r: dict, cal: dict | None = None) -> dict:
    """The planner's prediction for one published run, with the relative errors."""
    m = mpt(r["model"], r["seq"]) if r["model"] in MPT_SIZES else get_model(r["model"])
    e = estimate(m, _setup(r), cal=cal)
    out = {"id": r["id"], "role": r["role"], "gpu": r["gpu"], "precision": r["precision"], "published": r["tps"],
           "predicted": e.tokens_per_s_per_gpu, "error": e.tokens_per_s_per_gpu / r["tps"] - 1, "fits": e.fits,
           "source": r["source"], "memory_gib": e.memory_gib, "capacity_gib": e.capacity_gib,
           "allocated_gib": e.allocated_gib, "reserved_margin_gib": e.reserved_margin_gib,
           "breakdown_gib": e.breakdown_gib, "attention_share": e.times["attention"] / e.step_s}
    if r.get("memory_gib"):
        # torchtitan logs max_reserved: the allocator's view (allocated + fragmentation), no CUDA context
        reserved = e.allocated_gib + e.reserved_margin_gib
        out.update(memory_published=r["memory_gib"], memory_predicted=reserved,
                   memory_error=reserved / r["memory_gib"] - 1, memory_fsdp=r.get("sharding") == "fsdp")
    return out


def evaluate(role: str | None = None, cal: dict | None = None) -> list[dict]:
    return [predict(r, cal) for r in load_runs() if role is None or r["role"] == role]


def summary(rows: list[dict]) -> dict:
    errs = [abs(r["error"]) for r in rows]
    mem = [abs(r["memory_error"]) for r in rows if r.get("memory_fsdp")]
    return {"n": len(rows), "median_abs_error": statistics.median(errs), "worst_abs_error": max(errs),
            "worst": max(rows, key=lambda r: abs(r["error"]))["id"], "under": sum(r["error"] < 0 for r in rows),
            "n_memory": len(mem), "memory_median_abs_error": statistics.median(mem) if mem else None,
            "memory_worst_abs_error": max(mem) if mem else None, "not_fitting": [r["id"] for r in rows if not r["fits"]]}


def markdown_table(rows: list[dict]) -> str:
    lines = ["| run | source | published tok/s/GPU | planned | error | memory published → planned (GiB) |",
             "|---|---|---:|---:|---:|---|"]
    for r in rows:
        mem = (f"{r['memory_published']:.1f} → {r['memory_predicted']:.1f} ({100 * r['memory_error']:+.0f}%)"
               if "memory_published" in r else "")
        fit = "" if r["fits"] else " (planned not to fit)"
        lines.append(f"| {r['id']}{fit} | {r['source']} | {r['published']:,.0f} | {r['predicted']:,.0f} | "
                     f"{100 * r['error']:+.0f}% | {mem} |")
    return "\n".join(lines)


def why_not_fitting(r: dict) -> str:
    """One line for a run planned not to fit: by how much, which terms, and whether `allocated` (what the
    allocator counter would read) fits without the fragmentation allowance and the CUDA context."""
    b = r["breakdown_gib"]
    over = r["memory_gib"] - r["capacity_gib"]
    names = {"activations": "activations+logits", "other": "buffers+context+fragmentation"}
    terms = ", ".join(f"{names.get(k, k)} {v:.1f}" for k, v in sorted(b.items(), key=lambda kv: -kv[1]))
    alloc = r["allocated_gib"]
    verdict = (f"allocated {alloc:.1f} GiB fits; the {r['reserved_margin_gib']:.1f} GiB fragmentation allowance "
               f"and 1 GiB CUDA context put it {over:.1f} GiB over" if alloc <= r["capacity_gib"]
               else f"allocated alone {alloc:.1f} GiB is {alloc - r['capacity_gib']:.1f} GiB over")
    return f"{r['id']}: needs {r['memory_gib']:.1f} of {r['capacity_gib']:.1f} GiB ({terms}); {verdict}"
