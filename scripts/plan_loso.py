"""Leave-one-source-out error of `overdrive plan`: for each source of src/overdrive/plan/published_runs.json,
refit every constant (scripts/plan_calibrate.py's fit, from a neutral start that no run set) on the runs of all
the other sources, and predict that source's runs with it. Writes docs/plan-loso.json, which
scripts/plan_validation_doc.py renders beside the in-sample figures.

    PYTHONPATH=src python scripts/plan_loso.py            # ~1 min per source with calibration runs, over the cores

Every source is predicted by constants that never saw it; a GEMM efficiency only it covered falls back to the
derived value (`plan_calibrate.derive`). `in_sample` is the same fit with nothing held out, `shipped` the
constants the planner ships (fitted on the calibration runs only).
"""

import concurrent.futures
import copy
import importlib.util
import json
import multiprocessing
import os
import statistics
import sys

from overdrive.plan.validation import load_runs, predict

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "docs", "plan-loso.json")

NEUTRAL = {"gemm_eff": {"pytorch": {8: 0.7, 9: 0.7, 10: 0.7}, "megatron": {8: 0.7, 9: 0.7, 10: 0.7}},
           "gemm_k0": 128.0, "lowp_rel": 1.0, "rowwise_rel": 0.8, "attn_rel": 0.7, "nocompile": 1.5}
"""The start of every refit: round numbers, set by no run (70% of peak, FP8 at its own peak, rowwise 80% of
tensorwise, attention at 70% of its kernel's benchmark rate, eager 1.5x the traffic)."""


def source_of(r: dict) -> str:
    """The source file or paper a run comes from (its versions and tables together: one source)."""
    return r["source"].split(" (")[0].split(",")[0].split(" @")[0]


def _calibrate():
    spec = importlib.util.spec_from_file_location("plan_calibrate", os.path.join(HERE, "plan_calibrate.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _row(p: dict) -> dict:
    out = {"id": p["id"], "role": p["role"], "error": round(p["error"], 4), "fits": p["fits"],
           "memory_only": p["memory_only"], "power_limited": "power-limited" in p["source"],
           "stack_bug": bool(p.get("stack_bug"))}
    if "memory_error" in p:
        out["memory_error"] = round(p["memory_error"], 4)
    return out


def _rated(r: dict) -> bool:
    """A row whose throughput is the hardware's and the stack's as rated: not power-limited, not a defect its own
    source flags (`stack_bug`); the others are shown, not counted in the figures."""
    return not (r["power_limited"] or r.get("stack_bug"))


def fit_set(runs: list[dict]) -> list[dict]:
    """The runs a fit may use: those with a throughput as rated (not memory-only, not the power-limited B200s, not
    a run its own source flags as a stack defect, `stack_bug`)."""
    return [r for r in runs if not r.get("memory_only") and "power-limited" not in r["source"]
            and not r.get("stack_bug")]


def _refit_without(src: str, runs: list[dict]) -> tuple[str, dict]:
    """One leave-one-source-out fold: the constants refitted from NEUTRAL on every other source's runs (the runs the
    caller loaded, so every fold fits the same data the caller predicts)."""
    cal = _calibrate().fit(fit_set([r for r in runs if source_of(r) != src]), start=copy.deepcopy(NEUTRAL),
                           log=lambda *_: None)
    return src, cal


def jobs_from_argv(argv: list[str]) -> int:
    """--jobs N (a positive integer), else one process per core: the fit is single-threaded Python."""
    if "--jobs" not in argv:
        return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))
    i = argv.index("--jobs") + 1
    if i >= len(argv) or not argv[i].isdigit() or int(argv[i]) < 1:
        raise SystemExit(f"plan_loso.py: --jobs needs a positive whole number of processes, got "
                         f"{argv[i] if i < len(argv) else 'nothing'!r}: e.g. --jobs 2")
    return int(argv[i])


