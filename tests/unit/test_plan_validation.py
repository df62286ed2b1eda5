"""The planner against published runs it was not fitted to: recompute the table of docs/plan-validation.md
from src/overdrive/plan/published_runs.json, so the doc cannot drift from the code, and hold the errors."""

import json
import os
import re
import statistics

import pytest

from overdrive.plan import TrainSetup, estimate, get_model
from overdrive.plan.engine_memory import nccl_buffer_bytes, te_weight_cache_bytes
from overdrive.plan.memory import GIB, RESERVED_SHARE, backward_grad_bytes
from overdrive.plan.validation import (_setup, evaluate, expressed_table, load_runs, markdown_table, plan_flags,
                                       predict, run_model, summary, why_not_fitting)
from overdrive.env import gpu_by_key

DOC = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "plan-validation.md")


BLIND_SOURCES = {"VectorInstitute/vectorlm docs/reference_throughput.md @ 9045f08a": 18,
                 "modelscope/ms-swift docs/source_en/Instruction/Megatron-SWIFT-Training.md @ 9d297f99": 3,
                 "Lightning-AI/lightning-thunder examples/lit-gpt/README.md @ 07da9a31": 8,
                 "InternLM/xtuner xtuner/configs/llama/llama3_8b/README.md @ cb855eb6": 2,
                 "InternLM/xtuner docs/zh_cn/acceleration/benchmark.rst @ 7575f2c9": 4,
                 "NVIDIA/NeMo-Framework-Launcher README.md @ 3579cdb3": 11,
                 "microsoft/Megatron-DeepSpeed examples_deepspeed/deepspeed4science/megatron_long_seq_support/README.md @ cc3a94c6": 8,
                 "deepspeedai/DeepSpeed docs/_posts/2022-07-26-deepspeed-azure.md @ fd405169": 3}
"""The blind check of 2026-12-07: eight sources never used before, each row planned before anything was read back."""
BLIND_IDS = {r["id"] for r in load_runs() if r["source"].startswith(tuple(BLIND_SOURCES))}
BLIND2_SOURCES = {"QwenLM/Qwen README.md @ 2df8e8ac": 16, "hpcaitech/ColossalAI README.md @ e5fdefa6": 3,
                  "alibaba/Megatron-LLaMA README.md @ 25306de8": 5,
                  "huggingface/nanotron docs/benchmark_summary.svg @ c2528430": 18,
                  "huggingface/picotron README.md @ e82c719f": 2,
                  "snowflakedb/ArcticTraining news/qwen3-32b-dgx-station.md @ 46f16d44": 1}
"""The second blind check of 2026-12-07: six more sources, bounded in tests/unit/test_plan_blind2.py."""
BLIND2_IDS = {r["id"] for r in load_runs() if r["source"].startswith(tuple(BLIND2_SOURCES))}


@pytest.fixture(scope="module")
def validation():
    return evaluate("validation")


def test_sets_are_separate_and_sourced():
    runs = load_runs()
    ids = [r["id"] for r in runs]
    assert len(ids) == len(set(ids))
    assert {r["role"] for r in runs} == {"calibration", "validation"}
    assert sum(r["role"] == "validation" for r in runs) >= 25
    assert all(r["source"] and r["tps"] > 0 for r in runs)
    gpus = {r["gpu"] for r in runs if r["role"] == "validation"}
    assert {"a100-80", "h100-96gb", "h200", "b200"} <= gpus


def test_doc_table_is_recomputed_from_the_data(validation):
    doc = open(DOC).read()
    assert markdown_table(validation) in doc, "docs/plan-validation.md is stale: run scripts/plan_validation_doc.py"
    assert markdown_table(evaluate("calibration")) in doc
    found = re.findall(r"median \|throughput error\| (\d+\.\d)%, worst (\d+)%", doc)
    held = summary([r for r in validation if r["held_out"] == "new source"])
    # the leave-one-source-out line first (test_doc_states_leave_one_source_out...), then the held-out line,
    # then all validation
    for (med, worst), s in zip(found[1:], (held, summary(validation))):
        assert float(med) == round(100 * s["median_abs_error"], 1)
        assert int(worst) == round(100 * s["worst_abs_error"])
    assert len(found) == 3
    assert expressed_table([r for r in validation if r["held_out"] == "new source"]) in doc


