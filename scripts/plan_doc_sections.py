"""Sections of docs/plan-validation.md that scripts/plan_validation_doc.py renders: the leave-one-source-out
figures (from docs/plan-loso.json, written by scripts/plan_loso.py), the communication model's fixed constants,
and the kernel-level account of the Megatron stack."""

import importlib.util
import json
import os
import statistics

from overdrive.plan.collectives import (LINK_EFF, RING_BASE_US, RING_HOP_US, RING_PLATEAU, TREE_HOP_US,
                                        TREE_MAX_GBS)
from overdrive.plan.comm import ASYNC_TP_EXPOSED, DDP_BUCKET_BYTES, DDP_FIRST_BUCKET_BYTES
from overdrive.plan.memory import GIB
from overdrive.plan.throughput import (CALIBRATION, MEGATRON_CE_BYTES, SRELU_UNFUSED_ELEMS, UNFUSED_ATTN_BYTES,
                                      UNFUSED_DROPOUT_BYTES, Z_LOSS_BYTES)
from overdrive.plan.validation import expressed_table, load_runs, summary
from plan_doc_blind2 import BLIND2_SHAPED
from plan_doc_blind3 import BLIND3_SHAPED
from plan_doc_helpers import _med_worst, _span

HERE = os.path.dirname(os.path.abspath(__file__))
LOSO = os.path.join(HERE, "..", "docs", "plan-loso.json")


