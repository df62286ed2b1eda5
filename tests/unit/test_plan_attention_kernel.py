"""The attention kernel the planner times: which one each stack and GPU generation runs, its published share of the
peak, the sequence roll-off, and --attention's choices end to end."""

import dataclasses
import json

import pytest

from plan_cli import run  # noqa: F401 (run is a fixture)
from overdrive.env import gpu_by_key
from overdrive.plan import TrainSetup, estimate, get_model
from overdrive.plan.explain import explain
from overdrive.plan.attention import ATTN_PEAK_SHARE, ATTN_SEQ_RATE, attention_kernel, attention_share
from overdrive.plan.throughput import CALIBRATION, compute_times

M8 = get_model("llama3-8b")


def _setup(gpu="h100-sxm", **kw):
    kw = {"seq": 8192, "micro_batch": 1, "precision": "bf16", "sharding": "fsdp", **kw}
    return TrainSetup(gpu=gpu_by_key(gpu), nodes=1, **{"gpus_per_node": 8, **kw})


@pytest.mark.parametrize("gpu, stack, want", [
    ("a100-80", "pytorch", "fa2"), ("h100-sxm", "pytorch", "fa2"), ("h200", "pytorch", "fa2"),
    ("b200", "pytorch", "cudnn"), ("gb200", "pytorch", "cudnn"),
    ("a100-80", "megatron", "cudnn"), ("h100-sxm", "megatron", "cudnn"), ("b200", "megatron", "cudnn"),
])
def test_each_stack_and_generation_gets_its_own_kernel(gpu, stack, want):
    assert attention_kernel(_setup(gpu, stack=stack)) == want


@pytest.mark.parametrize("asked", ["fa2", "cudnn"])
def test_an_asked_kernel_overrides_the_stack(asked):
    for stack in ("pytorch", "megatron"):
        assert attention_kernel(_setup(stack=stack, attention=asked)) == asked


def test_hopper_native_kernel_runs_attention_faster_by_the_published_ratio():
    fa2, cudnn = (compute_times(M8, _setup(attention=k))["attention"] for k in ("fa2", "cudnn"))
    assert fa2 / cudnn == pytest.approx(ATTN_PEAK_SHARE["cudnn"][9] / ATTN_PEAK_SHARE["fa2"][9])
    # on Ampere the two are the same class of kernel
    a = [compute_times(M8, _setup("a100-80", attention=k))["attention"] for k in ("fa2", "cudnn")]
    assert a[0] == pytest.approx(a[1])


def test_attention_rate_is_the_kernels_not_the_gemms():
    """Changing the stack's GEMM efficiency leaves the fused attention's time alone (it has its own rate)."""
    s = _setup()
    slow = dict(CALIBRATION, gemm_eff={k: {g: 0.3 for g in v} for k, v in CALIBRATION["gemm_eff"].items()})
    assert compute_times(M8, s, slow)["attention"] == pytest.approx(compute_times(M8, s)["attention"])
    assert compute_times(M8, s, slow)["gemm"] > 1.5 * compute_times(M8, s)["gemm"]


def test_sequence_roll_off_follows_the_benchmark_points_and_is_monotone():
    s = _setup()
    top = ATTN_PEAK_SHARE["fa2"][9]
    for seq, rate in ATTN_SEQ_RATE:
        assert attention_share(s, seq) == pytest.approx(top * rate)
    assert attention_share(s, 1 << 20) == pytest.approx(top)
    seqs = [64, 128, 256, 512, 700, 1024, 3000, 4096, 6000, 8192, 12000, 16384, 65536]
    shares = [attention_share(s, q) for q in seqs]
    assert all(a <= b for a, b in zip(shares, shares[1:])) and shares[0] > 0
    # attention per token at 2K runs below its 16K rate: FLOPs per token halve, time falls by less
    t2k = compute_times(M8, dataclasses.replace(s, seq=2048))["attention"] / 2048
    t4k = compute_times(M8, dataclasses.replace(s, seq=4096))["attention"] / 4096
    assert 0.5 * t4k < t2k < t4k


def test_context_parallel_chunks_run_at_their_own_length():
    s = _setup(seq=65536, cp=8)
    assert attention_share(s, s.seq / s.cp) == pytest.approx(ATTN_PEAK_SHARE["fa2"][9] * 0.99)