def test_throughput_error_bounds(validation):
    s = summary(validation)
    assert s["median_abs_error"] <= 0.15, s
    # The bound on the worst case (35%) is not met: the three power-limited B200 rows of
    # torchtitan's MXFP8 doc run ~45% below an unthrottled B200 (see the doc). Hold what is true.
    # Nor the runs their own source flags as a stack defect (torchtitan's rowwise float8 with TP, its issue #1207):
    # shown in the doc, held to no bound (test_a_run_its_source_flags_as_a_defect_is_shown_not_fitted).
    # InternLM's 1024-GPU zero1=-1 rows (+89% and +42% at first sight) are held to it too, since --zero-broadcast
    # plans their Hybrid ZeRO's one broadcast per owning rank
    others = [r for r in validation if "power-limited" not in r["source"] and not r["stack_bug"]]
    # OLMo-core's 13B FP8 row is held to 40%, not 35%: expressed with the cuDNN attention its PyTorch nightly ran
    # (read from its source), its BF16 twin reads +11% and the FP8 gain torchao is planned with runs above the one
    # OLMo-core publishes (docs/plan-validation.md, its section); the rest stay within 35%
    olmo13 = [r for r in others if r["id"] == "OLMo-core 13B OLMo-1124 8xH100 fp8 s4096 mb1"]
    assert len(olmo13) == 1 and abs(olmo13[0]["error"]) <= 0.40, olmo13
    # The worst of the rest: torchtitan's asyncTP 8B rows at TP 8 (+28% to +34%) and FlagPerf's 440-GPU Llama 3 8B row
    # (+30%; an unseen source, first sight +47%: Megatron-core 0.6 at DP 220 without gradient/parameter overlap, on a
    # network the README does not give per GPU)
    # ml-engineering's Llama-3.1-8B ZeRO-3 sweep on 8 H200s (FlashAttention-3) and 8 B200s (FlashAttention-4), an
    # unseen source added fitted on nothing: from 64K tokens, where attention is most of the step, planned 4-13% slow
    # since llm-foundry's rows carry the Triton kernel they ran (attn_rel refitted to about 1: kernels at their
    # benchmarks); 30-46% slow before. Held to 20%, and to the sign: never fast. At 8K the same runs are planned fast
    # (+30% H200, +45% B200): the CPU AdamW step of the optimizer offload, planned at 1e9 parameters/s per GPU on a
    # host the source does not describe. Held to 50%, and to the sign.
    sweep = [r for r in others if r["id"].startswith("ml-engineering ") and " ZeRO-3 " in r["id"]]
    long_ctx = [r for r in sweep if int(r["id"].split()[-1]) >= 65536]
    assert len(long_ctx) == 8 and all(-0.20 <= r["error"] < 0 for r in long_ctx), long_ctx
    offload = [r for r in sweep if int(r["id"].split()[-1]) == 8192]
    assert len(offload) == 2 and all(0 < r["error"] <= 0.50 for r in offload), offload
    # torchtitan's context-parallel rows from CP 4 on, and the 405B's CP across nodes from CP 2 (torch's ring attention,
    # 2024-12): planned 26-57% fast, the published steps putting attention at about 0.6 of FlashAttention-2's
    # benchmark where its CP 1-2 rows on 8 GPUs keep about 0.9; not explained by the FLOPs (load-balanced) or the KV
    # ring (hidden under the attention). Held to 60%, and to the sign (docs/plan-validation.md, the known gaps).
    ring = [r for r in others if r["id"].startswith("torchtitan ") and " CP" in r["id"]
            and (" CP4 " in r["id"] or " CP8 " in r["id"] or ("405B" in r["id"] and " CP2 " in r["id"]))]
    assert len(ring) == 5 and all(0 < r["error"] <= 0.60 for r in ring), ring
    # The blind check of 2026-12-07 (eight unseen sources, each row planned before anything was read back; no term or
    # constant changed for them): four classes of run the planner misses, held to what they read, and to the sign.
    blind = [r for r in others if r["id"] in BLIND_IDS]
    assert len(blind) == 57
    # NeMo 22.08's GPT-3 175B (TP8 PP8, Apex-era Megatron on A100): planned 26-28% fast on 64 to 1,024 GPUs, where its
    # 5B twin at TP1 is within 9%
    nemo175 = [r for r in blind if r["id"].startswith("NeMo 22.08 GPT-3 175B")]
    assert len(nemo175) == 5 and all(0.20 <= r["error"] <= 0.35 for r in nemo175), nemo175
    # DeepSpeed ZeRO-3 on 4 nodes at 34B-70B (xtuner) and at 1T-2T with the optimizer offloaded (DeepSpeed's Azure
    # runs): 32-59% fast, where the same engine inside a node at 7-14B is within 15%
    zero3_big = [r for r in blind if r["id"].startswith(("xtuner Yi-34B", "xtuner Llama-2-70B", "DeepSpeed Azure GPT 1T",
                                                          "DeepSpeed Azure GPT 2T"))]
    assert len(zero3_big) == 4 and all(0.25 <= r["error"] <= 0.65 for r in zero3_big), zero3_big
    # Megatron-DeepSpeed's 30B at TP32 across 4 nodes: slow at 2K-8K (the tensor-parallel traffic over InfiniBand
    # planned 65% of the 2K step), within 10% from 32K to 128K, fast at 256K, where its published rate drops for a
    # reason it does not give (+61% before the Triton kernel's 96-wide heads were planned in its 128-wide tiles)
    tp32 = sorted((r for r in blind if r["id"].startswith("Megatron-DeepSpeed GPT 30B")),
                  key=lambda r: int(r["id"].split()[-1]))
    assert len(tp32) == 8 and all(-0.35 <= r["error"] <= 0.35 for r in tp32), tp32
    assert [r["error"] < 0 for r in tp32] == [True] * 7 + [False] and all(abs(r["error"]) <= 0.10 for r in tp32[4:7])
    rest_blind = [r for r in blind if r not in nemo175 + zero3_big + tp32]
    assert len(rest_blind) == 40 and max(abs(r["error"]) for r in rest_blind) <= 0.16, summary(rest_blind)
    rest = [r for r in others if r not in olmo13 and r not in long_ctx and r not in offload and r not in ring
            and r not in blind and r["id"] not in BLIND2_IDS]
    assert max(abs(r["error"]) for r in rest) <= 0.35, summary(rest)


def test_fsdp_memory_error(validation):
    s = summary(validation)
    assert s["n_memory"] >= 8
    assert s["memory_median_abs_error"] <= 0.08, s  # torchtitan's max_reserved vs allocated + fragmentation


def test_blackwell_low_precision_gains():
    m = get_model("llama3-8b")
    b200 = TrainSetup(gpu=gpu_by_key("b200"), seq=8192, checkpointing="selective-op")
    tps = {p: estimate(m, TrainSetup(**{**b200.__dict__, "precision": p})).tokens_per_s_per_gpu
           for p in ("bf16", "fp8", "mxfp8", "nvfp4")}
    assert tps["nvfp4"] > tps["fp8"] > tps["bf16"]
    assert 1.1 <= tps["mxfp8"] / tps["bf16"] <= 1.4  # published +20% (torchtitan, 8xB200 Llama3-8B)
    gb300 = gpu_by_key("gb300")
    m70 = get_model("llama3-70b")
    # Megatron-Bridge's recipes use Transformer Engine's cross-entropy (loss inplace), as its rows in the data file do
    kw = dict(gpu=gb300, gpus_per_node=64, seq=8192, global_batch=256, stack="megatron", async_tp=True, loss="inplace")
    fp8 = estimate(m70, TrainSetup(**kw, micro_batch=2, precision="fp8")).tokens_per_s_per_gpu
    fp4 = estimate(m70, TrainSetup(**kw, micro_batch=1, sharding="zero1", pp=4, vpp=5, precision="nvfp4"))
    assert 1.15 <= fp4.tokens_per_s_per_gpu / fp8 <= 1.6  # published +36% (Megatron-Bridge, GB300)


