"""`overdrive plan` under hostile or careless input: every refusal is one line with exit code 2 (never a
traceback, never a hang), every accepted combination gives finite, non-negative numbers."""

import json
import math
import re

import pytest

from plan_cli import refused as _refused, run  # noqa: F401 (run is a fixture)

LLAMA = {"num_hidden_layers": 16, "hidden_size": 2048, "num_attention_heads": 32, "num_key_value_heads": 8,
         "intermediate_size": 8192, "vocab_size": 128256}




def _numbers(x):
    if isinstance(x, dict):
        for v in x.values():
            yield from _numbers(v)
    elif isinstance(x, list):
        for v in x:
            yield from _numbers(v)
    elif isinstance(x, (int, float)) and not isinstance(x, bool):
        yield x


@pytest.mark.parametrize("cfg, needle", [
    ({**LLAMA, "num_hidden_layers": "abc"}, "num_hidden_layers must be a positive integer, got 'abc'"),
    ({**LLAMA, "num_hidden_layers": 1e300}, "num_hidden_layers .* too large"),
    ({**LLAMA, "num_hidden_layers": [16]}, "num_hidden_layers must be a positive integer"),
    ({**LLAMA, "num_hidden_layers": 16.5}, "num_hidden_layers must be a positive integer, got 16.5"),
    ({**LLAMA, "num_hidden_layers": True}, "num_hidden_layers must be a positive integer, got True"),
    ({**LLAMA, "num_hidden_layers": -4}, "num_hidden_layers must be a positive integer, got -4"),
    ({**LLAMA, "vocab_size": None}, "vocab_size must be a positive integer, got None"),
    ({**LLAMA, "vocab_size": -5}, "vocab_size must be a positive integer, got -5"),
    ({**LLAMA, "intermediate_size": 0}, "intermediate_size must be a positive integer, got 0"),
    ({**LLAMA, "num_key_value_heads": 0}, "num_key_value_heads must be a positive integer, got 0"),
    ({**LLAMA, "num_key_value_heads": 7}, "heads 32 .* kv heads 7"),
    ({**LLAMA, "num_attention_heads": 30}, "hidden 2048 .* heads 30"),
    ({**LLAMA, "tie_word_embeddings": "false"}, "tie_word_embeddings must be true or false"),
    ({**LLAMA, "head_dim": -128}, "head_dim must be a positive integer, got -128"),
    ({**LLAMA, "num_local_experts": 8, "num_experts_per_tok": 2}, "mixture-of-experts .*num_local_experts 8"),
])
def test_hostile_hf_config_refused_naming_the_key(run, tmp_path, cfg, needle):
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    cp = run("--model", str(p), "--seq", "2048")
    _refused(cp, needle)
    assert str(p) in cp.stderr


def test_hf_config_with_consistent_head_dim_and_dense_moe_keys_plans(run, tmp_path):
    p = tmp_path / "config.json"
    p.write_text(json.dumps({**LLAMA, "head_dim": 64, "num_experts": None, "num_local_experts": 0,
                             "num_key_value_heads": None, "tie_word_embeddings": None}))
    cp = run("--model", str(p), "--seq", "2048", "--json")
    assert cp.returncode == 0, cp.stderr
    m = json.loads(cp.stdout)["model"]
    assert m["n_kv_head"] == 32 and m["tied"] is False   # null means the default, as transformers reads it


@pytest.mark.parametrize("text, needle", [
    ('{"num_hidden_layers": Infinity, "hidden_size": 2048, "num_attention_heads": 32}', "num_hidden_layers"),
    ('{"num_hidden_layers": NaN, "hidden_size": 2048, "num_attention_heads": 32}', "num_hidden_layers"),
    ("[" * 100000, "nested too deeply|not valid JSON"),
])
def test_hf_config_non_standard_json_refused(run, tmp_path, text, needle):
    p = tmp_path / "config.json"
    p.write_text(text)
    _refused(run("--model", str(p)), needle)


def test_hf_config_from_a_device_or_huge_file_refused_without_reading_it(run, tmp_path):
    _refused(run("--model", "/dev/zero"), "not a regular file")
    big = tmp_path / "big.json"
    with open(big, "wb") as f:
        f.truncate(64 << 20)  # sparse: no disk used
    _refused(run("--model", str(big)), "too large")


