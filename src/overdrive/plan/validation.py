"""The planner against published runs: src/overdrive/plan/published_runs.json holds each run's
configuration, its source and what it measured; `role` says whether the run calibrates the model's
constants (scripts/plan_calibrate.py fits them on those only) or validates it (never fitted on).
docs/plan-validation.md is rendered from here, and tests/unit/test_plan_validation.py recomputes it."""

from __future__ import annotations

import dataclasses
import json
import statistics
from importlib import resources

from overdrive.env.catalog import gpu_by_key
from overdrive.plan.estimate import estimate
from overdrive.plan.choices import HOST_US_RANGE
from overdrive.plan.memory import CONTEXT_BYTES, GIB, RESERVED_SHARE
from overdrive.plan.search import MICRO_BATCHES, default_margin_gib, rank
from overdrive.plan.setup import TrainSetup
from overdrive.plan.specs import MPT_SIZES, ModelSpec, get_model, mpt

__all__ = ["load_runs", "predict", "evaluate", "summary", "markdown_table", "why_not_fitting", "plan_flags", "run_model",
           "expressed_table", "memory_table", "implied_network", "implied_host_us", "NETWORK_RANGE"]

_SETUP_KEYS = ("seq", "micro_batch", "global_batch", "precision", "sharding", "tp", "pp", "vpp", "cp", "checkpointing",
               "pure_bf16", "fp8_all_gather", "compile", "async_tp", "inter_gbs", "host_us", "optimizer_dtype",
               "stack", "loss", "fp8_activations", "grad_dtype", "recompute_layers",
               "recompute_modules", "unfused_ops", "offload_activations", "embedding_in_pipeline_split", "attention",
               "block_code",
               "optimizer", "master_weights", "optimizer_in_backward", "sequence_parallel", "z_loss", "gather_dtype",
               "fused_kernels", "lora_rank", "deepspeed_pipeline", "partition_activations",
               "overlap_grad_reduce", "embed_norm", "dropout", "sp_regather", "intra_gbs", "zero_broadcast",
               "zero_sliced", "offload",
               "zero_init", "pp_keep_outputs", "doc_len")


def load_runs() -> list[dict]:
    return json.loads(resources.files("overdrive.plan").joinpath("published_runs.json").read_text())["runs"]


def _setup(r: dict) -> TrainSetup:
    per_node = r.get("gpus_per_node", min(8, r["gpus"]))
    # a board whose memory differs from the catalog's (plan --gpu-mem)
    return TrainSetup(gpu=gpu_by_key(r["gpu"], r.get("gpu_mem_gib")), gpus_per_node=per_node,
                      nodes=r["gpus"] // per_node,
                      **{"vpp": None, **{k: r[k] for k in _SETUP_KEYS if k in r}})   # no VP published: searched


def run_model(r: dict) -> ModelSpec:
    """A run's model: a preset name, an MPT at the run's sequence, or the shape written out (papers' models)."""
    if isinstance(r["model"], dict):
        return ModelSpec(**r["model"])
    return mpt(r["model"], r["seq"]) if r["model"] in MPT_SIZES else get_model(r["model"])


def _estimate_searching_micro_batch(m: ModelSpec, s: TrainSetup, cal: dict | None):
    """A run whose source does not publish its micro-batch: the micro-batches that divide each data-parallel
    rank's share of the global batch are tried and ranked as `overdrive plan` ranks them (its "expressed as" line
    omits --micro-batch): the fastest that leaves the safety margin free, else the fastest that fits."""
    share = s.global_batch // s.dp if s.global_batch else 1
    tried = [estimate(m, dataclasses.replace(s, micro_batch=mb), cal=cal) for mb in MICRO_BATCHES if share % mb == 0]
    margin = default_margin_gib(s.gpu)
    ranked = rank(tried, margin)
    best = ranked[0] if ranked else max(tried, key=lambda e: e.tokens_per_s_per_gpu)
    why = (f"the fastest leaving the {margin:g} GiB safety margin" if best.fits and best.headroom_gib >= margin else
           "the fastest that fits" if best.fits else "the fastest tried")
    best.notes.insert(0, f"micro-batch not published: {best.setup.micro_batch} chosen, {why}, of "
                         f"{[e.setup.micro_batch for e in tried]}")
    return best