def test_blackwell_precision_on_hopper_falls_back_with_a_label():
    e = estimate(get_model("llama3-8b"), TrainSetup(gpu=gpu_by_key("h100"), precision="nvfp4"))
    assert e.setup.precision == "fp8" and e.label == "nvfp4→fp8"
    assert any("not supported on h100-sxm (needs SM 10.x)" in n for n in e.notes)


def test_megatron_runs_carry_their_recipe_and_every_completed_run_fits_or_says_why(validation):
    runs = [r for r in load_runs() if r["id"].startswith("Megatron-Bridge") and r["model"] != "llama3-8b"]
    assert len(runs) >= 16
    for r in runs:
        rec = r["recipe"]
        assert "@" in rec["file"] and rec["preset"].startswith(("LLAMA3_70B", "LLAMA31_405B")), r["id"]
        assert r["grad_dtype"] == "bf16" and r["loss"] == "inplace"
    offload = {r["id"]: r.get("offload_activations", 0) for r in runs}
    assert offload["Megatron-Bridge 70B 64xgb300 fp8 TP1 PP1 VP1 FSDP"] == 20
    assert offload["Megatron-Bridge 70B 64xgb200 fp8 TP1 PP1 VP1 FSDP"] == 40
    doc = open(DOC).read()
    not_fitting = [r for r in validation + evaluate("calibration") if not r["fits"]]
    # the blind check's (2026-12-07): VectorLM's full-rank 8B on one A100 (the table marks out-of-memory runs NaN,
    # so these ran; its configuration as read plans 103 GiB) and NeMo 22.08's 5B at micro-batch 2 on 8-16 GPUs;
    # the second's: Colossal-AI's 7B ZeRO-2 at micro-batch 36 on 8 H200s (Apex's fused RMSNorm is not expressible)
    assert {r["id"] for r in not_fitting} <= {f"vectorlm Llama-3-8B 1xA100 bf16 FSDP seq {s}" for s in (2048, 4096, 8192)} | {
        f"NeMo 22.08 GPT-3 5B {n}xA100 bf16 ZeRO-1 seq 2048" for n in (8, 16)} | {
        "ColossalAI llama-7b 8xH200 bf16 zero2 seq 4096"}, not_fitting
    for r in not_fitting:
        assert why_not_fitting(r) in doc


def test_b200_rests_on_rated_power_runs_too(validation):
    # ml-engineering's B200 ZeRO-3 sweep at 8K and from 64K: bounded with its H200 twins in test_throughput_error_bounds
    sweep = [r for r in validation if r["id"].startswith("ml-engineering ") and " ZeRO-3 " in r["id"]
             and (int(r["id"].split()[-1]) == 8192 or int(r["id"].split()[-1]) >= 65536)]
    rated = [r for r in validation if r["gpu"] == "b200" and "power-limited" not in r["source"] and r not in sweep]
    assert len(rated) >= 3
    assert max(abs(r["error"]) for r in rated) <= 0.35


def test_held_out_runs_come_from_sources_nothing_was_fitted_on():
    runs = load_runs()
    held = [r for r in runs if r.get("held_out") == "new source"]
    # NeMo 24.07's 18 rows were held out until the Megatron-core sources showed the megatron Hopper efficiency
    # needed more than Megatron-Bridge's two runs; they calibrate it now (the doc's summary)
    assert len(held) >= 20 and all(r["role"] == "validation" for r in held)
    cal_sources = {r["source"] for r in runs if r["role"] == "calibration"}
    older = {r["source"] for r in runs if not r.get("held_out")}
    for r in held:
        assert r["source"] not in cal_sources and r["source"] not in older, r["id"]
        assert "@" in r["source"] or "arXiv" in r["source"], r["source"]   # a file at a commit, or the paper
    kinds = {(r["gpu"], r["precision"], r.get("stack", "pytorch")) for r in held}
    assert {("a100-80", "fp16", "megatron"), ("h100-sxm", "bf16", "pytorch")} <= kinds
    nemo = [r for r in runs if r["source"].startswith("NVIDIA/NeMo docs/source/performance")]
    assert len(nemo) == 18 and all(r["role"] == "calibration" and not r.get("held_out") for r in nemo)


def test_held_out_errors(validation):
    held = summary([r for r in validation if r["held_out"] == "new source"])
    assert held["median_abs_error"] <= 0.10, held
    assert held["worst_abs_error"] <= 0.25, held
    assert held["not_fitting"] == [], held
    # torchtune's memory rows count for memory only, not in the 13 throughput runs (Narayanan et al. 2021, the
    # Llama 3 paper)
    assert held["n"] == 13 and held["n_memory_held_out"] == 7
    # the memory bound (8%) is not met on them (eager activations are not modelled): hold what is true
    assert held["memory_held_out_median"] <= 0.11, held


def test_held_out_memory_rows_are_expressed_in_the_doc(validation):
    from overdrive.plan.validation import memory_table

    doc = open(DOC).read()
    # the first-held-out sources' table (the unseen BLOOM prequel's memory is in the older-stacks section)
    assert memory_table([r for r in validation if r["held_out"] == "new source"]) in doc
    rows = [r for r in validation if r.get("memory_measure") == "active"]
    assert len(rows) == 15 and all(r["held_out"] for r in rows)
    # torchtune's 7 memory-only rows and lightning-thunder's 8 max_memory_allocated readings
    assert sum(r["memory_only"] for r in rows) == 7 and sum(r["id"].startswith("lit-gpt") for r in rows) == 8
    # "peak memory active" is compared with allocated itself, not with the reserved estimate
    for r in rows:
        assert r["memory_predicted"] == pytest.approx(predict(next(x for x in load_runs() if x["id"] == r["id"]))
                                                      ["allocated_gib"])