def test_explain_names_the_kernel_and_the_alternative_on_hopper():
    e = estimate(M8, _setup())
    text = "\n".join(explain(e))
    assert "attention kernel: FlashAttention-2 (the pytorch stack's on h100-sxm)" in text
    assert "--attention cudnn" in text
    text = "\n".join(explain(estimate(M8, _setup(attention="cudnn"))))
    assert "cuDNN's fused attention" in text and "(--attention)" in text and "PyTorch >= 2.11" not in text


def test_cli_attention_cudnn_plans_faster_than_fa2(run):
    out = {}
    for k in ("fa2", "cudnn"):
        r = run("--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--precision", "bf16", "--micro-batch",
                "1", "--seq", "8192", "--attention", k, "--json")
        assert r.returncode == 0, r.stderr
        out[k] = json.loads(r.stdout)
    assert [out[k]["top"]["attention_kernel"] for k in ("fa2", "cudnn")] == ["fa2", "cudnn"]
    tps = [out[k]["top"]["tokens_per_s_per_gpu"] for k in ("fa2", "cudnn")]
    assert tps[1] > 1.05 * tps[0]


def test_plan_json_says_which_kernel_the_default_was(run):
    for gpu, want in (("h100-sxm", "fa2"), ("b200", "cudnn")):
        r = run("--model", "llama3-8b", "--gpu", gpu, "--gpus", "8", "--precision", "bf16", "--micro-batch", "1",
                "--json")
        top = json.loads(r.stdout)["top"]
        assert (top["attention"], top["attention_kernel"]) == ("flash", want)


def test_published_rows_that_name_a_kernel_say_why_from_their_source():
    """A run expressed with another kernel than its stack's must say, in its note, what in its source ran it:
    OLMo-core's scripts ran on a PyTorch nightly that put cuDNN's SDPA first on H100; dgxc-benchmarking's
    Nemotron-4 340B configure.sh turns Transformer Engine's cuDNN attention off (NVTE_FUSED_ATTN=0); ms-swift's
    Megatron run is on an A800, where Transformer Engine picks flash-attn."""
    from overdrive.plan.validation import load_runs, plan_flags

    named = [r for r in load_runs() if r.get("attention") in ("fa2", "cudnn")]
    # the second blind check's PyTorch rows name the flash-attn 2 call their code makes
    fa2_calls = {"nanotron": "flash_attn_varlen_func (FA2)", "picotron": "flash_attn_func (FA2)",
                 "ArcticTraining": "flash_attention_2", "FastCode": "flash_attn_func(q,k,v,causal=True) (FA2 API"}
    for r in [r for r in named if r["id"].split()[0] in fa2_calls]:
        assert r["attention"] == "fa2" and fa2_calls[r["id"].split()[0]] in r["note"], r["id"]
    # the third blind check's FastCode rows that ran xformers' kernel say it and that FlashAttention-2 is assumed
    xf = [r for r in named if r["id"].endswith("(xformers)")]
    assert len(xf) == 4 and all("memory_efficient_attention" in r["note"] and "assumed fa2" in r["note"] for r in xf)
    named = [r for r in named if r["id"].split()[0] not in fa2_calls]
    assert {r["id"].split()[0] for r in named} == {"OLMo-core", "dgxc-benchmarking", "ms-swift"}
    # Megatron-SWIFT on A800: Transformer Engine prefers flash-attn to cuDNN's kernels off sm90
    swift = [r for r in named if r["id"].startswith("ms-swift")]
    assert len(swift) == 1 and "sm90" in swift[0]["note"] and swift[0]["attention"] == "fa2"
    olmo = [r for r in named if r["id"].startswith("OLMo-core")]
    assert len(olmo) == 8
    for r in olmo:
        assert "2.6.0.dev20241009" in r["note"] and "pytorch/pytorch#138522" in r["note"]
        assert "--attention cudnn" in plan_flags(r)
    for r in (r for r in named if r not in olmo and r not in swift):
        assert r["stack"] == "megatron" and "NVTE_FUSED_ATTN=0" in r["note"]
        assert "--attention fa2" in plan_flags(r)
    # FlashAttention-3 rows: Hugging Face's attn_implementation="flash_attention_3", said in the note
    fa3 = [r for r in load_runs() if r.get("attention") == "fa3"]
    assert fa3 and all("flash_attention_3" in r["note"] and "--attention fa3" in plan_flags(r) for r in fa3)