def run(log=print, jobs: int = 1) -> dict:
    """Per source: the constants refitted on every other source's runs (calibration and validation alike), from
    NEUTRAL, and that source's errors with them (`loso`) and with the shipped constants (`shipped`); plus the
    in-sample refit on every source (`in_sample`), the same procedure with nothing held out. The folds are
    independent: with jobs > 1 (the script run as itself) they run in a process pool, the same result in any order."""
    cal_mod = _calibrate()
    runs = load_runs()
    sources = sorted({source_of(r) for r in runs})
    log("fit on every source, from the neutral start")
    all_fit = cal_mod.fit(fit_set(runs), start=copy.deepcopy(NEUTRAL), log=lambda *_: None)
    out = {"neutral_start": NEUTRAL, "fit_all_from_neutral": all_fit, "sources": {}}
    if jobs > 1:
        with concurrent.futures.ProcessPoolExecutor(max_workers=jobs,
                                                    mp_context=multiprocessing.get_context("spawn")) as pool:
            done = pool.map(_refit_without, sources, [runs] * len(sources))
            fits = {}
            for src, cal in done:
                log(f"refit without {src} done")
                fits[src] = cal
    else:
        fits = dict(_refit_without(src, runs) for src in sources)
    for src in sources:
        own = [r for r in runs if source_of(r) == src]
        cal = fits[src]
        out["sources"][src] = {"runs": len(own), "calibration_runs": sum(r["role"] == "calibration" for r in own),
                               "constants": cal, "loso": [_row(predict(r, cal)) for r in own],
                               "in_sample": [_row(predict(r, all_fit)) for r in own],
                               "shipped": [_row(predict(r)) for r in own]}
    return out


def stats(rows: list[dict]) -> dict:
    """median, worst |throughput error| and memory median/worst over rows (memory-only rows: memory only)."""
    t = [abs(r["error"]) for r in rows if not r["memory_only"]]
    m = [abs(r["memory_error"]) for r in rows if "memory_error" in r]
    return {"n": len(t), "median": statistics.median(t) if t else None, "worst": max(t) if t else None,
            "n_memory": len(m), "memory_median": statistics.median(m) if m else None,
            "memory_worst": max(m) if m else None, "not_fitting": sum(not r["fits"] for r in rows)}