def predict(r: dict, cal: dict | None = None) -> dict:
    """The planner's prediction for one published run, with the relative errors."""
    m = run_model(r)
    e = _estimate_searching_micro_batch(m, _setup(r), cal) if "micro_batch" not in r else estimate(m, _setup(r), cal=cal)
    out = {"id": r["id"], "role": r["role"], "gpu": r["gpu"], "precision": r["precision"], "published": r["tps"],
           "predicted": e.tokens_per_s_per_gpu, "error": e.tokens_per_s_per_gpu / r["tps"] - 1, "fits": e.fits,
           "source": r["source"], "memory_gib": e.memory_gib, "capacity_gib": e.capacity_gib,
           "allocated_gib": e.allocated_gib, "reserved_margin_gib": e.reserved_margin_gib,
           "breakdown_gib": e.breakdown_gib, "attention_share": e.times["attention"] / e.step_s,
           "vpp": e.setup.vpp, "micro_batch": e.setup.micro_batch, "held_out": r.get("held_out", "")}
    out["memory_only"] = bool(r.get("memory_only"))
    out["stack_bug"] = r.get("stack_bug", "")   # a defect the run's own source flags: shown, kept out of fits and bounds
    if r.get("memory_gib"):
        # torchtitan logs max_reserved: the allocator's view on a GPU with room (allocated + its cache), no CUDA
        # context; torchtune's "peak memory active" is the allocator's active bytes, what allocated models
        # max_memory_allocated reads the same
        allocated = r.get("memory_measure") in ("active", "allocated")
        planned = e.allocated_gib if allocated else e.cached_gib * (1 + RESERVED_SHARE)
        if r.get("memory_measure") == "nvidia-smi":   # the process's whole footprint: the cache, the CUDA context
            planned += CONTEXT_BYTES / GIB + e.nccl_gib  # and NCCL's buffers
        out.update(memory_published=r["memory_gib"], memory_predicted=planned,
                   memory_error=planned / r["memory_gib"] - 1, memory_measure=r.get("memory_measure", "reserved"),
                   # FSDP alone: with TP and PP beside it torchtitan keeps more than the planner models (the doc's
                   # "known gaps"), so those runs are shown but not counted in the FSDP memory figure
                   memory_fsdp=r.get("sharding") == "fsdp" and r.get("tp", 1) == 1 and r.get("pp", 1) == 1)
    return out


NETWORK_RANGE = (0.25, 800.0)
"""Per-GPU inter-node GB/s `implied_network` searches: a quarter of a 2 Gb/s link to four 1.6 Tb/s NICs per GPU."""


def _implied(r: dict, key: str, lo: float, hi: float, cal: dict | None, rising: bool) -> float | None:
    """The value of setup field `key` in [lo, hi] at which the plan meets the run's published tokens/s (its error
    `rising` or falling with the value), by geometric bisection to 1%; None when no value in the range does."""
    def err(v: float) -> float:
        e = predict({**r, key: v}, cal)["error"]
        return e if rising else -e

    if err(lo) > 0 or err(hi) < 0:
        return None
    while hi / lo > 1.01:
        mid = (lo * hi) ** 0.5
        lo, hi = (mid, hi) if err(mid) < 0 else (lo, mid)
    return (lo * hi) ** 0.5


def implied_network(r: dict, cal: dict | None = None) -> float | None:
    """The per-GPU inter-node bandwidth (GB/s one way, as --inter-gbs) at which the plan meets the run's published
    tokens/s, or None: a run on one node, or no bandwidth in `NETWORK_RANGE` closes the gap (what the plan misses is
    not the network). A diagnostic of the tail, not a fit: nothing is changed by it."""
    if _setup(r).nodes <= 1:
        return None
    return _implied(r, "inter_gbs", *NETWORK_RANGE, cal, rising=True)


def implied_host_us(r: dict, cal: dict | None = None) -> float | None:
    """The host's µs per eager op (as --host-us) at which the plan meets the run's published tokens/s, or None: no
    value in HOST_US_RANGE does (the plan is slower than published even at the fastest host, or the host's dispatch
    cannot slow it enough). A diagnostic, as `implied_network`."""
    return _implied(r, "host_us", *HOST_US_RANGE, cal, rising=False)


def evaluate(role: str | None = None, cal: dict | None = None) -> list[dict]:
    return [predict(r, cal) for r in load_runs() if role is None or r["role"] == role]