def _loso_module():
    spec = importlib.util.spec_from_file_location("plan_loso", os.path.join(HERE, "plan_loso.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _calibrate_shared() -> list[str]:
    spec = importlib.util.spec_from_file_location("plan_calibrate", os.path.join(HERE, "plan_calibrate.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.SHARED


def loso_result() -> dict:
    with open(LOSO) as f:
        return json.load(f)


def loso_summary() -> dict:
    return _loso_module().summary_line(loso_result())


def loso_section() -> str:
    mod = _loso_module()
    res = loso_result()
    s = mod.summary_line(res)
    gap = 100 * (s["loso"]["median"] - s["in_sample"]["median"])
    return f"""## Leave-one-source-out: the error on a source no constant saw

`scripts/plan_loso.py` refits every fitted constant of `CALIBRATION` (gemm_eff per stack and GPU generation,
{', '.join(_calibrate_shared())}; gemm_k0 is fixed) once per source, on the runs of all the other sources (calibration and validation rows alike, the power-limited B200s and
the memory-only rows apart), from a neutral start no run set ({_neutral(res['neutral_start'])}), and predicts the
held-out source with those constants. A source's GEMM efficiency that only it covered falls back to the derived
value (`plan_calibrate.derive`: Hopper's for a PyTorch generation with no run; a stack's edge over PyTorch carried
between Hopper and Blackwell; Ampere's PyTorch value for Megatron, the same cuBLAS GEMMs). Beside it: the
constants the planner ships (fitted on the calibration rows only) and the same refit with nothing held out
(in-sample). A change that lowers the in-sample error but raises the leave-one-source-out one is not an
improvement.

{mod.markdown(res)}

Over every source: in-sample {100 * s['in_sample']['median']:.1f}% median, {100 * s['in_sample']['worst']:.0f}% worst;
leave-one-source-out {100 * s['loso']['median']:.1f}% median, {100 * s['loso']['worst']:.0f}% worst
({gap:+.1f} points on the median; the target is within 2). Memory does not depend on the fitted constants:
{100 * s['loso']['memory_median']:.1f}% median, {100 * s['loso']['memory_worst']:.0f}% worst over {s['loso']['n_memory']} runs with a published peak.

**What this does not remove.** Leaving a source out of the fit does not leave it out of the design: the last
column says what each source did to the model, and every source in this repository did something (a term
counted, a setting expressed, a constant fitted). No figure on this page is the error on a source the model
never saw; that figure comes only from runs outside this repository.
"""


def _neutral(n: dict) -> str:
    ge = n["gemm_eff"]["pytorch"]
    first = next(iter(ge.values()))
    return (f"GEMM efficiency {first} everywhere, k0 {n['gemm_k0']:g}, FP8 at {n['lowp_rel']:g} of its peak, rowwise "
            f"{n['rowwise_rel']:g}, attention {n['attn_rel']:g}, eager traffic ×{n['nocompile']:g}")


def comm_section() -> str:
    return f"""## Communication: what is taken from the sources, not fitted

Each collective is bytes × the bus-bandwidth factor of NVIDIA/nccl-tests `doc/PERFORMANCE.md` (all-reduce
2(n−1)/n, all-gather and reduce-scatter (n−1)/n) over {100 * LINK_EFF:.0f}% of the link (NVLink inside a node;
across nodes one ring per rail, k members of the group per node over k NICs), plus NCCL's own latency model
(`src/graph/tuning.cc` `ncclTopoTuneModel`, Simple protocol): a ring pays {RING_BASE_US} µs + {RING_HOP_US['nvlink']} µs per
NVLink hop + {RING_HOP_US['net']} µs per network hop (×{RING_PLATEAU} for a large multi-node all-reduce), a tree
2·((GPUs per node − 1)·{TREE_HOP_US['nvlink']:g} + log2(nodes)·{TREE_HOP_US['net']:g}) µs at half of min(0.9·busBW,
{TREE_MAX_GBS:g} GB/s); an all-reduce takes the cheaper, as NCCL does. Calls per step: FSDP three per block and
micro-batch; PyTorch DDP one per bucket as its Reducer rebuilds them after the first step (whole tensors in
gradient order, a Llama-family model's q, k and v apart as PyTorch code registers them, each closing once it
reaches `bucket_cap_mb`'s {DDP_BUCKET_BYTES >> 20} MiB, the first
{DDP_FIRST_BUCKET_BYTES >> 20} MiB; checked against torch's own `rebuilt_bucket_sizes` in the tests); Megatron's DDP and
distributed optimizer one per max(40M, 1M·dp) parameters (`DistributedDataParallelConfig.bucket_size`); FSDP2 as
ZeRO-1/2 one per block. Overlap: DDP/ZeRO buckets go out one after another as the backward produces them, leaving
max(t_last, nb·t − (nb−1)·c) after it, t_last the last bucket's (PyTorch DDP's holds the embedding); an all-reduce
(DDP, `--zero-broadcast`) hides under the last micro-batch's backward alone, no gradient being ready in its forward,
where Megatron's ZeRO-1 gathers its parameters under the next forward; FSDP's calls hide under the block beside them except the first gather and
the last reduce-scatter, which on the PyTorch stack are the root unit's (the embedding, final norm and untied head
fully_shard leaves outside the blocks: 1.05B parameters of Llama 3 8B, about five blocks' worth) and one block's. TP across nodes runs over the NICs and is not overlapped (userbuffers and async TP
need NVLink); overlapped inside a node, {100 * ASYNC_TP_EXPOSED:.0f}% of it stays exposed. Pipeline sends pay a p2p latency
and their bytes. None of these numbers was fitted. At 512 ranks the latency is a third of a data-parallel step:
a 1.3B model over 64 DGX A100 nodes at one sequence per GPU, 73 DDP buckets, is planned communication-bound, under
half its one-node speed (`tests/unit/test_plan_at_scale.py`).
"""


def _stack_bias(rows: list[dict], stack: str) -> str:
    runs = {r["id"]: r for r in load_runs()}
    e = [r["error"] for r in rows if runs[r["id"]].get("stack", "pytorch") == stack and not r["memory_only"]
         and "power-limited" not in r["source"]]
    return f"median {100 * statistics.median(e):+.1f}% (signed), median |error| {100 * statistics.median(map(abs, e)):.1f}%, n={len(e)}"


def megatron_section(rows: list[dict]) -> str:
    return f"""## The Megatron stack, kernel by kernel

A Megatron row is over-predicted when the plan misses a kernel it runs, so the stack's kernels are counted one
by one rather than absorbed into its GEMM efficiency. What `--stack megatron` charges, and where from:

| kernel | counted as | source |
|---|---|---|
| LayerNorm/RMSNorm, residual adds, RoPE, bias + GeLU/SwiGLU | 12h + 2kv + 3F (2F for GeLU) elements × 2 bytes, × 3 forward + backward, per token per block, on tokens/tp with sequence parallelism and on every token of a TP rank without it (`--sequence-parallel off`) | Transformer Engine's and Megatron's fused kernels; Korthikanti et al. 2022 |
| squared ReLU (Nemotron) | unfused: + {SRELU_UNFUSED_ELEMS:.0f}F elements × 2 bytes per token per block over a fused activation (forward relu and pow; backward pow's copy, scale and multiply, relu's threshold_backward: 14 against 6) | `megatron/core/transformer/mlp.py` fuses only GeLU and SwiGLU ("Only support fusion of gelu and swiglu"); `megatron/core/activations.py` `squared_relu` = `torch.pow(F.relu(x), 2)` |
| softmax, mask, attention dropout | flash attention: in the attention kernel; `--attention unfused`: the two score GEMMs + {UNFUSED_ATTN_BYTES:.0f} bytes per score (+ {UNFUSED_DROPOUT_BYTES:.0f} with `--dropout`) | Megatron's fused scale-mask-softmax, counted by kernel |
| hidden dropout | not counted: ~4h bytes per token per block (a 1-byte mask written and read, twice), about 1% of a GPT-3 5B step | Megatron's bias-dropout-add |
| cross-entropy | {MEGATRON_CE_BYTES:.0f} bytes per logit (vocab-parallel, unfused), 8 with Transformer Engine's (`--loss inplace`); + {Z_LOSS_BYTES:.0f} with an unfused z-loss | `megatron/core/tensor_parallel/cross_entropy.py` |
| optimizer step | 16 + 8 per state bytes per parameter of the shard (AdamW 32) over HBM | Apex/TE fused Adam |
| gradient reduce / parameter gather | per bucket, NCCL bandwidth + latency, under the backward bucket by bucket | above |
| TP collectives | 8 per block (+ recompute), 30% exposed with `tp_comm_overlap`, all of it across nodes | above |
| pipeline p2p | per micro-batch and virtual stage, latency + b·s·h·2/tp bytes | above |

Where the Megatron rows stand now: {_stack_bias(rows, 'megatron')}; the PyTorch rows: {_stack_bias(rows, 'pytorch')}.
The account below was written while NeMo 24.07's rows were held out and the megatron Hopper efficiency came from
Megatron-Bridge's two runs alone (its figures are of that time; NeMo's rows now calibrate that efficiency, the
summary says why). What was left on the small NeMo 24.07 models (GPT-3 5B/20B, Nemotron-8B, +15-19% after the squared ReLU above
took Nemotron-8B from +21%) is not a kernel this table misses by its bytes: hidden dropout is ~1%, the optimizer
and the gradient reduce are hidden or small. The candidates that are not modelled are per-step fixed costs (FP8
amax reductions and scale updates, the gradient-norm all-reduce, data loading and logging), which weigh most on
the smallest models' short steps, and a container a year older than the Megatron-Bridge runs that set the
megatron constants.

Checked and not adopted, each against the published configuration (NVIDIA/NeMo-Framework-Launcher
`launcher_scripts/conf/training/`: `gpt3/5b.yaml` @ 00af8f26, `gpt3/5b_fp8_performance.yaml` @ 1e46ac6c,
`gpt3/175b.yaml` @ 056a90ed, `nemotron/nemotron_8b.yaml` @ 089b90e6; the launcher's configs, not pinned to the
24.07 tag):

1. **Data-parallel traffic left exposed.** The three rows are the only NeMo rows data-parallel over 8 nodes
   without pipelining, so un-overlapped gradient and parameter traffic was the first suspect. The configs say
   otherwise: NeMo 1.x runs Apex's `distributed_fused_adam` with `overlap_grad_sync: True` and
   `overlap_param_sync: true` (buckets of 100-400 MB) on all of them. And it would not fit: with every byte of
   the planned data-parallel traffic exposed (no overlap at all) GPT-3 5B reads +13.6%, GPT-3 20B -4.3%,
   Nemotron-8B +3.3% — no one term moves three rows that far apart. The last bucket (the first blocks'
   gradients, which nothing hides) is charged already and is 1-2 ms.
2. **The pipelined siblings agree by cancellation.** The planner charges the pipeline's point-to-point sends as
   exposed (5-12% of the NeMo PP rows' steps), but NeMo's interleaved runs set `overlap_p2p_comm: True`
   (`175b.yaml`; it is Megatron-LM's default under interleaving too), so those sends run beside the next chunk's
   compute. Hidden as the config says, the NeMo PP rows read +9-14% (GPT-3 175B +12.0/+8.7%, Nemotron-22B +13.6%,
   Llama 2 70B +13.2%), the same band as the three data-parallel rows: the residual is the NeMo 24.07 source's,
   not data parallelism's. Modelling the overlap alone raises the median over every row (6.8% to 7.7%) and the Megatron rows'
   (6.7% to 8.7%) because it uncovers the missing per-step cost rather than adding one, so the send charge
   stays, named here as a compensating term until that cost is found.
3. **Dropout.** The GPT-3 configs run hidden and attention dropout 0.1 (not counted, ~1%, table above);
   Nemotron-8B runs none (`hidden_dropout: 0.0`, `attention_dropout: 0.0`) and is as far off, so dropout is not
   it.
4. **FP8 GEMMs at small widths:** a tile's fixed cost (prologue, epilogue, scaling) takes the same time at any
   rate, so at FP8's 2x rate the inner-dimension roll-off k0 is worth twice the K-steps. Derived, not fitted, it
   lowered every FP8 row by about a point, the small models no more than the large; refitted, the validation
   median went from 7.4% to 7.9%, so it is not in the model.
5. **Slower data-parallel links:** at a quarter of the 8-rail bus bandwidth NCCL reaches, GPT-3 20B turns -28%
   while GPT-3 5B and Nemotron-8B stay +17-21%, so the link is not the missing term either.
"""



def first_sight_rows(val: list[dict]) -> list[dict]:
    """The validation rows added with what they were first planned at, before anything was changed for them: each
    with its error as first planned (`first_planned`, tokens/s; `first_memory`, GiB, as the row's memory measure
    reads) and now."""
    runs = {r["id"]: r for r in load_runs()}
    out = []
    for p in val:
        r = runs[p["id"]]
        if "first_planned" in r or "first_memory" in r:
            out.append({**p, "first_planned": r.get("first_planned"), "first_memory": r.get("first_memory"),
                        "first_error": r["first_planned"] / r["tps"] - 1 if "first_planned" in r else None,
                        "first_memory_error": r["first_memory"] / r["memory_gib"] - 1 if "first_memory" in r else None})
    return out


OLDER_STACK_SOURCES = ("bigscience-workshop/bigscience", "Smith et al. 2022")
"""The Megatron-DeepSpeed sources of the older-stacks section (BLOOM-176B, MT-NLG 530B)."""


MCORE_UNSEEN = ("FlagOpen/FlagPerf", "NVIDIA/dgxc-benchmarking")
"""The Megatron-core/NeMo sources added unseen after every term (FlagPerf's Llama 3 runs, dgxc-benchmarking's
Llama 3.1 runs), planned on arrival: FlagPerf's fitted on nothing, dgxc-benchmarking's calibration since (the
first megatron runs in bf16 the fit sees)."""


def is_older_stack(r: dict) -> bool:
    return r["source"].startswith(OLDER_STACK_SOURCES)


SHAPED_AFTER_FIRST_SIGHT = (OLDER_STACK_SOURCES + ("InternLM/InternLM", "NVIDIA/Megatron-LM") + MCORE_UNSEEN
                            + ("stas00/ml-engineering",) + BLIND2_SHAPED + BLIND3_SHAPED)
"""Sources first planned unseen that then sent us to a term or into the calibration: the older stacks
(--deepspeed-pipeline and the rest), InternLM's table (--zero-broadcast), the Megatron-core bf16 runs planned
fast (Megatron-LM's weak-scaling table and FlagPerf, fitted on nothing; dgxc-benchmarking, calibration since), and
ml-engineering's sweep (its memory to the backward's gradients and --no-zero-init; its long-context throughput to
llm-foundry's rows, which had run the Triton attention kernel, not FlashAttention-2), and the second blind check's
Qwen, nanotron and ArcticTraining rows (`plan_doc_blind2.BLIND2_SHAPED`), the third's flash-attention rows
(`plan_doc_blind3.BLIND3_SHAPED`). Their first-sight errors are
kept; they are not "sources that shaped nothing"."""


def shaped_after_first_sight(r: dict) -> bool:
    return r["source"].startswith(SHAPED_AFTER_FIRST_SIGHT)




def _older_facts(rows: list[dict], val: list[dict]) -> dict:
    """The figures the section's text quotes, computed from the rows and the planner."""
    from overdrive.plan.estimate import estimate
    from overdrive.plan.validation import _setup, predict, run_model

    runs = {r["id"]: r for r in load_runs()}
    bloom = {k: runs[k] for k in runs if k.startswith("BLOOM-176B")}
    full = next(r for k, r in bloom.items() if k.endswith("GBS2048"))
    small = next(r for k, r in bloom.items() if k.endswith("GBS16"))
    ef, es = estimate(run_model(full), _setup(full)), estimate(run_model(small), _setup(small))
    mt = [runs[r["id"]] for r in rows if r["id"].startswith("MT-NLG")]
    fp16 = [predict({**r, "precision": "fp16"})["error"] for r in mt]
    meg = next(runs[r["id"]] for r in val if r["id"].startswith("Megatron-LM 2021 529.6B"))
    meg_err = next(r["error"] for r in val if r["id"] == meg["id"])
    m = run_model(full)
    return {"accum_mb_ms": 1e3 * ef.times["fp32_grad_accum"] / ef.setup.grad_accum,
            "accum_s": ef.times["fp32_grad_accum"], "reduce_s": ef.times["dp_exposed"] + ef.times["embed_allreduce"],
            "dp_s": ef.times["dp_exposed"], "embed_s": ef.times["embed_allreduce"], "step_s": ef.step_s,
            "embed_gb": m.vocab * m.hidden / full["tp"] * 4 / 1e9, "inter": full["inter_gbs"],
            "small_share": (es.times["dp_exposed"] + es.times["embed_allreduce"]) / es.step_s,
            "fp16": (min(fp16), max(fp16)), "meg_tf": meg["published_tflops"], "meg_err": meg_err,
            "mt_tf": mt[0]["published_tflops"], "mt_nodes": mt[0]["gpus"] // 8, **_narayanan_loso()}


def _narayanan_loso() -> dict:
    """Narayanan et al. held out: the megatron A100 GEMM efficiency the refit took, and that source's errors."""
    src = loso_result()["sources"].get("Narayanan et al. 2021")
    if not src:
        return {"nar_eff": None, "nar_med": None}
    eff = src["constants"]["gemm_eff"]["megatron"]
    return {"nar_eff": eff.get("8", eff.get(8)),
            "nar_med": statistics.median(abs(r["error"]) for r in src["loso"] if not r["memory_only"])}


def older_stacks_section(val: list[dict]) -> str:
    """BLOOM-176B and MT-NLG 530B (Megatron-DeepSpeed): their errors as first planned, what they then sent us to
    model (--deepspeed-pipeline, the tied embedding's all-reduce), their errors after."""
    rows = [r for r in first_sight_rows(val) if is_older_stack(r)]
    if not rows:
        return ""
    f = _older_facts(rows, val)
    lines = ["| run | published tok/s/GPU | first planned | error | planned now | error | memory published GiB | "
             "first planned | error | planned now | error |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        tp = (f"{r['first_planned']:,.1f} | {100 * r['first_error']:+.0f}%" if r["first_error"] is not None
              else "(added after the term) | ")
        mem = (f"{r['memory_published']:.0f} | {r['first_memory']:.1f} | {100 * r['first_memory_error']:+.0f}% | "
               f"{r['memory_predicted']:.1f} | {100 * r['memory_error']:+.0f}%" if r["first_memory_error"] is not None
               else " | | | | ")
        lines.append(f"| {r['id']} | {r['published']:,.1f} | {tp} | {r['predicted']:,.1f} | {100 * r['error']:+.0f}% | {mem} |")
    first = [r["first_error"] for r in rows if r["first_error"] is not None]
    now = [r["error"] for r in rows if r["first_error"] is not None]
    mem_first = [r["first_memory_error"] for r in rows if r["first_memory_error"] is not None]
    mem_now = [r["memory_error"] for r in rows if r["first_memory_error"] is not None]
    by = {}
    for r in rows:
        if r["first_error"] is not None:
            by.setdefault(r["id"].split()[0], []).append(r)
    per = "; ".join(f"{k} ({len(v)} runs): first {_med_worst([r['first_error'] for r in v])}, now "
                    f"{_med_worst([r['error'] for r in v])}" for k, v in by.items())
    later = [r["error"] for r in rows if r["first_error"] is None]
    table = "\n".join(lines)
    return f"""## The older stacks, unseen when first planned: BLOOM-176B and MT-NLG 530B (Megatron-DeepSpeed)

Two sources this repository had never used, on the stack that trained the 2021-22 giants: Megatron's model code
run by DeepSpeed's PipelineEngine. BigScience's BLOOM-176B (`bigscience-workshop/bigscience`
train/tr11-176B-ml: 384 A100 80GB, TP4 PP12 DP8, bf16, full recompute; the full-batch log line and the
batch ramp-up's two measured points) and MT-NLG 530B (Smith et al. 2022 §2.4 as quoted in
`cli99/llm-analysis`: 280, 350 and 420 DGX A100 nodes, TP8 PP35, global batch 1920). Each run was expressed
with the flags that existed and planned before anything was changed (each row's `first_planned`, at commit
0b8c8a4): **first sight {_med_worst(first)}** ({len(first)} runs). That is the figure on sources the model had
not seen. Then, reading DeepSpeed's source (`deepspeed/runtime/pipe/engine.py`, `schedule.py`,
`bf16_optimizer.py`; cited in `comm.py` and `throughput.py`), three things the planner did not know:

- the PipelineEngine turns the backward's all-reduce off (`enable_backward_allreduce = False`: "We schedule the
  all-reduces") and its TrainSchedule reduces the gradients after the last micro-batch (ReduceTiedGrads,
  ReduceGrads, OptimizerStep), so nothing is left to hide them under on the first stage, which finishes last;
  the planner had let them hide under the last micro-batch and the pipeline's drain, as Megatron-Core does;
- under bf16 its BF16_Optimizer is "hardcoded for fp32 gradient accumulation": after every micro-batch's
  backward it casts the bf16 gradients and adds them into fp32 ones (18 bytes per parameter of the stage,
  {f['accum_mb_ms']:.0f} ms per micro-batch on a BLOOM stage), and it all-reduces fp32 gradients, not a bf16
  reduce-scatter;
- a tied embedding lives on the first and the last stage and its gradient is all-reduced between them once a
  step (Megatron-Core's `finalize_model_grads` too, after the data-parallel sync): {f['embed_gb']:.1f} GB of fp32
  for BLOOM's vocabulary at TP4, {f['embed_s']:.1f} s over the assumed {f['inter']:g} GB/s per GPU. This one is not
  DeepSpeed's alone, so it applies to every tied model with `--pp > 1` (the Megatron-LM 2021 and NeMo GPT-3
  rows moved by under 0.2 points).

`--deepspeed-pipeline` says which engine runs (it also refuses ZeRO-2/3 and `--vpp`, as the engine does). No
constant was fitted; the byte counts come from the kernels and the order from the schedule. **Now:
{_med_worst(now)}.** {per}.

{table}

**Memory.** The prequel's 02-28 table (`chronicles-prequel.md`: the final shape at TP8 and TP4, MBS 2 and 4,
`nvidia-smi` on the first node) was added after `--deepspeed-pipeline` was written (its tokens/s are not
unseen: {_med_worst(later)} now), but no memory term had seen it: **memory first sight {_med_worst(mem_first)}**
({len(mem_first)} runs). The source then sent us to two terms: the BF16_Optimizer keeps each stage's bf16
gradients beside its fp32 ones (`update_hp_grads(clear_lp_grads=False)` under the PipelineEngine: 2 bytes per
parameter on top of the 4 the planner counted), and BLOOM ran DeepSpeed's activation checkpointing without
`--partition-activations`, so without sequence parallelism every TP rank keeps each checkpointed block's input
whole (`--no-partition-activations`; Megatron-LM 2021's `--distribute-checkpointed-activations`, which the
planner had assumed, splits it). Then the stages stopped being alike: the planner plans the busiest stage's
states, not the average's (the first holds the word embedding beside five blocks where the others hold six:
`pipeline.stage_params`), what the embedding keeps of each of the 12 micro-batches in flight (BLOOM's
`--embed-layernorm` input and its dropout mask: `--embed-norm --dropout`, the Megatron default dropout also
adding each block's masks), and the PipelineEngine's kept stage outputs (`pipe_buffers['outputs']`, 1/tp each).
**Memory now {_med_worst(mem_now)}.** What is still missing is not known from the source: nvidia-smi counts
NCCL's buffers and more CUDA context than the 1 GiB planned (the prequel measured 1573 MiB of it on a 40GB
A100), and the caching allocator's reserve beyond the planned share.

What the after-figures rest on, and what is still not explained:
- MT-NLG's dtype is not in the quoted text: planned as bf16 the fp32 accumulation applies and the rows read as
  above; planned as fp16 (DeepSpeed's ZeRO-1 optimizer: no fp32 accumulation) they read
  {100 * f['fp16'][0]:+.0f}% to {100 * f['fp16'][1]:+.0f}%, about where they were first. Megatron-LM ran the same 530B model on
  the same kind of node at {f['meg_tf']} TFLOP/s per GPU (Narayanan et al. 2021, planned at {100 * f['meg_err']:+.0f}%); MT-NLG
  reached {f['mt_tf']} at {f['mt_nodes']} nodes, {100 * (1 - f['mt_tf'] / f['meg_tf']):.0f}% less, and in this model only the
  BF16_Optimizer's per-micro-batch pass accounts for that gap. A lock-step reading of DeepSpeed's schedule
  (every slot as long as the slowest neighbour's backward: 2 × backward per micro-batch instead of forward +
  backward, 1.5× with full recompute) would make every run slower by far more than either source shows (BLOOM's
  full-batch run included), so it is not modelled.
- BLOOM's network is not published beyond "4 OmniPath links" per node: 100 Gb/s each ({f['inter']:g} GB/s per GPU)
  is assumed. Its data-parallel reduction ({f['dp_s']:.1f} s a step) and the tied all-reduce scale with it; at one
  micro-batch per step (the GBS-16 log line) they are {100 * f['small_share']:.0f}% of the planned step.
- Leave-one-source-out: these {len(rows)} are the only megatron-stack A100 runs besides Narayanan et al.'s, so with
  that source held out the megatron A100 GEMM efficiency is refitted on them ({f['nar_eff']} against the shipped
  {CALIBRATION['gemm_eff']['megatron'][8]}), and Narayanan's rows read {100 * f['nar_med']:.1f}% (median) that way, where before these
  rows the refit had no megatron A100 run and took the derived value. One constant serves Megatron-LM and
  Megatron-DeepSpeed; MT-NLG's remaining over-prediction is what pulls it down.
- BLOOM's full-batch run was within 1% at first sight and now reads low: the fp32 accumulation
  ({f['accum_s']:.1f} s of its {f['step_s']:.0f} s planned step) and the exposed reductions ({f['reduce_s']:.1f} s) are counted
  from the source; what offsets them there is not known.
"""


def _terms(rows: list[dict], key: str) -> dict:
    """Per row id: the planned share of the step that FSDP's data-parallel collectives take (all of it planned
    hidden under compute), from the planner's own time terms."""
    from overdrive.plan.estimate import estimate
    from overdrive.plan.validation import _setup, run_model

    runs = {r["id"]: r for r in load_runs()}
    out = {}
    for p in rows:
        if key in p["id"]:
            e = estimate(run_model(runs[p["id"]]), _setup(runs[p["id"]]))
            out[p["id"]] = e.times["dp_comm"] / e.step_s
    return out


def pytorch_unseen_section(val: list[dict]) -> str:
    """OLMo-core's and TinyLlama's READMEs (unseen sources) and torchtitan's async-TP file (a new file of a
    project whose other files fitted constants): first-sight errors, what they say, what was (not) added."""
    from overdrive.plan.validation import expressed_table, summary

    first = {r["id"]: r["first_error"] for r in first_sight_rows(val) if r["first_error"] is not None}
    olmo = [r for r in val if r["id"].startswith("OLMo-core")]
    tiny = [r for r in val if r["id"].startswith("TinyLlama")]
    tt = [r for r in val if r["id"].startswith("torchtitan asyncTP")]
    mle = [r for r in val if r["id"].startswith("ml-engineering ")]
    rated = [r for r in tt if not r["stack_bug"]]
    so, st, sr = summary(olmo), summary(tiny), summary(rated)
    both = summary(olmo + tiny)
    comm = _terms(olmo, "OLMo-core")
    share = ", ".join(f"{k.split()[1]} {k.split()[4]} {100 * v:.0f}%" for k, v in comm.items())
    changed = [r["id"] for r in olmo + tiny + tt if r["id"] in first and abs(r["error"] - first[r["id"]]) > 5e-4]
    after = ("no row moved: nothing was changed for them" if not changed
             else f"moved since first sight: {', '.join(changed)}")
    fs = [abs(first[r["id"]]) for r in olmo + tiny if r["id"] in first]
    sm = summary(mle)
    return f"""## PyTorch-stack sources added unseen: OLMo-core, TinyLlama, torchtitan's async-TP file, ml-engineering

Four sources added after every term on this page, fitted on nothing, and expressed from their own files and
code (each run's note in the data file says every assumption). Their errors as first planned (first sight,
before anything was looked at) are kept in the data file beside each row; {after}.

- **OLMo-core's README throughput table** (allenai/OLMo-core @ e27ba745, 'Update throughput numbers': OLMo 2 1B/7B/13B
  and a Llama 3 8B shape on H100, BF16 and torchao float8, FSDP2 with fp32 gradient reduction, compiled blocks,
  compiled loss with z-loss, no activation checkpointing; the GPU count is not published: the launch default,
  one node of 8): median |error| {100 * so['median_abs_error']:.1f}%, worst {100 * so['worst_abs_error']:.0f}% ({so['worst']}), {so['under']} of {so['n']} low.
- **TinyLlama's README** (jzhang38/TinyLlama @ 8148930f: 24k tokens/s per A100-40G, 1.1B, 16 GPUs, Lightning FSDP
  with bf16-mixed, i.e. fp32 all-gather and bf16 reduction, hand-fused eager kernels, no checkpointing):
  {100 * st['median_abs_error']:+.1f}% in size ({tiny[0]['published']:,.0f} published, {tiny[0]['predicted']:,.0f} planned); the README says the run fits in
  40 GB, and it is planned at {tiny[0]['memory_gib']:.1f} of {tiny[0]['capacity_gib']:.1f} GiB (fits).
- Both unseen sources together, first sight: median {100 * statistics.median(fs):.1f}%, worst {100 * max(fs):.0f}% ({len(fs)} runs); with
  fms-fsdp's four in the summary above.
- **torchtitan's async-TP benchmark file** (Llama 3 8B on 64 and 70B on 256 H100s, FSDP × TP 8, bf16 / float8 tensorwise
  / rowwise, vanilla and async TP; a new file, but torchtitan's other files fitted constants on the same hosts, so it is
  not counted as unseen): median {100 * sr['median_abs_error']:.1f}%, worst {100 * sr['worst_abs_error']:.0f}% ({sr['worst']}) over its {sr['n']} rows as rated.
  Its two 8B rowwise rows read {', '.join(f"{100 * r['error']:+.0f}%" for r in tt if r['stack_bug'])}: the file itself says the
  rowwise-with-TP baseline is a known defect (pytorch/torchtitan#1207: rowwise float8 ran below bf16), so they are shown
  and kept out of fits and bounds (`stack_bug` in the data file).
- **ml-engineering's H200 sequence sweep** (stas00/ml-engineering @ 744d01e1, insights/when-to-upgrade-gpus: Llama-3.1-8B,
  DeepSpeed ZeRO-3 with CPU AdamW, FlashAttention-3, 8K to 256K tokens): median {100 * sm['median_abs_error']:.1f}%, worst
  {100 * sm['worst_abs_error']:.0f}% ({sm['worst']}); the long-context attention gap and the terms tried for it: the summary's bullet.

{expressed_table(olmo + tiny + tt + mle)}

What they say, read against the planner's own terms (no constant refitted, no term added):
- **OLMo-core's 13B rows run above its 7B and 8B rows, by {_gap(olmo, 'bf16')} points in BF16 ({_err_of(olmo, '13B OLMo-1124 8xH100 bf16 s4096 mb1')} against
  {_err_of(olmo, '7B OLMo-1124 8xH100 bf16 s4096 mb2')} and {_err_of(olmo, '8B Llama 8xH100 bf16 s4096 mb2')}) and by {_gap(olmo, 'fp8')} in FP8 ({_err_of(olmo, '13B OLMo-1124 8xH100 fp8 s4096 mb1')} against
  {_err_of(olmo, '7B OLMo-1124 8xH100 fp8 s4096 mb2')} and {_err_of(olmo, '8B Llama 8xH100 fp8 s4096 mb2')}).** What differs is the micro-batch: the 13B script runs one
  sequence per micro-batch, 256 micro-batches per step, and FSDP2 all-gathers every block twice and reduce-scatters its
  fp32 gradients in every micro-batch (OLMo-core disables gradient sync only for DDP). The planner counts those
  collectives ({share} of the planned step) and hides all of them under compute by its 0.9 overlap. Within
  OLMo-core's rows the error rises with that share: hidden collectives are not free. NCCL's kernels run as CTAs on
  the GPU's SMs, and the planner now charges the compute that overlaps them the SMs NCCL's channels hold (`nccl_sms`
  in estimate.py: 24 of an H100's 132, an 18% slowdown while they run, the size of the 18.9% average compute slowdown
  under overlap that Lee et al. 2025, arXiv:2507.03114, measured on A100s and H100s). FSDP2 also copies every
  gathered parameter out of the all-gather buffer and every gradient into the reduce-scatter buffer, cast to the
  reduce dtype, per call (`torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py`: `foreach_all_gather_copy_out`,
  the `torch._chunk_cat` copy-in of `foreach_reduce`): not in the planner (the next bullet says why); the 13B FP8
  row, the worst unseen one, is the measure of what is left.
- **The copies, counted and tried (not shipped).** From pytorch/pytorch's source: fully_shard copies every gathered
  parameter out of the all-gather buffer into its own storage (`foreach_all_gather_copy_out`, `split_with_sizes_copy`,
  _fsdp_collectives.py @ 8fc2039d) on the compute stream (`wait_for_unshard`, from pre_forward and again from
  pre_backward, _fsdp_param_group.py @ 002a76fb), and every unsharded gradient into the reduce-scatter input in the
  reduce dtype (`foreach_reduce_scatter_copy_in`, `torch._chunk_cat`) on the compute stream too: 4·g + c + r bytes
  per parameter per micro-batch (g gathered, c compute, r reduce dtype bytes: 14 in BF16 with fp32 reduction, 10
  with FP8 all-gather). FullyShardedDataParallel (FSDP1: llm-foundry through Composer's `prepare_fsdp_module`,
  fms-fsdp's main_training.py, TinyLlama through Lightning's FSDPStrategy) gathers straight into its FlatParameter and
  hands out `torch.split` views (_flat_param.py @ 01caf79e), so its only compute-stream copy is the split's backward,
  which concatenates the views' gradients into the flat gradient (2·c); its cast to the reduce dtype runs on its
  post-backward stream (_runtime_utils.py `_post_backward_hook`). Added as a micro-batch term at the planner's HBM
  rate, with `--fsdp-version 1|2` and the FSDP1 rows marked, and every constant refitted: OLMo-core's 13B rows
  +7% → -1% (BF16) and +24% → +15% (FP8), their gap to the 7B/8B rows 15 → 10 and 27 → 22 points; in-sample
  7.6% → 7.4% median; leave-one-source-out 9.0% → 8.9% median, 38% → 40% worst (llm-foundry's worst row); the
  unseen sources 12.0% → 11.7% median, 35% → 36% worst (fms-fsdp's 13b row, whose network is not published: the
  refit's one eager calibration run, an FSDP2 torchtitan run, moved `nocompile` from 1.54 to 1.23 and
  `gemm_eff[pytorch][8]` from 0.765 to 0.78, and the eager A100 rows rose 1-3 points). The unseen worst and the 35%
  bound on validation rows got worse, and the cheaper DDP-with-sharded-optimizer plan now outranks FSDP for an 8B
  model on one H100 node, since the planner counts no copies for DDP's gradient buckets either; so the term is not
  in the planner. (NCCL's SM share was added later from NCCL's own channel count, the bullet above.)
- **Read again from OLMo-core's history (2026-12-03).** The table's figures are older than the README commit the rows
  cite: `git log -S` on README.md puts the 7B and 13B BF16 figures at 8c03ca8a2 (2024-09-26), the 13B FP8 one at
  310866e45 (2024-10-23) and the 8B's at 41400c46f (2024-11-01), when the scripts set `fused_loss=True` and the model
  returned `self.w_out(h).float()`: flash-attn's Triton cross-entropy on fp32 logits with the z-loss inside it. Those
  six rows are expressed so since (`--loss compiled-fp32`, no separate z-loss pass; each note says it): a point or
  less on each. The same reading counts what FSDP2 does per micro-batch: the copies of the bullet above (13B: about
  39 ms per micro-batch in BF16, 20 ms with FP8 all-gather, and 31 ms for the fp32 copy-in; not in the planner) and
  the root unit OLMo-core's `apply_fsdp` leaves the embedding, the final norm and the 100,352-token head in (1.03B
  parameters, about three blocks' worth), whose gather opens every micro-batch and whose fp32 reduce-scatter closes
  it with nothing to hide under, about 15 ms more than the one average block the planner used to leave exposed. The
  root unit is in the planner since (`_root_unit` in comm.py, for every PyTorch-stack FSDP plan without pipelining,
  gathered in the compute dtype: the head and the embedding are never float8): OLMo-core's 13B rows 1.6 (BF16) and
  2.9 (FP8) points lower, every other row within a point; over all sources leave-one-source-out 5.8% → 5.9% median
  and 36% → 34% worst, in-sample 4.9% → 5.0% and 36% → 33%, the shipped constants 5.2% → 5.1% and 35% → 32%
  (no shipped constant moved). The copies and the root together are about half of the 13B's BF16 gap and a third
  of its FP8 gap; no source read explains the rest of the FP8 gap, which needs a profile of the run.
- **A candidate read since (2026-12-07), in memory rather than time, not counted.** OLMo-core's images pinned torchao
  0.5.0 (Makefile at 310866e45), which had no `force_recompute_fp8_weight_in_bwd` (torchao e9195580, 2024-10-02);
  pytorch/ao#936 says torch.compile then saved each float8 linear's weight transpose for the backward, gathered, with
  FP8 all-gather or without. {_fp8_saved_weights(olmo)} Not counted: torchtitan's December 2024 table (torchao's
  flag then off by default) reads the same reserved memory with float8 as without ({_tt_float8_reserved()}), so
  the sources do not settle whether the copies stayed, and the planner has no measured cost for a step that close
  to capacity (PyTorch's caching allocator frees its cache and retries a failed allocation, which synchronizes).
- **OLMo-core's attention kernel.** First planned with attention at a fixed fraction of the GEMM rate (the model
  then), its 1B rows ran slow ({_first_of(olmo, first, '1B OLMo-1124 8xH100 bf16 s4096 mb8')}, {_first_of(olmo, first, '1B OLMo-1124 8xH100 fp8 s4096 mb8')}), and at FlashAttention-2's own rate too. {_one_b(olmo)} The source says why: the official
  scripts launch on the olmo-core-nightly Beaker image (src/olmo_core/internal/experiment.py), which the Makefile at
  the table's commit builds on PyTorch 2.6.0.dev20241009, a nightly from before pytorch/pytorch#138522 (2024-10-22) made
  cuDNN's SDPA opt-in: on H100 it ran first. Expressed with `--attention cudnn` (each row's note), the BF16 rows read
  {", ".join(_err_of(olmo, k) for k in ('1B OLMo-1124 8xH100 bf16 s4096 mb8', '7B OLMo-1124 8xH100 bf16 s4096 mb2', '8B Llama 8xH100 bf16 s4096 mb2', '13B OLMo-1124 8xH100 bf16 s4096 mb1'))} (1B, 7B, 8B, 13B) and the FP8 rows
  {", ".join(_err_of(olmo, k) for k in ('1B OLMo-1124 8xH100 fp8 s4096 mb8', '7B OLMo-1124 8xH100 fp8 s4096 mb2', '8B Llama 8xH100 fp8 s4096 mb2', '13B OLMo-1124 8xH100 fp8 s4096 mb1'))}: with the kernel right, what is
  left is the FP8 gain, published {_pub_gains(olmo)} and planned {_planned_gains(olmo)}. torchao's float8 is credited the same
  FP8 GEMM rate (`lowp_rel`, shared) as Transformer Engine under Megatron, whose bf16/FP8 pairs set it. A constant
  of its own for the PyTorch stacks' FP8 GEMMs was tried (2026-12-03, measured then, not recomputed): fitted at 0.90
  (every source) to 0.95 (the calibration runs) of the shared one, it left leave-one-source-out where it was (7.0%
  median, 40% worst) and the 13B FP8 row at +40% held out, so it is not kept: on that row the gap is not the FP8
  constant alone.
- **torchtitan's async-TP file:** the 70B float8 rows run low ({_err_of(tt, '70B 256xH100 FSDP32 TP8 fp8')}, async {_err_of(tt, '70B 256xH100 FSDP32 TP8 fp8 async TP')}),
  as the same configuration in torchtitan's 2024-12 file already did (below). Async TP's gain over vanilla TP,
  planned against published: {_async_gains(tt)}. The planner leaves a fixed 30% of the TP
  communication exposed under async TP (`ASYNC_TP_EXPOSED`, not fitted); PyTorch's micro-pipelined collective
  matmuls (`torch.distributed._symmetric_memory`, `_pipelined_all_gather_and_consume`) run each GEMM as TP-degree
  pieces of 1/TP of its rows, here 8 pieces of {12 * 8192 // 8:,} and {16 * 8192 // 8:,} rows, large enough that
  their shape costs little; where the gain is planned high, that fixed share is the term to read from the engines
  next, not to fit.
"""


def _row_for(rows, key):
    """The row whose id ends with `key` (ids are unique; the vanilla-TP row's id is the async one's without ' async TP')."""
    return next(r for r in rows if r["id"].endswith(key))


def _err_of(rows, key):
    return f"{100 * _row_for(rows, key)['error']:+.0f}%"


def _ratio_of(rows, key):
    van = _row_for(rows, key)
    asy = next(r for r in rows if r["id"] == van["id"] + " async TP")
    return f"{asy['predicted'] / van['predicted']:.2f}"


def _pub_ratio_of(rows, key):
    van = _row_for(rows, key)
    asy = next(r for r in rows if r["id"] == van["id"] + " async TP")
    return f"{asy['published'] / van['published']:.2f}"


def _first_of(rows, first, key):
    return f"{100 * first[_row_for(rows, key)['id']]:+.0f}%"


def _fp8_gains(olmo: list[dict], key: str) -> list[float]:
    """FP8/BF16 tokens/s of each OLMo-core size (`key`: published or predicted)."""
    out = []
    for b in (r for r in olmo if " bf16 " in r["id"]):
        f = next(r for r in olmo if r["id"] == b["id"].replace(" bf16 ", " fp8 "))
        out.append(f[key] / b[key])
    return out


def _pub_gains(olmo: list[dict]) -> str:
    g = _fp8_gains(olmo, "published")
    return f"{min(g):.2f}-{max(g):.2f}"


def _planned_gains(olmo: list[dict]) -> str:
    g = _fp8_gains(olmo, "predicted")
    return f"{min(g):.2f}-{max(g):.2f}"


def _one_b(olmo: list[dict]) -> str:
    """The 1B BF16 row's step, term by term: what the published step leaves for attention, and at what FLOP
    rate that puts it beside the kernels' published rates."""
    from overdrive.plan.estimate import estimate
    from overdrive.plan.validation import _setup, run_model

    p = _row_for(olmo, "1B OLMo-1124 8xH100 bf16 s4096 mb8")
    r = next(x for x in load_runs() if x["id"] == p["id"])
    m, s = run_model(r), _setup(r)
    e = estimate(m, s)
    tok = r["global_batch"] * r["seq"] / r["gpus"]
    step_pub = tok / r["tps"]
    t = e.times
    rest = e.step_s - t["attention"]
    left = step_pub - rest
    gemm_flops = 6 * tok * (m.n_layer * (2 * m.hidden * m.q_dim + 2 * m.hidden * m.kv_dim + 3 * m.hidden * m.ffn)
                            + m.hidden * m.vocab)
    attn_flops = m.n_layer * (tok / r["seq"]) * 3.5 * 2 * r["seq"] ** 2 * m.q_dim
    return (f"At {r['tps']:,.0f} tokens/s the step is {step_pub:.1f} s; the planner's GEMMs ({t['gemm']:.1f} s, "
            f"{gemm_flops / t['gemm'] / 1e12:.0f} TFLOP/s) and everything else but attention ({rest - t['gemm']:.1f} s) "
            f"leave {left:.1f} s for attention: {attn_flops / left / 1e12:.0f} TFLOP/s, above FlashAttention-2's best on "
            f"an H100 (335 forward, 322 backward in the FlashAttention-3 paper) and within cuDNN's (539, 516).")


def _async_gains(tt: list[dict]) -> str:
    """Async TP's speed-up over vanilla TP, planned / published, for each rated pair of the file."""
    out = []
    for a in tt:
        if a["id"].endswith(" async TP") and not a["stack_bug"]:
            v = next(r for r in tt if r["id"] == a["id"][:-len(" async TP")])
            name = a["id"].split()[2] + " " + a["id"].split()[6]
            out.append(f"{name} {a['predicted'] / v['predicted']:.2f}x / {a['published'] / v['published']:.2f}x")
    return ", ".join(out)


def _fp8_saved_weights(olmo: list[dict]) -> str:
    """The unsharded FP8 weight transposes torchao 0.5 under compile would keep from forward to backward on
    OLMo-core's FP8 rows (1 byte per block-linear weight), beside each row's planned peak."""
    from overdrive.plan.engine_memory import linear_params
    from overdrive.plan.validation import run_model
    runs = {r["id"]: r for r in load_runs()}
    parts = []
    for key in ("13B OLMo-1124 8xH100 fp8 s4096 mb1", "7B OLMo-1124 8xH100 fp8 s4096 mb2"):
        row = _row_for(olmo, key)
        m = run_model(runs[row["id"]])
        held = linear_params(m) * m.n_layer / GIB
        parts.append((key.split()[0], held, row["memory_gib"], row["capacity_gib"]))
    (b13, h13, m13, cap), (b7, h7, m7, _) = parts
    return (f"Held for every block that is {h13:.1f} GiB on the {b13} row, planned at {m13:.1f} of {cap:.1f} GiB: "
            f"{m13 + h13:.1f} GiB, within {cap - m13 - h13:.1f} GiB of the capacity, against {h7:.1f} GiB more "
            f"on the {b7} row's {m7:.1f}.")


def _tt_float8_reserved() -> str:
    """torchtitan's 2024-12 Table 1 reserved memory, FSDP+compile with and without float8."""
    runs = {r["id"]: r for r in load_runs()}
    a, b = (runs[f"torchtitan 8B 8xH100 FSDP+compile{x}"]["memory_gib"] for x in ("+float8", ""))
    return f"{a:.1f} and {b:.1f} GiB on 8 H100s at 8B"


def _gap(olmo: list[dict], prec: str) -> str:
    """Points between the 13B row's error and the mean of the 7B and 8B rows' errors, in one precision."""
    e13 = _row_for(olmo, f"13B OLMo-1124 8xH100 {prec} s4096 mb1")["error"]
    mid = (_row_for(olmo, f"7B OLMo-1124 8xH100 {prec} s4096 mb2")["error"]
           + _row_for(olmo, f"8B Llama 8xH100 {prec} s4096 mb2")["error"]) / 2
    return f"{100 * (e13 - mid):.0f}"


BLIND_SOURCES = ("VectorInstitute/vectorlm", "modelscope/ms-swift", "Lightning-AI/lightning-thunder", "InternLM/xtuner",
                 "NVIDIA/NeMo-Framework-Launcher", "microsoft/Megatron-DeepSpeed", "deepspeedai/DeepSpeed docs/_posts")
"""The blind check of 2026-12-07: two helpers, each given only the CLI and the docs, found published runs in sources
the project had never used and planned each before reading anything back; the rows went in as planned, fitted on
nothing, no term added."""


def is_blind(r: dict) -> bool:
    return r["source"].startswith(BLIND_SOURCES)


def blind_check_bullet(val: list[dict]) -> str:
    """The blind check's figures, by the classes of run it found the planner missing."""
    rows = [r for r in val if is_blind(r)]
    s = summary(rows)

    nemo175, nemo5 = ("NeMo 22.08 GPT-3 175B",), ("NeMo 22.08 GPT-3 5B",)
    z3big = ("xtuner Yi-34B", "xtuner Llama-2-70B", "DeepSpeed Azure GPT 1T", "DeepSpeed Azure GPT 2T")
    z3small = ("xtuner Llama-3-8B", "xtuner Llama-2-7B", "ms-swift Qwen2.5-14B 8xA800 bf16 ZeRO")
    tp32 = [r["error"] for r in sorted((r for r in rows if r["id"].startswith("Megatron-DeepSpeed GPT 30B")),
                                       key=lambda r: int(r["id"].split()[-1]))]
    longest = next(r for r in load_runs() if r["id"] == "Megatron-DeepSpeed GPT 30B 32xA100-40GB fp16 TP32 DDP seq 262144")
    tp32_first = longest["first_planned"] / longest["tps"] - 1
    one = ("vectorlm Llama-3-8B 1xA100 bf16 FSDP seq", "lit-gpt thunder open_llama_3b 1x")
    return f"""  - The blind check (2026-12-07; {len({r['source'].split(' @')[0] for r in rows})} of these sources, {s['n']} runs): two helpers given only
    the CLI and these docs found the runs and planned each before anything was read back; the rows went in as
    planned. Median {100 * s['median_abs_error']:.1f}%, worst {100 * s['worst_abs_error']:.0f}%; {len(s['not_fitting'])} completed runs planned not to fit. What it found missing:
    NeMo 22.08's GPT-3 175B (TP8 PP8, Apex-era Megatron on A100) {_span(rows, nemo175)} where its 5B twin at TP1 reads
    {_span(rows, nemo5)}; DeepSpeed ZeRO-3 on 4 nodes at 34B-70B and at 1T-2T with the optimizer offloaded {_span(rows, z3big)},
    where the same engine inside a node at 7B-14B reads {_span(rows, z3small)}; tensor parallelism at 32 across 4 nodes
    (Megatron-DeepSpeed's 30B) from {100 * tp32[0]:+.0f}% at 2K to {100 * tp32[-1]:+.0f}% at 256K (planned {100 * tp32_first:+.0f}% there
    until the Triton kernel's tiles were: its 96-wide heads run 128 wide, a quarter of the work zeros); one-GPU A100 runs
    {_span(rows, one)} (planned slow). VectorLM's full-rank 8B on one A100 was first planned not to fit (103 GiB): its
    benchmark calls Trainer.train_step and never Trainer.step, so the step counter stays 0, every micro-batch takes
    the no_sync branch and the optimizer never steps; planned as that (`--optimizer none`: no states, no step, no
    gradient reduction) it fits at {_mem(rows, "vectorlm Llama-3-8B 1xA100 bf16 FSDP seq 2048")} GiB. Still planned not to fit: NeMo 22.08's 5B at
    micro-batch 2 on 8-16 GPUs (80-84 GiB; Apex's DistributedFusedAdam keeps a whole fp32 gradient buffer and nothing
    is checkpointed, as its config reads). lit-gpt's SGD keeps no momentum (`--optimizer sgd-nomomentum` since;
    first planned with one state): without it the memory of its eager runs is planned {_mem_span(rows, "lit-gpt", "eager")},
    of its compiled ones {_mem_span(rows, "lit-gpt", "compiled")} (ZeRO-2 lowest, below): lit-gpt's eager block (bf16 RMSNorm, RoPE through a cat
    and two multiplies, an unfused SwiGLU) saves about 3 GiB more than its compiled one, and the planner has no block
    code for it. Not expressible, so planned nearest: packed sequences' per-document attention, Ulysses sequence
    parallelism, FSDP1's per-module wrapping and SHARD_GRAD_OP (planned as ZeRO-2, without its sharded copy).
    Nothing was refused."""


def _mem(rows: list[dict], rid: str) -> str:
    return f"{next(r for r in rows if r['id'] == rid)['memory_gib']:.0f}"


def _mem_span(rows: list[dict], prefix: str, word: str) -> str:
    errs = sorted(r["memory_error"] for r in rows if r["id"].startswith(prefix) and word in r["id"] and "memory_error" in r)
    return f"{100 * errs[0]:+.0f}% to {100 * errs[-1]:+.0f}%"



def blind_check_section(val: list[dict]) -> str:
    """How each run of the blind check is expressed, as its helper planned it (the summary's bullet has the figures)."""
    rows = [r for r in val if is_blind(r)]
    return f"""## The blind check (2026-12-07)

Each run as the helper that found it expressed it, before anything was read back; its note in the data file says
where every setting came from and what could not be said.

{expressed_table(rows)}"""