def test_nemo_sft_fit_rests_on_the_remainder_master_and_bf16_grads():
    import dataclasses

    from overdrive.plan.validation import _setup, run_model

    r = next(x for x in load_runs() if x["id"].startswith("NeMo 24.07 LLAMA2-70B SFT"))
    assert r["master_weights"] == "remainder" and r["grad_dtype"] == "bf16"
    m, s = run_model(r), _setup(r)
    assert estimate(m, s).fits
    assert not estimate(m, dataclasses.replace(s, master_weights="fp32")).fits
    assert not estimate(m, dataclasses.replace(s, grad_dtype="fp32")).fits


@pytest.mark.parametrize("rid", ["Megatron-LM 2021 1.7B 32xA100 fp16 TP1 PP1",
                                 "NeMo 24.07 LLAMA2-13B SFT 8xH100 fp8 TP1 PP4 CP1 (VP not published)",
                                 "NeMo 24.07 Nemotron-8B 64xH100 fp8 TP2 PP1 CP1 VP1",
                                 "torchtune Llama3.2-3B 1xA100 + 8-bit AdamW",
                                 "Llama 3 405B 16384xH100 bf16 TP8 CP16 PP16 seq 131072",
                                 "FlagPerf Llama3-70B 64xH100 bf16 TP8 PP4 DP2 GBS512",
                                 "dgxc-benchmarking Llama3.1-405B 96xH100 fp8 TP8 PP3 CP2 VP7 (21 layers)"])
def test_the_flags_the_doc_prints_plan_what_the_table_says(rid, capsys):
    """"Expressed as" is the truth: the printed command line gives the table's prediction."""
    from overdrive.cli import main

    r = next(x for x in load_runs() if x["id"] == rid)
    assert main(["plan", *plan_flags(r).split(), "--json"]) == 0
    top = json.loads(capsys.readouterr().out)["top"]
    assert top["tokens_per_s_per_gpu"] == pytest.approx(predict(r)["predicted"], rel=1e-9)
    assert top["allocated_gib"] == pytest.approx(predict(r)["allocated_gib"], abs=1e-3)