def summary(rows: list[dict]) -> dict:
    """Throughput errors over the rows that count for throughput (not the memory-only ones), the FSDP memory
    figure (torchtitan), the held-out memory figure and the completed runs planned not to fit."""
    tput = [r for r in rows if not r.get("memory_only")]
    errs = [abs(r["error"]) for r in tput]
    mem = [abs(r["memory_error"]) for r in rows if r.get("memory_fsdp")]
    held = [abs(r["memory_error"]) for r in rows if "memory_error" in r and r.get("held_out")]
    return {"n": len(tput), "median_abs_error": statistics.median(errs), "worst_abs_error": max(errs),
            "worst": max(tput, key=lambda r: abs(r["error"]))["id"], "under": sum(r["error"] < 0 for r in tput),
            "n_memory": len(mem), "memory_median_abs_error": statistics.median(mem) if mem else None,
            "memory_worst_abs_error": max(mem) if mem else None,
            "n_memory_held_out": len(held), "memory_held_out_median": statistics.median(held) if held else None,
            "memory_held_out_worst": max(held) if held else None,
            "not_fitting": [r["id"] for r in rows if not r["fits"]]}


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
    allocator counter would read) fits without the fragmentation allowance, the CUDA context and NCCL's buffers."""
    b = r["breakdown_gib"]
    over = r["memory_gib"] - r["capacity_gib"]
    names = {"activations": "activations+logits", "other": "buffers+context+NCCL+fragmentation"}
    terms = ", ".join(f"{names.get(k, k)} {v:.1f}" for k, v in sorted(b.items(), key=lambda kv: -kv[1]))
    alloc = r["allocated_gib"]
    verdict = (f"allocated {alloc:.1f} GiB fits; the {r['reserved_margin_gib']:.1f} GiB fragmentation allowance, "
               f"1 GiB CUDA context and NCCL's buffers put it {over:.1f} GiB over" if alloc <= r["capacity_gib"]
               else f"allocated alone {alloc:.1f} GiB is {alloc - r['capacity_gib']:.1f} GiB over")
    return f"{r['id']}: needs {r['memory_gib']:.1f} of {r['capacity_gib']:.1f} GiB ({terms}); {verdict}"


_FLAG_DEFAULTS = {"micro_batch": None, "precision": None, "sharding": None, "tp": 1, "pp": 1, "cp": 1, "vpp": None,
                  "checkpointing": None, "stack": "pytorch", "loss": "standard", "grad_dtype": "fp32",
                  "optimizer_dtype": "fp32", "intra_gbs": None, "inter_gbs": None, "host_us": None,
                  "recompute_layers": 0, "offload_activations": 0,
                  "attention": "flash", "optimizer": "adamw", "master_weights": "fp32", "block_code": "", "lora_rank": 0,
                  "offload": "none", "doc_len": 0}
_BOOL_FLAGS = {"pure_bf16": "--pure-bf16", "fp8_all_gather": "--fp8-all-gather", "fp8_activations": "--fp8-activations",
               "embedding_in_pipeline_split": "--embedding-in-pipeline-split",
               "optimizer_in_backward": "--optimizer-in-backward", "z_loss": "--z-loss",
               "fused_kernels": "--fused-kernels", "deepspeed_pipeline": "--deepspeed-pipeline",
               "embed_norm": "--embed-norm", "dropout": "--dropout", "zero_broadcast": "--zero-broadcast",
               "zero_sliced": "--zero-sliced", "pp_keep_outputs": "--pp-keep-outputs"}