def test_efficiency_override_slows_attention_in_proportion():
    """--efficiency / --calibrate (a measured or throttled rate) scale attention with the GEMMs."""
    s = _setup()
    base = compute_times(M8, s)
    cal = CALIBRATION["gemm_eff"]["pytorch"][9]
    half = compute_times(M8, dataclasses.replace(s, efficiency=cal / 2))
    assert half["attention"] == pytest.approx(2 * base["attention"])
    assert half["gemm"] == pytest.approx(2 * base["gemm"])


def test_explain_marks_assumed_shares_and_odd_head_dims():
    text = "\n".join(explain(estimate(M8, _setup("a100-80"))))
    assert "assumed" in text and "FlashAttention-3 paper's H100 figures" not in text
    from overdrive.plan import ModelSpec

    wide = ModelSpec(name="wide", n_layer=2, hidden=4096, n_head=8, n_kv_head=8, ffn=8192, vocab=32000)
    text = "\n".join(explain(estimate(wide, _setup())))
    assert "FlashAttention-2 takes head dims up to 256: 512 would not run there" in text


@pytest.mark.parametrize("asked, hint", [("FA2", "did you mean --attention fa2"), (" cudnn", "did you mean --attention cudnn"),
                                         ("flash3", r"is not one of flash, fa1, fa2, fa3, cudnn, triton, unfused$")])
def test_attention_typos_get_the_near_value(run, asked, hint):
    from plan_cli import refused

    refused(run("--model", "llama3-8b", "--gpu", "h100-sxm", "--precision", "bf16", "--micro-batch", "1",
                "--attention", asked), hint)


def test_head_dims_other_than_128_are_shown_at_the_published_ratios_not_planned():
    from overdrive.plan import ModelSpec
    from overdrive.plan.attention import ATTN_HEAD_DIM, head_dim_ratio

    s = _setup()
    for kernel in ("fa2", "cudnn"):
        k = dataclasses.replace(s, attention=kernel)
        for hd, ratio in ATTN_HEAD_DIM[kernel]:
            assert head_dim_ratio(k, hd) == pytest.approx(ratio)
        assert head_dim_ratio(k, 32) == pytest.approx(head_dim_ratio(k, 64))   # flat outside the points
        assert ATTN_HEAD_DIM[kernel][0][1] <= head_dim_ratio(k, 96) <= 1.0
    # planned at head dim 128's rate: attention time follows the FLOPs alone
    m64 = ModelSpec(name="hd64", n_layer=2, hidden=2048, n_head=32, n_kv_head=32, ffn=8192, vocab=32000)
    m128 = ModelSpec(name="hd128", n_layer=2, hidden=2048, n_head=16, n_kv_head=16, ffn=8192, vocab=32000)
    assert compute_times(m64, s)["attention"] == pytest.approx(compute_times(m128, s)["attention"])
    text = "\n".join(explain(estimate(m64, s)))
    assert "head dim 64 planned at 128's rate" in text and "0.89 of that" in text


@pytest.mark.parametrize("kernel, head_dim, padded", [
    ("triton", 96, 128), ("triton", 100, 128), ("triton", 128, 128), ("triton", 64, 64), ("triton", 8, 16),
    ("triton", 112, 128), ("fa2", 96, 96), ("fa2", 100, 128), ("fa2", 80, 96), ("fa2", 112, 128), ("fa2", 200, 224),
    ("fa2", 230, 256), ("fa2", 192, 192), ("fa2", 300, 300), ("triton", 200, 200), ("fa3", 80, 96), ("fa3", 160, 192), ("fa3", 64, 64), ("fa3", 32, 64),
    ("cudnn", 100, 100), ("unfused", 100, 100), ("fa1", 40, 64), ("fa1", 96, 128), ("fa1", 128, 128),
    ("fa1", 24, 32), ("fa1", 160, 160),
])
def test_each_kernel_pads_a_head_to_the_dim_it_was_compiled_for(kernel, head_dim, padded):
    """FlashAttention-2's HEADDIM_SWITCH (PyTorch's vendored copy keeps 224), FlashAttention-3's round_up_headdim,
    the Triton kernel's next power of two (at least 16); past the widest a kernel takes, unpadded (it would not run);
    cuDNN's tiling is not published, the unfused GEMMs are timed at their own shape."""
    from overdrive.plan.attention import padded_head_dim

    assert padded_head_dim(kernel, head_dim) == padded