def _load_script(name):
    import importlib.util
    import sys

    here = os.path.join(os.path.dirname(__file__), "..", "..", "scripts")
    sys.path.insert(0, here)
    spec = importlib.util.spec_from_file_location(name, os.path.join(here, f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_doc_states_leave_one_source_out_beside_in_sample_with_worst_and_memory():
    """docs/plan-loso.json (scripts/plan_loso.py) is what the doc shows: the per-source table, and the summary's
    leave-one-source-out, in-sample and shipped figures, each with its worst case and the memory beside it."""
    loso = _load_script("plan_loso")
    res = json.load(open(os.path.join(os.path.dirname(DOC), "plan-loso.json")))
    doc = open(DOC).read()
    assert loso.markdown(res) in doc
    s = loso.summary_line(res)
    line = re.search(r"Leave-one-source-out .*?median \|throughput error\| (\d+\.\d)%, worst (\d+)%", doc, re.S)
    assert line and float(line.group(1)) == round(100 * s["loso"]["median"], 1)
    assert int(line.group(2)) == round(100 * s["loso"]["worst"])
    # every source is held out once, and its rows are the data file's rows
    runs = load_runs()
    assert sum(len(v["loso"]) for v in res["sources"].values()) == len(runs)
    assert {loso.source_of(r) for r in runs} == set(res["sources"])
    # the shipped figures are what the planner predicts today (no stale JSON)
    shipped = {r["id"]: r["error"] for v in res["sources"].values() for r in v["shipped"]}
    for r in runs[::10]:
        assert shipped[r["id"]] == pytest.approx(predict(r)["error"], abs=1e-4)


@pytest.mark.slow
def test_leave_one_source_out_refit_reproduces_for_a_small_source():
    """Refit without torchao's README (3 runs) from the neutral start: the constants and errors in the JSON."""
    import copy

    loso = _load_script("plan_loso")
    cal = _load_script("plan_calibrate")
    res = json.load(open(os.path.join(os.path.dirname(DOC), "plan-loso.json")))
    src = "pytorch/ao torchao/float8/README.md"
    runs = load_runs()
    fitted = cal.fit(loso.fit_set([r for r in runs if loso.source_of(r) != src]),
                     start=copy.deepcopy(loso.NEUTRAL), log=lambda *_: None)
    want = {r["id"]: r["error"] for r in res["sources"][src]["loso"]}
    for r in runs:
        if loso.source_of(r) == src:
            assert predict(r, fitted)["error"] == pytest.approx(want[r["id"]], abs=1e-4)


def test_the_unseen_sources_are_validation_only_cited_and_their_error_is_in_the_doc(validation):
    """The sources added after every term and fitted on nothing (fms-fsdp, OLMo-core, TinyLlama, FlagPerf,
    dgxc-benchmarking; the older stacks' BLOOM and MT-NLG have their own test): validation rows,
    each citing its file at a commit with a note of its assumptions, and the summary states their error as it is
    (no bound: it is the figure on sources the model never saw)."""
    unseen = [r for r in load_runs() if r.get("held_out") == "unseen source"]
    # dgxc-benchmarking: first planned unseen (first_planned kept), calibration since (the megatron bf16 runs)
    assert all((r["role"] == "validation" or r["source"].startswith("NVIDIA/dgxc-benchmarking"))
               and re.search(r" @ [0-9a-f]{7,40}", r["source"]) and r["note"] for r in unseen)
    counts = {key: sum(key in r["source"] for r in unseen) for key in
              ("fms-fsdp README.md @ 0d319983", "OLMo-core README.md @ e27ba745", "TinyLlama README.md @ 8148930f",
               "bigscience-workshop/bigscience", "Smith et al. 2022",
               "FlagOpen/FlagPerf training/nvidia/llama3_", "NVIDIA/dgxc-benchmarking llama3.1/README_",
               "InternLM/InternLM doc/en/train_performance.md @ 20fe5ac2", "NVIDIA/Megatron-LM README.md @ f2e5db40",
               "stas00/ml-engineering insights/when-to-upgrade-gpus/README.md @ 744d01e1", *BLIND_SOURCES,
               *BLIND2_SOURCES, "Dao-AILab/flash-attention", "Naman-ntc/FastCode")}
    assert counts == {"fms-fsdp README.md @ 0d319983": 4, "OLMo-core README.md @ e27ba745": 8,
                      "TinyLlama README.md @ 8148930f": 1, "bigscience-workshop/bigscience": 8,
                      "Smith et al. 2022": 3, "FlagOpen/FlagPerf training/nvidia/llama3_": 7,
                      "NVIDIA/dgxc-benchmarking llama3.1/README_": 34,
                      "InternLM/InternLM doc/en/train_performance.md @ 20fe5ac2": 6,
                      "NVIDIA/Megatron-LM README.md @ f2e5db40": 9,
                      "stas00/ml-engineering insights/when-to-upgrade-gpus/README.md @ 744d01e1": 15,
                      **BLIND_SOURCES, **BLIND2_SOURCES, "Dao-AILab/flash-attention": 5, "Naman-ntc/FastCode": 6}, counts
    assert sum(counts.values()) == len(unseen)
    assert all("token/gpu/sec" in r["note"] for r in unseen if "fms-fsdp" in r["source"])
    # the figure for the sources that shaped nothing (the older stacks and InternLM shaped terms, and ml-engineering's
    # long-context rows sent us to llm-foundry's kernel: their own sections)
    s = summary([r for r in validation if r["held_out"] == "unseen source"
                 and not r["source"].startswith(("bigscience-workshop", "Smith et al.", "InternLM/InternLM",
                                                 "FlagOpen/FlagPerf", "NVIDIA/Megatron-LM", "stas00/ml-engineering",
                                                 "QwenLM/Qwen", "huggingface/nanotron", "snowflakedb/ArcticTraining",
                                                 "alibaba/Megatron-LLaMA", "hpcaitech/ColossalAI",
                                                 "Dao-AILab/flash-attention"))])
    # the second blind check's sources that shaped nothing: picotron 2 (Colossal-AI's memory row sent us to the
    # loss's peak coming before the backward's); the third's: FastCode 6 (flash-attention's ZeRO-1 rows sent us to
    # --zero-broadcast with fp32 gradients)
    assert s["n"] == 13 + 57 + 2 + 6
    doc = open(DOC).read()
    assert (f"tokens/s error: median {100 * s['median_abs_error']:.1f}%, worst {100 * s['worst_abs_error']:.0f}%"
            in doc)
    assert expressed_table([r for r in validation if r["held_out"] == "unseen source"]) in doc


def _doc() -> str:
    return open(DOC).read()


def test_the_older_stacks_first_sight_is_kept_beside_the_error_after(validation):
    """BLOOM-176B and MT-NLG were planned before any term was added for them; each row keeps that figure
    (`first_planned`), and the doc's section states the first-sight and the present errors from the data."""
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "scripts"))
    from plan_doc_sections import first_sight_rows, older_stacks_section

    older = ("bigscience-workshop", "Smith et al.")
    runs = [r for r in load_runs() if "first_planned" in r and r["source"].startswith(older)]
    assert {r["id"].split()[0] for r in runs} == {"BLOOM-176B", "MT-NLG"}
    assert all(r["held_out"] == "unseen source" and r["role"] == "validation" and r.get("deepspeed_pipeline")
               for r in runs)
    rows = [r for r in first_sight_rows(validation) if r["source"].startswith(older)]
    assert [r["id"] for r in rows if r["first_error"] is not None] == [r["id"] for r in runs]
    for r in rows:
        if r["first_error"] is not None:
            run = next(x for x in runs if x["id"] == r["id"])
            assert r["first_error"] == pytest.approx(run["first_planned"] / run["tps"] - 1)
            assert (f"| {r['id']} | {r['published']:,.1f} | {r['first_planned']:,.1f} | {100 * r['first_error']:+.0f}% |"
                    in _doc())
    # the memory first sight: BLOOM's prequel rows, each row's first_memory against its published nvidia-smi
    mem = [r for r in rows if r["first_memory_error"] is not None]
    assert len(mem) == 5 and all(r["memory_measure"] == "nvidia-smi" for r in mem)
    for r in mem:
        assert f"| {r['memory_published']:.0f} | {r['first_memory']:.1f} | {100 * r['first_memory_error']:+.0f}% |" in _doc()
    assert older_stacks_section(validation) in _doc()