if __name__ == "__main__":
    jobs_from_argv(sys.argv)   # a bad --jobs fails before the first fit, not after it
    out = sys.argv[sys.argv.index("--out") + 1] if "--out" in sys.argv else OUT
    res = run(log=lambda s: print(s, file=sys.stderr), jobs=jobs_from_argv(sys.argv))
    with open(out + ".tmp", "w") as f:
        json.dump(res, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(out + ".tmp", out)
    for key in ("shipped", "in_sample", "loso"):
        print(key, stats([r for s in res["sources"].values() for r in s[key] if _rated(r)]))


NOTHING_SHAPED = "none: added after every term, fitted on nothing, no term added for it"
POINTED_BF16 = ("added after every term, fitted on nothing; its H100 bf16 rows, all planned fast, sent "
                "dgxc-benchmarking's bf16 runs into the calibration")
DGXC = ("unseen when first planned (its first-sight errors: the megatron-in-bf16 section); then calibration: the first "
        "megatron runs in bf16 the fit sees (gemm_eff[megatron] H100, lowp_rel)")
NEMOTRON_FILE = ("none: a file added after every term, fitted on nothing (dgxc-benchmarking's llama3.1 files are "
                 "calibration)")
DESIGN = {
    "mosaicml/llm-foundry scripts/train/benchmarking/README.md":
        "fitted gemm_eff[pytorch] (A100, H100) and the shared constants; its MPT shapes set the presets; its rows "
        "carry the attention kernel they ran, MPT's Triton one (--attention triton, read from its benchmark scripts "
        "2026-12-07; read as FlashAttention-2 before, which had held attn_rel at 0.56)",
    "NVIDIA-NeMo/Megatron-Bridge docs/performance-summary.md":
        "fitted gemm_eff[megatron] (H100, Blackwell); its recipes set the offload, embedding-split, FP8-activation "
        "and in-place cross-entropy memory terms",
    "pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md":
        "fitted 3 runs; its 405B PP/CP rows shaped the FSDP-under-pipelining memory, the recompute buffer and "
        "the last stage's kept outputs",
    "pytorch/torchtitan benchmarks/llama3_8b_h200_2025-06_torchtitan.md": "fitted 1 run",
    "pytorch/ao torchao/float8/README.md": "fitted rowwise_rel, and lowp_rel with the other FP8 runs",
    "pytorch/torchtitan docs/performance.md": "FSDP memory checks (max_reserved × 1.08)",
    "pytorch/torchtitan docs/mxfp8.md": "none (power-limited hardware, read as such)",
    "NVIDIA/NeMo docs/source/performance/performance_summary.md":
        "first held out; then sent us to count Megatron's cross-entropy (52 B/logit) and master remainders",
    "Narayanan et al. 2021": "first held out; then sent us to unfused attention and to --sequence-parallel off",
    "Llama Team": "first held out; then sent us to the embedding/loss pipeline slots",
    "pytorch/torchtune README.md": "sent us to the eager block, compiled-fp32 and chunked losses (memory only)",
    "foundation-model-stack/fms-fsdp README.md": "none: added after every term, fitted on nothing, no term added for it",
    "bigscience-workshop/bigscience train/tr11-176B-ml":
        "unseen when first planned (its first-sight errors: the older-stacks section); then sent us to "
        "--deepspeed-pipeline, the tied embedding's all-reduce, --no-partition-activations and the bf16 grads the "
        "BF16_Optimizer keeps",
    "Smith et al. 2022": "unseen when first planned (its first-sight errors: the older-stacks section); then sent us "
                         "to --deepspeed-pipeline",
    "InternLM/InternLM doc/en/train_performance.md": "unseen when first planned (its first-sight errors: its own "
                                                     "section); then sent us to --zero-broadcast",
    "FlagOpen/FlagPerf training/nvidia/llama3_70B-megatron/README.md": POINTED_BF16,
    "FlagOpen/FlagPerf training/nvidia/llama3_8B-megatron/README.md": POINTED_BF16,
    "NVIDIA/dgxc-benchmarking llama3.1/README_405b.md": DGXC,
    "NVIDIA/dgxc-benchmarking llama3.1/README_70b.md": DGXC,
    "NVIDIA/dgxc-benchmarking llama3.1/README_8b.md": DGXC,
    "NVIDIA/Megatron-LM README.md": "unseen when first planned (its first-sight errors: the megatron-in-bf16 section), "
                                    "fitted on nothing; " + POINTED_BF16.split("; ", 1)[1],
    "allenai/OLMo-core README.md": "none: added after every term, fitted on nothing, no term added for it; its rows "
                                   "re-expressed with the cuDNN attention its PyTorch nightly ran and the loss of the "
                                   "commits its figures were measured at, read from its source after first sight",
    "jzhang38/TinyLlama README.md": "none: added after every term, fitted on nothing, no term added for it",
    "QwenLM/Qwen README.md": "unseen when first planned (the second blind check); then sent us to the host-bound floor "
                             "and DeepSpeed ZeRO-3's module hooks (measured, no constant fitted)",
    "huggingface/nanotron docs/benchmark_summary.svg": "unseen when first planned (the second blind check); then sent "
                                                       "us to the last stage keeping the loss alone and --zero-sliced",
    "snowflakedb/ArcticTraining news/qwen3-32b-dgx-station.md": "unseen when first planned (the second blind check); "
                                                                "then sent us to --doc-len and --gpu-mem",
    "alibaba/Megatron-LLaMA README.md": "unseen when first planned (the second blind check); then sent us to "
                                        "--attention fa1, --unfused-ops and ZeRO-2's reduce-scatter in every "
                                        "micro-batch",
    "hpcaitech/ColossalAI README.md": "unseen when first planned (the second blind check), fitted on nothing; then "
    "its 7B ZeRO-2 row's memory (planned not to fit) sent us to the loss's peak coming before the backward's",
    "huggingface/picotron README.md": "none: the second blind check, fitted on nothing, no term added for it",
    "stas00/ml-engineering insights/when-to-upgrade-gpus/README.md":
        "none fitted: added after every term, fitted on nothing; --attention fa3 added for the kernel its "
        "benchmark.py ran, at the FlashAttention-3 paper's share (no constant); its H200 memory rows sent us to "
        "the backward's own gradients and --no-zero-init (read from autograd and DeepSpeed's engine.py, no "
        "constant); its long-context rows, planned 30-46% slow, sent us to llm-foundry's source, whose rows had run "
        "the Triton attention kernel (--attention triton, the FlashAttention-2 paper's ratio, no constant): neither "
        "its memory nor its throughput is an unseen-source figure",
    "pytorch/torchtitan benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md":
        "none: a file added after every term, fitted on nothing (torchtitan's other files fitted constants)",
    "NVIDIA/dgxc-benchmarking nemotron/README_15b.md": NEMOTRON_FILE,
    "NVIDIA/dgxc-benchmarking nemo_megatron/README_175b.md": NEMOTRON_FILE.replace("every term", "the cast count")
                                                             + "; NeMo 24.07's calibration has the same model and "
                                                               "parallelism on 128 and 512 GPUs in FP8",
    "NVIDIA/dgxc-benchmarking nemotron/README_340b.md": NEMOTRON_FILE + "; NeMo 24.07's calibration has the same "
                                                        "model, parallelism and batch on 128 GPUs in FP8",
}
"""What each source did to the model beyond its rows' errors: a source that shaped a term is not unseen, even
where no constant was fitted on it (leave-one-source-out removes the fitting, not the design)."""


def _pct(x):
    return "—" if x is None else f"{100 * x:.1f}%"


def markdown(res: dict, before: dict | None = None) -> str:
    """The doc's section: per source, shipped / in-sample refit / leave-one-source-out, median and worst
    |throughput error| and memory beside them; then all sources together."""
    lines = ["| source | runs | shipped constants: median / worst | in-sample refit: median / worst | "
             "leave-one-source-out: median / worst | memory: median / worst | what it did to the model |",
             "|---|---:|---|---|---|---|---|"]
    tot = {k: [] for k in ("shipped", "in_sample", "loso")}
    for src, v in sorted(res["sources"].items()):
        st = {k: stats([r for r in v[k] if _rated(r)]) for k in tot}
        for k in tot:
            tot[k] += [r for r in v[k] if _rated(r)]
        if not st["loso"]["n"] and not st["loso"]["n_memory"]:
            continue
        cells = [f"{_pct(st[k]['median'])} / {_pct(st[k]['worst'])}" for k in tot]
        mem = f"{_pct(st['loso']['memory_median'])} / {_pct(st['loso']['memory_worst'])}"
        lines.append(f"| {src} | {st['loso']['n']} | " + " | ".join(cells) + f" | {mem} | {DESIGN.get(src, '')} |")
    st = {k: stats(tot[k]) for k in tot}
    lines.append(f"| **all sources** | {st['loso']['n']} | " +
                 " | ".join(f"**{_pct(st[k]['median'])} / {_pct(st[k]['worst'])}**" for k in tot) +
                 f" | {_pct(st['loso']['memory_median'])} / {_pct(st['loso']['memory_worst'])} | |")
    out = "\n".join(lines)
    if before:
        bt = {k: stats([r for v in before["sources"].values() for r in v[k] if _rated(r)]) for k in tot}
        out += ("\n\nThe same procedure on the planner before the communication and older-stack terms of this "
                "revision (git history): shipped " + f"{_pct(bt['shipped']['median'])} / {_pct(bt['shipped']['worst'])}"
                + f", in-sample refit {_pct(bt['in_sample']['median'])} / {_pct(bt['in_sample']['worst'])}"
                + f", leave-one-source-out {_pct(bt['loso']['median'])} / {_pct(bt['loso']['worst'])}.")
    return out


def summary_line(res: dict) -> dict:
    """{shipped, in_sample, loso}: stats over every source (power-limited runs apart)."""
    return {k: stats([r for v in res["sources"].values() for r in v[k] if _rated(r)])
            for k in ("shipped", "in_sample", "loso")}