@pytest.mark.parametrize("kernel, gpu, slower", [("triton", "a100-80", 128 / 96), ("fa2", "a100-80", 1.0),
                                                  ("cudnn", "h100-sxm", 1.0), ("fa3", "h100-sxm", 1.0)])
def test_a_padded_head_dim_costs_its_zeros(kernel, gpu, slower):
    """The same attention FLOPs (heads x head dim = hidden) at head dim 96 and 128: the Triton kernel computes the
    96-wide head in 128-wide tiles, 4/3 the time; the kernels compiled at 96 run it as 128's FLOPs."""
    from overdrive.plan import ModelSpec

    s = _setup(gpu, attention=kernel)
    m96, m128 = (ModelSpec(name=f"hd{128 if h == 24 else 96}", n_layer=2, hidden=3072, n_head=h, n_kv_head=h,
                           ffn=8192, vocab=32000) for h in (32, 24))
    assert m96.head_dim == 96 and m128.head_dim == 128
    t96, t128 = (compute_times(m, s)["attention"] for m in (m96, m128))
    assert t96 / t128 == pytest.approx(slower)
    text = "\n".join(explain(estimate(m96, s)))
    assert ("x 0.75 (head dim 96 runs in the kernel's 128-wide tiles, the rest zeros)" in text) == (slower > 1)
    # an odd head dim pads in FlashAttention-2 too (100 -> 128)
    m100 = ModelSpec(name="hd100", n_layer=2, hidden=3200, n_head=32, n_kv_head=32, ffn=8192, vocab=32000)
    m128b = ModelSpec(name="hd128", n_layer=2, hidden=3200, n_head=25, n_kv_head=25, ffn=8192, vocab=32000)
    fa2 = _setup("a100-80", attention="fa2")
    assert compute_times(m100, fa2)["attention"] / compute_times(m128b, fa2)["attention"] == pytest.approx(1.28)


@pytest.mark.parametrize("gpu, hidden, heads, kernel, said", [
    ("a100-80", 4608, 16, "triton", "FlashAttention's Triton kernel takes head dims up to 128: 288 would not run there"),
    ("h100-sxm", 4608, 16, "fa3", "FlashAttention-3 takes head dims up to 256: 288 would not run there"),
    ("h100-sxm", 3200, 32, "cudnn", "cuDNN's fused attention needs a head dim divisible by 8: 100 would not run there"),
    ("h100-sxm", 3200, 32, "fa3", "FlashAttention-3 needs a head dim divisible by 8: 100 would not run there"),
    ("h100-sxm", 3200, 32, "fa2", None), ("a100-80", 4096, 32, "triton", None), ("h100-sxm", 4608, 16, "unfused", None),
])
def test_a_head_the_kernel_would_not_run_is_said_in_the_notes_json_and_explain(run, gpu, hidden, heads, kernel, said):
    args = ("--layers", "4", "--hidden", str(hidden), "--heads", str(heads), "--ffn", "8192", "--vocab", "32000",
            "--gpu", gpu, "--seq", "4096", "--micro-batch", "1", "--precision", "bf16", "--attention", kernel)
    d = json.loads(run(*args, "--json").stdout)
    notes = [n for c in d["candidates"] for n in c["notes"] if "would not run" in n]
    explained = " ".join(run(*args, "--explain").stdout.split())
    if said is None:
        assert not notes and "would not run" not in explained
    else:
        assert notes and all(n.startswith(said) and n.endswith("planned as if it ran") for n in notes)
        assert said in explained