def test_rows_added_unseen_keep_their_first_sight_error_and_the_doc_shows_them(validation):
    """Every row added after the planner was written (OLMo-core, TinyLlama, torchtitan's async-TP file,
    ml-engineering) keeps the tokens/s it was planned at when added (`first_planned`), and the doc's section renders them with their
    expressions."""
    runs = {r["id"]: r for r in load_runs()}
    added = [p for p in validation if "first_planned" in runs[p["id"]] and not p["source"].startswith(
        ("bigscience-workshop", "Smith et al.", "InternLM/InternLM"))   # InternLM: its own test below
             and p["id"] not in BLIND2_IDS   # the second and third blind checks: tests/unit/test_plan_blind[23].py
             and not p["source"].startswith(("Dao-AILab/flash-attention", "Naman-ntc/FastCode"))]
    # dgxc-benchmarking's llama3.1 34 are calibration since; its Nemotron-4 26 and GPT-3 10 are here; the blind check 57
    assert len(added) == 88 + 57
    # first sight within a factor of 1.7 (the blind check's worst: Megatron-DeepSpeed's 30B at 256K, +61%)
    assert all(0.5 < runs[p["id"]]["first_planned"] / runs[p["id"]]["tps"] < 1.7 for p in added)
    doc = open(DOC).read()
    assert "## PyTorch-stack sources added unseen" in doc
    pytorch = [p for p in added if runs[p["id"]].get("stack", "pytorch") == "pytorch"]
    # OLMo-core 8, TinyLlama 1, torchtitan's async-TP 12, ml-engineering 15; the blind check's PyTorch and DeepSpeed 37
    assert len(pytorch) == 36 + 37
    blind = [p for p in added if p["id"] in BLIND_IDS]
    assert len(blind) == 57 and "## The blind check (2026-12-07)" in doc
    assert expressed_table([p for p in pytorch if p not in blind]) in doc and expressed_table(blind) in doc


def test_the_megatron_core_sources_added_unseen_keep_their_first_sight(validation):
    """FlagPerf's Llama 3 rows (Megatron-core 0.6) and dgxc-benchmarking's Llama 3.1 rows (NeMo 24.09) were added
    after every term and planned on arrival: each row keeps that first-sight tokens/s (and FlagPerf's nvidia-smi
    GiB) in its note and its first_planned, each note names the file's commit, and the doc states the first-sight
    figures beside the ones now."""
    runs = {r["id"]: r for r in load_runs()}
    rows = [p for p in validation + evaluate("calibration")   # dgxc-benchmarking's: calibration since
            if p["source"].startswith(("FlagOpen/FlagPerf", "NVIDIA/dgxc-benchmarking llama3.1/"))]
    assert len(rows) == 41 and all(runs[p["id"]]["held_out"] == "unseen source" for p in rows)
    assert {p["role"] for p in rows if p["source"].startswith("NVIDIA/dgxc")} == {"calibration"}
    for p in rows:
        r = runs[p["id"]]
        # FlagPerf's A800 row: the A100 80GB with NVLink at 200 GB/s a direction (--intra-gbs 200)
        assert r["stack"] == "megatron" and p["fits"], p["id"]
        assert r["gpu"] == "h100-sxm" or (r["gpu"] == "a100-80" and r["intra_gbs"] == 200), p["id"]
        assert r["first_planned"] > 0 and r["source"].split(" @ ")[1][:8] in r["note"]
        assert f"{r['first_planned']}" in r["note"], p["id"]
    mem = [p for p in rows if "memory_published" in p]
    assert len(mem) == 7 and all(p["id"].startswith("FlagPerf") and p["memory_measure"] == "nvidia-smi" for p in mem)
    assert all(runs[p["id"]]["first_memory"] > 0 for p in mem)
    for p in mem:
        # since first planned, --dropout (their notes' 0.1), the busiest pipeline stage, NCCL's buffers (nvidia-smi
        # sees them) and Transformer Engine's FP8 weight cache only add what was missing; without the flag and
        # those two terms the single-stage rows plan their first-sight GiB again; the backward's own gradients
        # (memory.backward_grad_bytes, added since) too, on the busiest stage's allocated x the reserved share
        r = runs[p["id"]]
        s = _setup(r)
        grads = backward_grad_bytes(run_model(r), s) / GIB * (1 + RESERVED_SHARE)
        if "8xA800" in p["id"]:   # added after all of those: planned with them, and unchanged since but for that
            assert p["memory_predicted"] - grads == pytest.approx(r["first_memory"], abs=0.051)
            continue
        assert r["dropout"] and p["memory_predicted"] > r["first_memory"], p["id"]
        if r["pp"] == 1:
            # (and the loss: Megatron-Core 0.6's out-of-place cross-entropy, --loss megatron-v07, set after first sight)
            again = predict({k: v for k, v in r.items() if k not in ("dropout", "loss")})
            added = (nccl_buffer_bytes(s) / GIB + te_weight_cache_bytes(run_model(r), s) / GIB * (1 + RESERVED_SHARE)
                     + grads)
            assert (s.low_precision and not r.get("fp8_all_gather")) == (te_weight_cache_bytes(run_model(r), s) > 0)
            assert again["memory_predicted"] - added == pytest.approx(r["first_memory"], abs=0.051), p["id"]
    first = sorted(abs(runs[p["id"]]["first_planned"] / runs[p["id"]]["tps"] - 1) for p in rows)
    now = sorted(abs(p["error"]) for p in rows)
    doc = " ".join(open(DOC).read().split())
    import statistics
    assert f"{100 * statistics.median(first):.1f}%, worst {100 * first[-1]:.0f}% ({len(first)} runs); now all " \
           f"median {100 * statistics.median(now):.1f}%, worst {100 * now[-1]:.0f}% (n={len(now)})" in doc


def test_internlm_rows_keep_their_first_sight_and_the_doc_renders_their_section(validation):
    """InternLM's 7B table (an unseen trainer) was planned on arrival: each row keeps its first-sight tokens/s in
    first_planned and in its note, quotes its table line and names the page's commit; the doc's section (first
    sight beside now, and the step each run loses beyond the plan) is what the data renders."""
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "scripts"))
    from plan_doc_internlm import internlm_rows, internlm_section

    runs = {r["id"]: r for r in load_runs()}
    rows = internlm_rows(validation)
    assert len(rows) == 6 and {runs[p["id"]]["gpus"] for p in rows} == {8, 128, 1024}
    for p in rows:
        r = runs[p["id"]]
        assert r["held_out"] == "unseen source" and r["role"] == "validation" and p["fits"], p["id"]
        assert "20fe5ac2" in r["source"] and f"{r['first_planned']}" in r["note"] and f"{r['tps']} |" in r["note"]
        assert r["first_planned"] > 0 and r["model"]["vocab"] == 103168
        # planned since with the Hybrid ZeRO they run (--zero-broadcast), within the bound the others meet
        assert r["zero_broadcast"] and "--zero-broadcast" in r["note"] and abs(p["error"]) <= 0.25, p
    assert internlm_section(validation) in open(DOC).read()