@pytest.mark.parametrize("res, needle", [
    ([1], "not a bench results.json"),
    ({"configs": 5}, "not a bench results.json"),
    ({"configs": [5]}, "not a bench results.json"),
    ({"configs": [{"precision": "bf16", "safe": True, "models": [1, 2]}]}, "not a bench results.json"),
    ({"configs": [{"precision": "bf16", "safe": True, "models": {"a": 5}}]}, "not a bench results.json"),
    ({"configs": [{"precision": "bf16", "safe": True, "models": {"a": {"mfu_bf16_peak": "0.5"}}}]}, "no bf16"),
    ({"configs": [{"precision": "bf16", "safe": True, "models": {"a": {"mfu_bf16_peak": True}}}]}, "no bf16"),
    ({"configs": [{"precision": "bf16", "safe": True, "models": {"a": {"mfu_bf16_peak": 1.7}}}]}, "no bf16"),
    ({"configs": [{"precision": "bf16", "safe": True, "models": {"a": {"mfu_bf16_peak": 1e-9}}}]}, "no bf16"),
])
def test_foreign_calibration_file_refused(run, tmp_path, res, needle):
    p = tmp_path / "results.json"
    p.write_text(json.dumps(res))
    _refused(run("--calibrate", str(p)), needle)


def test_calibration_nan_and_binary_refused(run, tmp_path):
    p = tmp_path / "results.json"
    p.write_text('{"configs": [{"precision": "bf16", "safe": true, "models": {"a": {"mfu_bf16_peak": NaN}}}]}')
    _refused(run("--calibrate", str(p)), "no bf16")
    p.write_bytes(bytes(range(128, 256)) * 4)
    _refused(run("--calibrate", str(p)), "--calibrate .*not a text JSON")


@pytest.mark.parametrize("args, needle", [
    (["--gpus", "0"], "^overdrive: error: --gpus must be a positive integer, got 0$"),
    (["--tp", "3"], "does not divide the 8 GPUs .*: pick degrees whose product divides it"),
    (["--global-batch", "12"], "use a multiple of 8"),
    (["--cp", "2", "--seq", "4097"], "--seq 4097 is not divisible by 2 x --cp 2"),
    (["--cp", "2", "--seq", "4098"], "--seq 4098 is not divisible by 2 x --cp 2: .* multiple of 4"),
    (["--cp", "8", "--seq", "8"], "multiple of 16"),
    (["--tp", "3", "--gpus", "3"], "--tp 3 does not divide the 32 attention heads"),
    (["--tp", "5", "--gpus", "5"], "--tp 5 does not divide"),
    (["--model", "llama3-1b", "--pp", "32", "--nodes", "4"], "32 pipeline chunks .* 16 blocks"),
    (["--model", "llama3-1b", "--pp", "8", "--vpp", "4"], "32 pipeline chunks .* 16 blocks"),
    (["--model", "llama3-1b", "--recompute-layers", "100"], "--recompute-layers 100 .* 16 blocks"),
    (["--model", "llama3-1b", "--pp", "4", "--recompute-layers", "5"], "--recompute-layers 5 .* 4 blocks"),
    (["--lora-rank", "100000000"], "--lora-rank 100000000 .* hidden size 4096"),
    (["--intra-gbs", "nan"], "--intra-gbs must be a positive"),
    (["--inter-gbs", "inf"], "--inter-gbs must be a positive"),
    (["--inter-gbs", "1e-300", "--nodes", "2"], "--inter-gbs 1e-300 GB/s is outside"),
    (["--intra-gbs", "1e308"], "--intra-gbs 1e\\+308 GB/s is outside"),
    (["--efficiency", "5e-324"], "--efficiency is a fraction of peak in \\[0.01, 1\\]"),
    (["--seq", str(10**40)], "--seq .* too large"),
    (["--micro-batch", str(10**40)], "--micro-batch .* too large"),
    (["--layers", str(10**30), "--hidden", "64", "--heads", "4"], "--layers must be a positive integer up to"),
    (["--zero", "1", "--offload", "params"], "--offload params needs"),
    (["--sharding", "none", "--offload", "params"], "--offload params needs"),
    (["--zero", "1", "--sharding", "fsdp"], "--zero 1 and --sharding fsdp"),
    (["--recompute-modules", "mlp", "--checkpointing", "full"], "--recompute-modules .* --checkpointing full"),
    (["--precision", "mxfp8,nvfp4", "--gpu", "h100-sxm"], "none of --precision mxfp8,nvfp4 runs on h100-sxm"),
    (["--sharding", "hsdp"], "--sharding hsdp needs --nodes > 1"),
    (["--markdown"], "--markdown goes with --sweep"),
    (["--sweep", "--out", "x"], "--out .* not with --sweep|ignores --out"),
    (["--sweep", "--gpu", "h100", "--tp", "2"], "--sweep runs its own grid .* ignores --gpu --tp"),
    (["--global-batch", "64", "--global-batch-tokens", "262144"], "both set the global batch"),
    (["--model", "llama3-70b", "--layers", "4", "--hidden", "64", "--heads", "4"], "--model llama3-70b and --layers"),
    (["--hidden", "64", "--kv-heads", "2"], "--hidden --kv-heads describe a custom model: add --layers"),
    (["--precision", "bf16", "--fp8-activations"], "--fp8-activations needs a low precision"),
    (["--precision", "fp8", "--gpu", "a100-80", "--fp8-all-gather"], "--fp8-all-gather needs a low precision"),
    (["--layers", "2", "--hidden", "64", "--heads", "4", "--kv-heads", "3"], "--heads 4 must divide by --kv-heads 3"),
])
def test_impossible_layouts_refused(run, args, needle):
    _refused(run(*args), needle)