def plan_flags(r: dict) -> str:
    """The `overdrive plan` command line that plans this run (what the doc's tables call "expressed as")."""
    m = run_model(r)   # an MPT at the run's sequence (its position table) is not the preset: written out
    d = r["model"] if isinstance(r["model"], dict) else None if m == get_model(r["model"]) else dataclasses.asdict(m)
    if d is not None:
        out = [f"--layers {d['n_layer']} --hidden {d['hidden']} --heads {d['n_head']}"]
        out += [f"--kv-heads {d['n_kv_head']}"] if d["n_kv_head"] != d["n_head"] else []
        head = d.get("attn_head_dim", 0)
        out += [f"--head-dim {head}"] if head not in (0, d["hidden"] // d["n_head"]) else []
        out += [f"--ffn {d['ffn']} --vocab {d['vocab']}"]
        out += [f for f, on in (("--tied", d.get("tied")), ("--gelu-mlp", not d.get("gated_mlp", True)
                                                             and not d.get("squared_relu")),
                                ("--squared-relu", d.get("squared_relu")), ("--bias", d.get("bias")),
                                ("--qk-norm", d.get("qk_norm"))) if on]
        out += [f"--learned-pos {d['learned_pos']}"] if d.get("learned_pos") else []
    else:
        out = [f"--model {r['model']}"]
    per_node = r.get("gpus_per_node", min(8, r["gpus"]))
    out += [f"--gpu {r['gpu']} --gpus {per_node}"] + ([f"--nodes {r['gpus'] // per_node}"] if r["gpus"] > per_node else [])
    out += [f"--seq {r['seq']}"]
    if r.get("global_batch"):
        out.append(f"--global-batch {r['global_batch']}")
    for k, default in _FLAG_DEFAULTS.items():
        v = r.get(k, default)
        if isinstance(v, (list, tuple)):
            v = ",".join(v)
        if k == "checkpointing":
            v = v or "none"   # given always: the CLI searches what is not given
        if v is not None and v != default:
            out.append(f"--{k.replace('_', '-')} {v}")
    if r.get("recompute_modules"):
        mods = r["recompute_modules"]
        out.append(f"--recompute-modules {mods if isinstance(mods, str) else ','.join(mods)}")
    if r.get("unfused_ops"):
        out.append(f"--unfused-ops {','.join(r['unfused_ops'])}")
    out += [flag for k, flag in _BOOL_FLAGS.items() if r.get(k)]
    if r.get("sequence_parallel") is False:
        out.append("--sequence-parallel off")
    elif r.get("sp_regather") and r.get("tp", 1) > 1:
        out.append("--sequence-parallel regather")
    if r.get("partition_activations") is False:
        out.append("--no-partition-activations")
    if r.get("overlap_grad_reduce") is False:
        out.append("--no-overlap-grad-reduce")
    if r.get("zero_init") is False:
        out.append("--no-zero-init")
    if r.get("gather_dtype"):
        out.append(f"--gather-dtype {r['gather_dtype']}")
    if r.get("compile") is False:
        out.append("--no-compile")
    if r.get("async_tp") is True:
        out.append("--async-tp")
    elif r.get("async_tp") is False and r.get("stack") == "megatron":
        out.append("--no-async-tp")
    return " ".join(out)


def memory_table(rows: list[dict]) -> str:
    """Held-out runs with a published peak memory: how each was expressed, published and planned GiB."""
    runs = {r["id"]: r for r in load_runs()}
    lines = ["| run | expressed as (`overdrive plan` flags) | published GiB | planned GiB | error | tok/s published → planned |",
             "|---|---|---:|---:|---:|---|"]
    for p in rows:
        if "memory_published" not in p or not p.get("held_out"):
            continue
        lines.append(f"| {p['id']} | `{plan_flags(runs[p['id']])}` | {p['memory_published']:.1f} | "
                     f"{p['memory_predicted']:.1f} | {100 * p['memory_error']:+.0f}% | {p['published']:,.0f} → "
                     f"{p['predicted']:,.0f} ({100 * p['error']:+.0f}%) |")
    return "\n".join(lines)


def expressed_table(rows: list[dict]) -> str:
    """Held-out runs with how each was expressed (the plan flags) and its source (file + commit, or paper)."""
    runs = {r["id"]: r for r in load_runs()}
    lines = ["| run | expressed as (`overdrive plan` flags) | source | published tok/s/GPU | planned | error | vpp |",
             "|---|---|---|---:|---:|---:|---:|"]
    for p in rows:
        r = runs[p["id"]]
        fit = ("" if p["fits"] else " (planned not to fit)") + (" (memory only)" if p.get("memory_only") else "")
        vpp = f"{p['vpp']}" + (" (searched)" if r.get("pp", 1) > 1 and "vpp" not in r else "")
        lines.append(f"| {p['id']}{fit} | `{plan_flags(r)}` | {r['source']} | {p['published']:,.0f} | "
                     f"{p['predicted']:,.0f} | {100 * p['error']:+.0f}% | {vpp} |")
    return "\n".join(lines)