def test_a_run_its_source_flags_as_a_defect_is_shown_not_fitted(validation):
    """torchtitan's async-TP file flags its rowwise-float8-with-TP baseline as a defect (its issue #1207): those
    runs are in the data and the doc, but no fit uses them and no figure counts them."""
    loso = _load_script("plan_loso")
    runs = load_runs()
    bug = [r for r in runs if r.get("stack_bug")]
    assert len(bug) == 2 and all("torchtitan/issues/1207" in r["stack_bug"] and "rowwise" in r["id"] for r in bug)
    fit = loso.fit_set(runs)
    assert not any(r.get("stack_bug") for r in fit)
    assert len(fit) == len(loso.fit_set([r for r in runs if not r.get("stack_bug")]))
    assert not loso._rated({"power_limited": False, "stack_bug": True})
    assert all(p["stack_bug"] for p in validation if p["id"] in {r["id"] for r in bug})
    doc = open(DOC).read()
    assert "pytorch/torchtitan#1207" in doc


def test_megatron_lm_weak_scaling_rows_follow_the_published_tflops_and_keep_their_first_sight(validation):
    """Megatron-LM's H100 weak-scaling table (README @ f2e5db40, Megatron-Core r0.8.0) publishes TFLOP/s per GPU:
    each row's tokens/s is that over Megatron's own FLOP count per token (training.py's
    num_floating_point_operations), its micro-batch is not published so the planner searches it, and the row keeps
    the tokens/s it was first planned at, in first_planned and in its note; fitted on nothing."""
    runs = {r["id"]: r for r in load_runs()}
    rows = [p for p in validation if p["source"].startswith("NVIDIA/Megatron-LM README.md @ f2e5db40")]
    assert len(rows) == 9 and sorted(runs[p["id"]]["gpus"] for p in rows) == [48, 96, 192, 384, 768, 1536, 2304,
                                                                                 3072, 6144]
    for p in rows:
        r = runs[p["id"]]
        m, s, v = r["model"], r["seq"], r["model"]["vocab"]
        l, h = m["n_layer"], m["hidden"]
        flops = 12 * l * h * h * (6 + s / h + v / (2 * l * h))   # 4h GeLU MLP, no GQA, untied head
        assert r["tps"] == pytest.approx(r["published_tflops"] * 1e12 / flops, abs=0.06), p["id"]
        assert r["gpus"] // (r["tp"] * r["pp"]) == 48 and r["global_batch"] == 48 * 4 * r["pp"]
        assert "micro_batch" not in r and p["micro_batch"] >= 1 and p["fits"], p["id"]
        assert f"{r['first_planned']}" in r["note"] and "f2e5db40" in r["note"] and r["first_planned"] > 0


@pytest.mark.parametrize("size", ["1.7B", "70B"])
def test_an_unpublished_micro_batch_is_searched_like_the_plan_does(size, capsys):
    """A run without a micro-batch: each micro-batch dividing the data-parallel share is planned and ranked as
    `overdrive plan` ranks them (the fastest leaving the safety margin free first), so the doc's "expressed as"
    command, which omits --micro-batch, plans the table's number; the estimate's notes say what was chosen."""
    import dataclasses

    from overdrive.cli import main
    from overdrive.plan.validation import _estimate_searching_micro_batch

    r = next(r for r in load_runs() if r["id"].startswith(f"Megatron-LM r0.8 {size} "))
    m, s = run_model(r), _setup(r)
    e = _estimate_searching_micro_batch(m, s, None)
    tried = [estimate(m, dataclasses.replace(s, micro_batch=mb)) for mb in (1, 2, 4)]
    roomy = [t for t in tried if t.fits and t.headroom_gib >= 0.1 * s.gpu.mem_gib - 0.05]
    best = max(roomy, key=lambda t: t.tokens_per_s_per_gpu)
    assert e.setup.micro_batch == best.setup.micro_batch
    assert e.tokens_per_s_per_gpu == pytest.approx(best.tokens_per_s_per_gpu)
    assert e.notes[0].startswith(f"micro-batch not published: {best.setup.micro_batch} chosen")
    assert predict(r)["micro_batch"] == e.setup.micro_batch
    capsys.readouterr()
    assert main(["plan", *plan_flags(r).split(), "--json"]) == 0
    top = json.loads(capsys.readouterr().out)["top"]
    assert top["micro_batch"] == e.setup.micro_batch
    assert top["tokens_per_s_per_gpu"] == pytest.approx(e.tokens_per_s_per_gpu, rel=1e-9)