def test_the_json_says_the_head_dim_the_kernels_tiles_ran_at(run):
    base = ("--layers", "4", "--ffn", "8192", "--vocab", "32000", "--seq", "4096", "--micro-batch", "1",
            "--precision", "bf16")
    for gpu, hidden, heads, kernel, tile in (("a100-80", 6144, 64, "triton", 128), ("a100-80", 6144, 64, "fa2", 96),
                                             ("a100-80", 3200, 32, "fa2", 128), ("h100-sxm", 3200, 32, "cudnn", 100)):
        d = json.loads(run(*base, "--gpu", gpu, "--hidden", str(hidden), "--heads", str(heads), "--attention", kernel,
                           "--json").stdout)
        assert {c["attention_tile_head_dim"] for c in d["candidates"]} == {tile}, (kernel, hidden // heads)


def test_fa3_runs_at_its_published_share_on_hopper_and_is_refused_elsewhere(run):
    """--attention fa3: FlashAttention-3's H100 figures (0.58 of the peak, above cuDNN's 0.53), Hopper only."""
    from plan_cli import refused

    fa3, cudnn = (compute_times(M8, _setup("h200", attention=k))["attention"] for k in ("fa3", "cudnn"))
    assert cudnn / fa3 == pytest.approx(ATTN_PEAK_SHARE["fa3"][9] / ATTN_PEAK_SHARE["cudnn"][9])
    assert attention_kernel(_setup(attention="fa3", stack="megatron")) == "fa3"
    text = "\n".join(explain(estimate(M8, _setup("h100-sxm", attention="fa3"))))
    assert "attention kernel: FlashAttention-3 (--attention)" in text
    wide = dataclasses.replace(_setup(attention="fa3"))
    from overdrive.plan.attention import head_dim_ratio
    assert 0 < head_dim_ratio(wide, 64) < 1   # shown on cuDNN's curve, no KeyError
    for gpu, sm in (("a100-80", "sm80"), ("b200", "sm100")):
        with pytest.raises(ValueError, match=f"--attention fa3: .* {sm}: use --attention cudnn or fa2"):
            estimate(M8, _setup(gpu, attention="fa3"))
        refused(run("--model", "llama3-8b", "--gpu", gpu, "--precision", "bf16", "--micro-batch", "1",
                    "--attention", "fa3"), f"{sm}: use --attention cudnn or fa2")
    r = run("--model", "llama3-8b", "--gpu", "h200", "--gpus", "8", "--precision", "bf16", "--micro-batch", "1",
            "--seq", "32768", "--attention", "fa3", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["top"]["attention_kernel"] == "fa3"


def test_triton_kernel_runs_at_the_fa2_papers_ratio_on_ampere_and_hopper_and_is_refused_on_blackwell(run):
    """--attention triton: FlashAttention's 2022 Triton kernel (MPT's attn_impl triton), FlashAttention-2's share ×
    the FlashAttention-2 paper's forward 1.3-1.5x / backward 2x, weighted 1 : 2.5 by FLOPs."""
    from plan_cli import refused
    from overdrive.plan.attention import TRITON_VS_FA2, head_dim_ratio

    assert TRITON_VS_FA2 == pytest.approx(3.5 / (1.4 + 2 * 2.5))
    for gpu, gen in (("a100-80", 8), ("h100-sxm", 9)):
        fa2, tri = (compute_times(M8, _setup(gpu, attention=k))["attention"] for k in ("fa2", "triton"))
        assert tri / fa2 == pytest.approx(ATTN_PEAK_SHARE["fa2"][gen] / ATTN_PEAK_SHARE["triton"][gen])
        assert 1.7 < tri / fa2 < 1.95
    # FlashAttention-2's head-dim curve (the same sm80 MMA code), not cuDNN's
    assert head_dim_ratio(_setup(attention="triton"), 64) == head_dim_ratio(_setup(attention="fa2"), 64)
    text = "\n".join(explain(estimate(M8, _setup("a100-80", attention="triton"))))
    assert "attention kernel: FlashAttention's Triton kernel (--attention)" in text
    for gpu in ("b200", "gb200"):
        with pytest.raises(ValueError, match="--attention triton: .* sm100: use --attention flash"):
            estimate(M8, _setup(gpu, attention="triton"))
    refused(run("--model", "llama3-8b", "--gpu", "b200", "--precision", "bf16", "--micro-batch", "1",
                "--attention", "triton"), "sm100: use --attention flash")


def test_llm_foundry_rows_carry_the_triton_kernel_their_scripts_ran():
    """llm-foundry's benchmark tables ran MPT's attn_impl triton (its yamls and submit_benchmarks.py's default);
    each row says so, and a FlashAttention-2 reading of them plans their long-sequence rows fast."""
    from overdrive.plan.validation import load_runs, predict

    rows = [r for r in load_runs() if r["id"].startswith("llm-foundry")]
    assert len(rows) == 56 and all(r["attention"] == "triton" and "attn_impl triton" in r["note"] for r in rows)
    long = [r for r in rows if r["gpu"] == "h100-sxm" and r["seq"] >= 32768 and r["precision"] == "bf16"]
    for r in long:
        as_run, as_fa2 = predict(r)["error"], predict({**r, "attention": "fa2"})["error"]
        assert abs(as_run) < 0.12 and as_fa2 > as_run + 0.3, (r["id"], as_run, as_fa2)


def test_triton_explain_names_its_derived_share_and_its_head_dim_limit():
    """Its share is FlashAttention-2's times a ratio (no figure of its own), and flash_attn_triton.py asserts d <= 128."""
    wide = dataclasses.replace(M8, n_head=16, n_kv_head=8)   # head dim 256
    text = "\n".join(explain(estimate(wide, _setup("h100-sxm", attention="triton"))))
    assert "FlashAttention-2's share x the FlashAttention-2 paper's A100 ratio to the Triton kernel" in text
    assert "FlashAttention's Triton kernel takes head dims up to 128: 256 would not run there" in text
    assert "at most 128" not in "\n".join(explain(estimate(M8, _setup("h100-sxm", attention="triton"))))


def test_flash_attention_1_runs_at_half_fa2_on_ampere_and_hopper_and_is_refused_on_blackwell(run):
    """--attention fa1: flash-attn 1.x (`flash_attn_unpadded_func`, the Megatron forks of 2023), FlashAttention-2's
    share x the FlashAttention-2 paper's "around 2x"; head dims multiples of 8 up to 128 in 32/64/128-wide kernels."""
    from plan_cli import refused
    from overdrive.plan.attention import FA1_VS_FA2, head_dim_refusal

    assert FA1_VS_FA2 == 0.5
    for gpu, gen in (("a100-80", 8), ("h100-sxm", 9)):
        fa2, fa1 = (compute_times(M8, _setup(gpu, attention=k))["attention"] for k in ("fa2", "fa1"))
        assert fa1 / fa2 == pytest.approx(ATTN_PEAK_SHARE["fa2"][gen] / ATTN_PEAK_SHARE["fa1"][gen])
        assert 1.9 < fa1 / fa2 < 2.1
    assert "up to 128" in head_dim_refusal("fa1", 160) and "fa2 takes up to 256" in head_dim_refusal("fa1", 160)
    assert "divisible by 8" in head_dim_refusal("fa1", 100) and not head_dim_refusal("fa1", 96)
    text = "\n".join(explain(estimate(M8, _setup("a100-80", attention="fa1"))))
    assert "attention kernel: FlashAttention (1.x) (--attention)" in text and "ratio to FlashAttention, 0.50" in text
    with pytest.raises(ValueError, match="--attention fa1: .* sm100: use --attention flash"):
        estimate(M8, _setup("b200", attention="fa1"))
    # ATTN_PEAK_SHARE keeps the ratio on Hopper too (0.165, not 0.17)
    assert ATTN_PEAK_SHARE["fa1"][9] / ATTN_PEAK_SHARE["fa2"][9] == pytest.approx(0.5)
    # flash-attn 1.x's README: "Head dim > 64 backward requires A100 or H100": said on Ada (sm89), not on A100
    ada = estimate(M8, _setup("l40s", attention="fa1", sharding="none", gpus_per_node=1))
    assert any("over 64 on A100 and H100 alone: 128 would not train on sm89" in n for n in ada.notes)
    assert not any("would not train" in n for n in estimate(M8, _setup("a100-80", attention="fa1")).notes)
    small = dataclasses.replace(M8, n_head=64, n_kv_head=8)   # head dim 64: its backward runs anywhere
    assert not any("would not train" in n for n in
                   estimate(small, _setup("l40s", attention="fa1", sharding="none", gpus_per_node=1)).notes)
    # context parallelism's ring attention calls SDPA's or Transformer Engine's kernels, never flash-attn 1.x's
    for kernel in ("fa1", "triton"):
        with pytest.raises(ValueError, match=f"--attention {kernel} with --cp 2: .* use --attention fa2 or cudnn"):
            estimate(M8, _setup("h100-sxm", attention=kernel, cp=2))
    refused(run("--model", "llama3-8b", "--gpu", "b200", "--precision", "bf16", "--micro-batch", "1",
                "--attention", "fa1"), "sm100: use --attention flash")


def test_megatron_llama_rows_carry_the_flash_attention_1_their_code_imports():
    from overdrive.plan.validation import load_runs, predict

    rows = [r for r in load_runs() if r["id"].startswith("Megatron-LLaMA")]
    assert len(rows) == 5 and all(r["attention"] == "fa1" and "flash_attn_unpadded_func" in r["note"] for r in rows)
    # FlashAttention 1 is slower: each row planned slower than as FlashAttention-2
    assert all(predict(r)["predicted"] < predict({**r, "attention": "fa2"})["predicted"] for r in rows)
