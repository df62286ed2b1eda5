"""Enumerate training configurations, estimate each, rank what fits, and say what would make the rest fit."""

from __future__ import annotations

import dataclasses
import json
import os

from overdrive.env.catalog import GpuSpec, gpu_by_key
from overdrive.plan.estimate import DEFAULT_EFFICIENCY, Estimate, TrainSetup, _flops, estimate
from overdrive.plan.specs import ModelSpec

__all__ = ["plan", "sweep", "longest_seq", "calibrate_from_bench", "PRECISIONS", "SHARDINGS", "CHECKPOINTING"]

PRECISIONS = ("fp32", "bf16", "fp8", "fp8-rowwise", "mxfp8")
SHARDINGS = ("none", "fsdp", "hsdp")
CHECKPOINTING = ("none", "selective", "full")


def _candidates(model: ModelSpec, base: TrainSetup, precisions, shardings, ckpts, micro_batches,
                global_batch: int | None) -> list[Estimate]:
    out = []
    for prec in precisions:
        if prec.startswith(("fp8", "mx")) and not base.gpu.fp8_tflops:
            continue
        if prec == "mxfp8" and base.gpu.sm[0] != 10:
            continue
        for sh in shardings:
            if sh == "hsdp" and base.nodes == 1:
                continue
            for ac in ckpts:
                for mb in micro_batches:
                    if global_batch and global_batch % (mb * base.world):
                        continue
                    s = dataclasses.replace(base, precision=prec, sharding=sh, checkpointing=ac, micro_batch=mb)
                    out.append(estimate(model, s))
    return out


def _label(s: TrainSetup) -> str:
    return f"{s.precision} · {s.sharding} · AC {s.checkpointing} · mb {s.micro_batch}"


def longest_seq(model: ModelSpec, base: TrainSetup, *, lo: int = 512, hi: int = 1 << 20, step: int = 512) -> int:
    """The longest sequence (a multiple of `step`) that fits, by bisection; 0 if even `lo` does not."""
    fits = lambda seq: estimate(model, dataclasses.replace(base, seq=seq)).fits  # noqa: E731
    if not fits(lo):
        return 0
    a, b = lo // step, hi // step
    while a < b:
        mid = (a + b + 1) // 2
        a, b = (mid, b) if fits(mid * step) else (a, mid - 1)
    return a * step


def _suggestions(model: ModelSpec, base: TrainSetup, smallest: Estimate) -> list[str]:
    """What would make the smallest-memory configuration fit."""
    s = smallest.setup
    out = []
    over = smallest.memory_gib - smallest.capacity_gib
    out.append(f"the leanest configuration ({_label(s)}) needs {smallest.memory_gib:.1f} GiB per GPU, "
               f"{over:.1f} GiB over the {smallest.capacity_gib:.0f} GiB of a {s.gpu.key}")
    for nodes in (2, 4, 8, 16, 32, 64):
        if nodes <= s.nodes:
            continue
        e = estimate(model, dataclasses.replace(s, nodes=nodes, sharding="fsdp"))
        if e.fits:
            out.append(f"more GPUs: FSDP over {nodes} nodes ({nodes * s.gpus_per_node} GPUs) fits at "
                       f"{e.memory_gib:.1f} GiB")
            break
    if s.checkpointing != "full":
        e = estimate(model, dataclasses.replace(s, checkpointing="full"))
        if e.fits:
            out.append(f"full activation checkpointing fits at {e.memory_gib:.1f} GiB")
    seq = longest_seq(model, dataclasses.replace(s, checkpointing="full"), hi=s.seq)
    if 0 < seq < s.seq:
        out.append(f"a shorter sequence: {seq} tokens fits with full checkpointing at micro-batch {s.micro_batch}")
    if s.precision.startswith(("fp8", "mx")) and not s.fp8_all_gather:
        e = estimate(model, dataclasses.replace(s, fp8_all_gather=True))
        if e.fits:
            out.append(f"FP8 all-gather fits at {e.memory_gib:.1f} GiB")
    if s.optimizer_dtype == "fp32":
        e = estimate(model, dataclasses.replace(s, optimizer_dtype="bf16"))
        if e.fits:
            out.append(f"bf16 optimizer states fit at {e.memory_gib:.1f} GiB")
    if len(out) == 1:
        out.append("nothing within this node does it: shard over more GPUs")
    return out


def _why(model: ModelSpec, top: Estimate, ranked: list[Estimate]) -> str:
    s = top.setup
    parts = [f"{_label(s)} is fastest that fits: {top.tokens_per_s_per_gpu:,.0f} tokens/s per GPU "
             f"({100 * top.mfu:.0f}% MFU) with {top.headroom_gib:.1f} GiB headroom"]
    bf16 = next((e for e in ranked if e.setup.precision == "bf16"), None)
    if s.precision != "bf16" and bf16:
        share = _flops(model, s)[2]
        parts.append(f"{s.precision} beats the best bf16 ({bf16.tokens_per_s_per_gpu:,.0f}) because the GEMMs, "
                     f"{100 * share:.0f}% of the FLOPs, run faster in FP8")
    if s.checkpointing == "none":
        parts.append("no recomputation is needed: the activations fit")
    else:
        parts.append(f"{s.checkpointing} checkpointing is the least recomputation that fits")
    parts.extend(top.notes)
    return "; ".join(parts)