def test_megatron_bf16_runs_are_in_the_calibration_and_the_pairs_show_why(validation):
    """The Megatron-core configurations published in both bf16 and FP8 (dgxc-benchmarking, FlagPerf) gained more
    from FP8 than the plan did, because the megatron Hopper efficiency was fitted on FP8 runs alone: dgxc's runs are
    calibration now, and the pairs nobody fitted (FlagPerf's) and Megatron-LM's bf16 table are planned closer than
    with the constants before; the doc's section is what the data renders."""
    import statistics
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "scripts"))
    from plan_doc_megatron import BEFORE_FIGURES, _ratio, megatron_bf16_section, precision_pairs
    from plan_doc_sections import loso_summary

    pairs = precision_pairs()
    assert len(pairs) == 19 and all(b["precision"] == "bf16" and f["precision"] == "fp8-delayed" for b, f in pairs)
    cal = evaluate("calibration")
    assert any(p["source"].startswith("NVIDIA/dgxc") and p["precision"] == "bf16" for p in cal)
    flag = [p for p in pairs if p[0]["role"] == "validation"]
    assert flag and all(p[0]["source"].startswith("FlagOpen/FlagPerf") for p in flag)
    # the figures before are quoted (computed with the code they shipped with): FlagPerf's pairs were planned at
    # 1.20, published 1.29-1.30; Megatron-LM's table at 20.9% median
    planned_before = float(BEFORE_FIGURES["pairs_planned"][flag[0][0]["source"].split(" @")[0]].split("-")[0])
    assert all(abs(_ratio(p)[1] / _ratio(p)[0] - 1) < abs(planned_before / _ratio(p)[0] - 1) for p in flag)
    mlm = [p for p in validation if p["source"].startswith("NVIDIA/Megatron-LM")]
    now = statistics.median(abs(p["error"]) for p in mlm)
    assert now < float(BEFORE_FIGURES["megatron_lm"].split("median ")[1].split("%")[0]) / 100
    assert megatron_bf16_section(validation, cal, loso_summary()) in open(DOC).read()


def test_the_nemotron_files_are_planned_as_first_seen_and_stated_apart(validation):
    """dgxc-benchmarking's Nemotron-4 15B/340B files (added after every term, fitted on nothing): 26 validation rows,
    each with the tokens/s it was planned at on arrival and a note naming the commit and the launch settings it
    was expressed from; the doc's summary states their first sight apart, and the validation figure without them
    (26 near-identical rows of one family must not carry the headline)."""
    mod = _load_script("plan_doc_megatron")
    NEMOTRON, nemotron_bullet = mod.NEMOTRON, mod.nemotron_bullet
    runs = {r["id"]: r for r in load_runs()}
    rows = [p for p in validation if p["source"].startswith(NEMOTRON)]
    assert len(rows) == 26 and {runs[p["id"]]["held_out"] for p in rows} == {"new file"}
    for p in rows:
        r = runs[p["id"]]
        assert r["stack"] == "megatron" and r["tp"] in (4, 8) and p["fits"], p["id"]
        assert r["first_planned"] > 0 and "35a9aecc" in r["note"] and "configure.sh" in r["note"]
        total = re.search(r"Table: [0-9.]+ s per step, ([0-9,]+) tokens/s over (\d+) GPUs", r["note"])
        assert int(total.group(2)) == r["gpus"]
        assert int(total.group(1).replace(",", "")) / r["gpus"] == pytest.approx(r["tps"], abs=0.01)
    big = [runs[p["id"]] for p in rows if "340B" in p["id"]]
    assert all(r["attention"] == "fa2" and r["recompute_modules"] == ["core_attn"] and r["optimizer_dtype"] == "bf16"
               for r in big)
    bullet = nemotron_bullet(validation)
    first = sorted(abs(runs[p["id"]]["first_planned"] / p["published"] - 1) for p in rows)
    assert f"first sight median {100 * statistics.median(first):.1f}%" in bullet
    assert bullet in open(DOC).read()


def test_the_gpt3_file_is_planned_as_first_seen_with_its_launch_settings(validation):
    """dgxc-benchmarking's GPT-3 175B file (NeMo 24.12, added after the cast count, fitted on nothing): 10 validation
    rows read from its yaml and configure.sh (TP4 PP8 VP6, GBS = 16 x nodes, dropout 0.1, TE delayed-scaling FP8),
    each with the tokens/s it was planned at on arrival, their tokens/s the table's step time over 4,096 tokens per
    GPU; the doc's bullet states first sight apart and says the FP8 gain is planned high."""
    mod = _load_script("plan_doc_megatron")
    runs = {r["id"]: r for r in load_runs()}
    rows = [p for p in validation if p["source"].startswith(mod.GPT3)]
    assert len(rows) == 10 and {runs[p["id"]]["held_out"] for p in rows} == {"new file"}
    for p in rows:
        r = runs[p["id"]]
        assert (r["tp"], r["pp"], r["vpp"], r["micro_batch"], r["seq"]) == (4, 8, 6, 1, 2048)
        assert r["global_batch"] == 16 * r["gpus"] // 8 and r["dropout"] and r["stack"] == "megatron" and p["fits"]
        assert r["precision"] in ("bf16", "fp8-delayed") and "0efdb235" in r["note"] and "configure.sh" in r["note"]
        step = float(re.search(r"Table: ([0-9.]+) s per step", r["note"]).group(1))
        assert r["tps"] == pytest.approx(2048 * r["global_batch"] / step / r["gpus"], abs=0.01)
        assert r["first_planned"] > 0
    bullet = mod.gpt3_bullet(validation)
    first = sorted(abs(runs[p["id"]]["first_planned"] / p["published"] - 1) for p in rows)
    assert f"first sight median {100 * statistics.median(first):.1f}%" in bullet and "planned high" in bullet
    assert all(r["first_planned"] > r["tps"] for r in (runs[p["id"]] for p in rows) if r["precision"] != "bf16")
    assert bullet in open(DOC).read()


def test_loso_jobs_flag_is_a_positive_count_checked_before_any_fit():
    """scripts/plan_loso.py --jobs N runs the folds in N processes; anything but a positive whole number is refused in
    one line before the first fit (the all-sources fit alone takes a minute)."""
    loso = _load_script("plan_loso")
    assert loso.jobs_from_argv(["plan_loso.py", "--jobs", "3"]) == 3
    assert loso.jobs_from_argv(["plan_loso.py"]) >= 1
    for bad in (["--jobs", "0"], ["--jobs", "x"], ["--jobs", "-2"], ["--jobs"]):
        with pytest.raises(SystemExit, match=r"--jobs needs a positive whole number of processes"):
            loso.jobs_from_argv(["plan_loso.py", *bad])