def test_calibrate_and_efficiency_conflict(run, tmp_path):
    p = tmp_path / "results.json"
    p.write_text(json.dumps({"configs": [{"precision": "bf16", "safe": True,
                                          "models": {"a": {"mfu_bf16_peak": 0.45}}}]}))
    assert run("--calibrate", str(p), "--seq", "2048", "--json").returncode == 0
    _refused(run("--calibrate", str(p), "--efficiency", "0.3"), "--calibrate .* --efficiency")


@pytest.mark.parametrize("args", [
    ["--offload", "params"],                      # searches only the shardings that can offload parameters
    ["--model", "llama3-70b", "--offload", "params", "--seq", "65536"],  # nothing fits: suggestions still plan
    ["--recompute-modules", "core_attn,mlp,layernorm"],
    ["--model", "llama3-1b", "--recompute-layers", "16", "--offload-activations", "15"],
    ["--model", "llama3-405b", "--gpus", "8", "--nodes", "32", "--tp", "8", "--pp", "8", "--vpp", "2",
     "--embedding-in-pipeline-split", "--recompute-layers", "8", "--global-batch", "64", "--micro-batch", "1"],
    ["--zero", "3", "--offload", "params", "--lora-rank", "16"],
    ["--sharding", "zero3", "--offload", "optimizer", "--checkpointing", "full", "--offload-activations", "32"],
    ["--tp", "16", "--gpus", "16"],               # 8 KV heads replicated over 16 ranks
    ["--cp", "8", "--seq", "16"],
    ["--layers", str(2**20), "--hidden", "64", "--heads", "4"],
])
def test_accepted_combinations_give_sane_numbers(run, args):
    cp = run(*args, "--json")
    assert cp.returncode == 0, cp.stderr
    r = json.loads(cp.stdout)
    for c in r["candidates"]:
        vals = list(_numbers({k: v for k, v in c.items() if k != "headroom_gib"}))
        assert all(math.isfinite(v) and v >= 0 for v in vals), c
    if "--offload" in args:
        assert {c["sharding"] for c in r["candidates"]} <= {"fsdp", "hsdp", "zero3"}   # the weight-sharding ones


@pytest.mark.parametrize("args", [
    ["--precision", "mxfp8", "--gpu", "h100-sxm"],
    ["--model", "llama3-70b", "--gpus", "8", "--nodes", "8", "--pp", "4", "--vpp", "5", "--global-batch", "64",
     "--zero", "1", "--recompute-modules", "mlp,layernorm", "--grad-dtype", "bf16", "--loss", "inplace"],
    ["--model", "llama3-70b", "--seq", "65536", "--micro-batch", "1"],   # nothing fits: explains candidate 0
    ["--zero", "3", "--offload", "params", "--lora-rank", "16", "--precision", "nvfp4", "--gpu", "a100-80"],
    ["--model", "llama3-405b", "--gpus", "8", "--nodes", "32", "--tp", "8", "--pp", "8", "--vpp", "2",
     "--embedding-in-pipeline-split", "--recompute-layers", "8", "--global-batch", "64", "--offload", "optimizer"],
    ["--model", "llama3-1b", "--offload-activations", "8", "--global-batch-tokens", "262144", "--fp8-activations"],
])
def test_explain_agrees_with_the_table(run, args):
    r = json.loads(run(*args, "--json").stdout)
    top = r["top"] or r["candidates"][0]
    cp = run(*args, "--explain")
    assert cp.returncode == 0, cp.stderr
    total = re.search(r"total\s+([\d.]+) GiB", cp.stdout)
    assert total and abs(float(total.group(1)) - top["memory_gib"]) < 0.01, (total, top["memory_gib"])
    step = re.search(r"step\s+([\d.]+) ms -> ([\d,]+) tokens/s", cp.stdout)
    assert abs(float(step.group(1)) - 1e3 * top["step_s"]) < 0.1
    # the explained candidate carries the table's label, fallback included ("mxfp8→fp8"), and its notes
    head = re.search(r"^(\S+) · (pytorch|megatron) · \w+ tp\d+ pp\d+(?: vpp\d+)? cp\d+ · AC (\S+) · mb (\d+)",
                     cp.stdout, re.M)
    assert head and head.group(1, 3, 4) == (top["label"], top["checkpointing"], str(top["micro_batch"])), head
    for n in top["notes"]:
        assert f"note: {n}" in cp.stdout