def plan(model: ModelSpec, gpu: GpuSpec | str, *, gpus_per_node: int = 8, nodes: int = 1, seq: int = 4096,
         global_batch: int | None = None, precisions=None, shardings=None, checkpointing=None,
         micro_batches=(1, 2, 4, 8, 16, 32), optimizer_dtype: str = "fp32", fp8_all_gather: bool = False,
         efficiency: float = DEFAULT_EFFICIENCY, overlap: float = 0.9, intra_gbs: float | None = None,
         inter_gbs: float = 50.0) -> dict:
    g = gpu_by_key(gpu) if isinstance(gpu, str) else gpu
    if seq < 1 or gpus_per_node < 1 or nodes < 1:
        raise ValueError("sequence length, GPUs per node and nodes must be positive")
    base = TrainSetup(gpu=g, gpus_per_node=gpus_per_node, nodes=nodes, seq=seq, optimizer_dtype=optimizer_dtype,
                      fp8_all_gather=fp8_all_gather, efficiency=efficiency, overlap=overlap, intra_gbs=intra_gbs,
                      inter_gbs=inter_gbs)
    precisions = precisions or [p for p in ("bf16", "fp8", "fp8-rowwise", "mxfp8")]
    cands = _candidates(model, base, precisions, shardings or ("fsdp", "hsdp", "none"),
                        checkpointing or CHECKPOINTING, micro_batches, global_batch)
    if not cands:
        raise ValueError(f"no configuration to evaluate: global batch {global_batch} is not divisible by "
                         f"micro-batch x {base.world} GPUs for any micro-batch in {list(micro_batches)}")
    ranked = sorted([e for e in cands if e.fits], key=lambda e: (-e.tokens_per_s_per_gpu, e.memory_gib))
    result = {"model": dataclasses.asdict(model), "params_b": model.n_params() / 1e9, "gpu": g.key,
              "gpus_per_node": gpus_per_node, "nodes": nodes, "seq": seq, "global_batch": global_batch,
              "efficiency": efficiency, "candidates": [_cand_dict(e) for e in ranked]
              + [_cand_dict(e) for e in sorted((e for e in cands if not e.fits), key=lambda e: e.memory_gib)]}
    if ranked:
        result["top"] = _cand_dict(ranked[0])
        result["why"] = _why(model, ranked[0], ranked)
        result["suggestions"] = []
    else:
        smallest = min(cands, key=lambda e: e.memory_gib)
        result["top"] = None
        result["why"] = "nothing fits"
        result["suggestions"] = _suggestions(model, base, smallest)
    return result


def _cand_dict(e: Estimate) -> dict:
    s = e.setup
    return {"precision": s.precision, "sharding": s.sharding, "checkpointing": s.checkpointing,
            "micro_batch": s.micro_batch, "seq": s.seq, "fits": e.fits, "memory_gib": round(e.memory_gib, 3),
            "headroom_gib": round(e.headroom_gib, 3), "step_s": e.step_s, "compute_s": e.compute_s,
            "comm_s": e.comm_s, "tokens_per_s_per_gpu": e.tokens_per_s_per_gpu, "mfu": e.mfu,
            "breakdown": {k: round(v, 3) for k, v in e.breakdown_gib.items()}, "notes": e.notes}


SWEEP_MODELS = ("llama3-1b", "llama3-8b", "gpt-64b", "llama3-70b")


def sweep(models=SWEEP_MODELS, gpus=("b200", "b300"), precisions=("bf16", "fp8")) -> list[dict]:
    """The seed scenario: longest sequence that fits at micro-batch 1 on one 8-GPU node (FSDP, full AC)."""
    from overdrive.plan.specs import get_model

    rows = []
    for mname in models:
        m = get_model(mname)
        for gk in gpus:
            for prec in precisions:
                base = TrainSetup(gpu=gpu_by_key(gk), precision=prec, sharding="fsdp", checkpointing="full",
                                  micro_batch=1)
                seq = longest_seq(m, base)
                e = estimate(m, dataclasses.replace(base, seq=seq)) if seq else None
                rows.append({"model": mname, "params_b": m.n_params() / 1e9, "gpu": gk, "precision": prec,
                             "longest_seq": seq, "tokens_per_s_per_gpu": e.tokens_per_s_per_gpu if e else None,
                             "mfu": e.mfu if e else None, "memory_gib": e.memory_gib if e else None})
    return rows


def calibrate_from_bench(path: str) -> float:
    """Efficiency from our own bench: the best measured bf16 MFU (vs the BF16 peak) in results.json."""
    p = os.path.join(path, "results.json") if os.path.isdir(path) else path
    try:
        with open(p) as f:
            res = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"--calibrate {path}: cannot read a bench results.json ({e})") from None
    mfus = [m.get("mfu_bf16_peak") for c in res.get("configs", []) if c.get("precision") == "bf16" and c.get("safe")
            for m in c.get("models", {}).values()]
    mfus = [x for x in mfus if x]
    if not mfus:
        raise ValueError(f"--calibrate {path}: no bf16 configuration with a measured MFU (a GPU bench run is needed)")
    return max(mfus)