def test_why_names_the_fallback_it_planned(run):
    r = json.loads(run("--precision", "mxfp8", "--gpu", "h100-sxm", "--seq", "2048", "--json").stdout)
    assert r["top"]["label"] == "mxfp8→fp8" and r["why"].startswith("mxfp8→fp8 · fsdp")


def test_out_folder_that_cannot_be_made_refused_before_work(run, tmp_path):
    f = tmp_path / "file"
    f.write_text("kept")
    _refused(run("--out", str(f / "sub"), "--seq", "2048"), "--out .*is not writable|--out .*is a file")
    assert f.read_text() == "kept"
    if __import__("os").path.isdir("/proc/self"):
        cp = run("--out", "/proc/overdrive_nope/x", "--seq", "2048")
        _refused(cp, "--out /proc/overdrive_nope/x")
        assert cp.stdout == ""


def test_explain_with_json_stays_one_json_document(run):
    cp = run("--seq", "2048", "--explain", "--json")
    assert cp.returncode == 0, cp.stderr
    r = json.loads(cp.stdout)
    assert any(line.startswith("  total") for line in r["explain"])


def test_custom_dims_still_plan_and_default_model_unchanged(run):
    r = json.loads(run("--layers", "4", "--hidden", "256", "--heads", "4", "--seq", "1024", "--json").stdout)
    assert r["model"]["name"] == "custom" and r["model"]["vocab"] == 128256
    assert json.loads(run("--seq", "1024", "--json").stdout)["model"]["name"] == "llama3-8b"


def test_suggestions_never_propose_the_tp_that_did_not_fit(run):
    r = json.loads(run("--model", "llama3-70b", "--gpu", "rtx4090", "--gpus", "1", "--json").stdout)
    assert r["top"] is None and r["suggestions"]
    assert not any("tensor parallel 1 " in x for x in r["suggestions"]), r["suggestions"]
    r = json.loads(run("--model", "llama3-405b", "--gpu", "l4", "--tp", "8", "--seq", "2048", "--json").stdout)
    assert not any("tensor parallel 8 " in x for x in r["suggestions"]), r["suggestions"]


def test_repeated_recompute_module_counts_once():
    from overdrive.env import gpu_by_key
    from overdrive.plan import TrainSetup
    from overdrive.plan.search import label

    s = TrainSetup(gpu=gpu_by_key("h100-sxm"), recompute_modules="mlp,mlp,core_attn")
    assert s.recompute_modules == ("mlp", "core_attn") and "recompute mlp,core_attn" in label(s)


@pytest.mark.parametrize("name", ["plan.txt", "plan.jpg", "plan"])
def test_png_needs_a_png_name(run, tmp_path, name):
    cp = run("--png", str(tmp_path / name), "--seq", "2048")
    _refused(cp, "ending in .png")
    assert cp.stdout == "" and not list(tmp_path.iterdir())


@pytest.mark.parametrize("args, needle", [
    (["--seq", "1.5"], "plan: argument --seq: invalid int value: '1.5' \\(see overdrive plan --help\\)"),
    (["--tp", "two"], "argument --tp: invalid int value"),
    (["--zero", "4"], "argument --zero: invalid choice"),
    (["--grad-dtype", "fp16"], "argument --grad-dtype: invalid choice"),
    (["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
])
def test_argparse_refusals_are_one_line_too(run, args, needle):
    _refused(run(*args), needle)


@pytest.mark.parametrize("cfg, kv, gated", [
    # falcon-7b: multi-query attention, a 4h GELU MLP
    ({"model_type": "falcon", "hidden_size": 4544, "n_head": 71, "n_layer": 32, "multi_query": True,
      "vocab_size": 65024}, 1, False),
    # falcon-40b: its own name for the KV heads
    ({"model_type": "falcon", "hidden_size": 8192, "num_attention_heads": 128, "num_hidden_layers": 60,
      "num_kv_heads": 8, "new_decoder_architecture": True, "vocab_size": 65024}, 8, False),
    ({"model_type": "gpt_bigcode", "n_embd": 6144, "n_head": 48, "n_layer": 40, "multi_query": True,
      "n_inner": 24576, "vocab_size": 49152}, 1, False),
    ({**LLAMA, "model_type": "mistral"}, 8, True),
])
def test_hf_attention_and_mlp_shapes_read_as_the_model_has_them(run, tmp_path, cfg, kv, gated):
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    cp = run("--model", str(p), "--seq", "2048", "--gpus", "8", "--nodes", "8", "--json")
    assert cp.returncode == 0, cp.stderr
    m = json.loads(cp.stdout)["model"]
    assert (m["n_kv_head"], m["gated_mlp"]) == (kv, gated)


@pytest.mark.parametrize("model, pp, ac", [("llama3-1b", 16, "selective"), ("llama3-1b", 16, "full"),
                                           ("llama3-1b", 16, "selective-op"), ("tiny", 2, "selective"),
                                           ("llama3-8b", 16, "selective")])
def test_checkpointing_never_keeps_more_than_none(model, pp, ac):
    from overdrive.env import gpu_by_key
    from overdrive.plan import TrainSetup, estimate, get_model

    m = get_model(model)
    s = TrainSetup(gpu=gpu_by_key("h100-sxm"), nodes=2, pp=pp, seq=16384, micro_batch=1, global_batch=64)
    none = estimate(m, s).breakdown_gib["activations"]
    assert estimate(m, TrainSetup(**{**s.__dict__, "checkpointing": ac})).breakdown_gib["activations"] <= none


def test_selective_with_one_block_per_stage_recomputes_nothing():
    from overdrive.env import gpu_by_key
    from overdrive.plan import TrainSetup, estimate, get_model

    s = TrainSetup(gpu=gpu_by_key("h100-sxm"), nodes=2, pp=16, checkpointing="selective", global_batch=64)
    assert estimate(get_model("llama3-1b"), s).times["recompute"] == 0


@pytest.mark.parametrize("cfg,params", [
    # Qwen3-0.6B: 16 heads of 128 on a 1024 hidden; 0.44B without the (tied) embedding, 0.6B in all.
    ({"model_type": "qwen3", "hidden_size": 1024, "num_attention_heads": 16, "num_key_value_heads": 8,
      "head_dim": 128, "intermediate_size": 3072, "num_hidden_layers": 28, "vocab_size": 151936,
      "tie_word_embeddings": True}, 0.596e9),
    # Gemma-7B: 16 heads of 256 on a 3072 hidden; 8.54B parameters.
    ({"model_type": "gemma", "hidden_size": 3072, "num_attention_heads": 16, "num_key_value_heads": 16,
      "head_dim": 256, "intermediate_size": 24576, "num_hidden_layers": 28, "vocab_size": 256000,
      "tie_word_embeddings": True}, 8.54e9),
])
def test_hf_config_whose_heads_are_not_hidden_wide_plans_with_its_own_width(tmp_path, cfg, params):
    from overdrive.plan.memory import act_tensors, lora_params
    from overdrive.plan.setup import TrainSetup
    from overdrive.plan.specs import model_from_hf_config

    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    m = model_from_hf_config(str(p))
    assert m.q_dim == cfg["num_attention_heads"] * cfg["head_dim"] != m.hidden
    assert abs(m.n_params() - params) / params < 0.01
    from overdrive.env import gpu_by_key

    t = act_tensors(m, TrainSetup(gpu=gpu_by_key("h100-sxm")))
    assert t["attn_out"] == m.q_dim * 2 and t["qkv"] == (m.q_dim + 2 * m.kv_dim) * 2
    h, q, kv, F = m.hidden, m.q_dim, m.kv_dim, m.ffn
    assert lora_params(m, 8) == m.n_layer * 8 * ((h + q) * 2 + (h + kv) * 2 + (h + F) * 3)
