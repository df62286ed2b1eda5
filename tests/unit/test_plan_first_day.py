"""A new user's first day with `overdrive plan` on their own models (issue 40, point 7): readable figures for a
tiny model, a safety margin in the ranking, an honest refusal of encoder-decoders, the folder `tune --hf` takes,
and a next step that is the accelerate(...) call Overdrive runs."""

import json

import pytest

from plan_cli import invoke
from overdrive.plan import get_model, model_from_hf_config, plan
from overdrive.plan.runnable import how_to_run, not_in_overdrive
from overdrive.recipes import get_recipe
from overdrive.report.plan_view import fmt_params, fmt_step

TINY = {"model_type": "llama", "num_hidden_layers": 4, "hidden_size": 256, "num_attention_heads": 4,
        "num_key_value_heads": 2, "intermediate_size": 512, "vocab_size": 1000}
T5 = {"model_type": "t5", "d_model": 512, "num_layers": 6, "num_heads": 8, "d_ff": 2048, "vocab_size": 32128,
      "is_encoder_decoder": True}


@pytest.fixture
def cli(capsys):
    return lambda *a: invoke(capsys, *a)


@pytest.fixture
def tiny_dir(tmp_path):
    d = tmp_path / "tiny"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(TINY))
    return d


def test_formats_keep_small_models_and_short_steps_readable():
    assert fmt_params(0.0029) == "2.9M" and fmt_params(13.02) == "13.02B" and fmt_params(1.2e-5) == "12.0K"
    assert fmt_step(0.00143) == "1.43 ms" and fmt_step(0.594) == "594 ms" and fmt_step(1.27) == "1.27 s"
    assert fmt_step(2e-5) == "20 µs"


def test_one_gpu_tiny_hf_model_shows_its_size_and_step(cli, tiny_dir):
    cp = cli("--model", str(tiny_dir / "config.json"), "--gpus", "1", "--seq", "1024")
    assert cp.returncode == 0, cp.stderr
    assert "0.00B" not in cp.stdout and "M params" in cp.stdout
    assert " 0.000 " not in cp.stdout and " ms " in cp.stdout
    r = plan(model_from_hf_config(str(tiny_dir)), "h100-sxm", gpus_per_node=1, seq=1024)
    # one data-parallel rank: the shardings are the same run, so one of them is ranked, not three copies
    assert {c["sharding"] for c in r["candidates"]} == {"none"}


def test_a_folder_with_config_json_plans_like_the_file(cli, tiny_dir):
    a = model_from_hf_config(str(tiny_dir))
    b = model_from_hf_config(str(tiny_dir / "config.json"))
    assert a == b
    cp = cli("--model", str(tiny_dir), "--gpus", "1", "--json")
    assert cp.returncode == 0, cp.stderr
    assert json.loads(cp.stdout)["model"]["n_layer"] == 4


def test_a_folder_without_config_json_is_one_line_with_the_fix(cli, tmp_path):
    cp = cli("--model", str(tmp_path))
    assert cp.returncode == 2 and cp.stdout == ""
    assert "without a config.json" in cp.stderr and cp.stderr.count("\n") == 1


@pytest.mark.parametrize("cfg,word", [(T5, "encoder-decoder"), ({**T5, "is_encoder_decoder": None}, "encoder-decoder"),
                                      ({"model_type": "bart", "d_model": 768, "encoder_layers": 6,
                                        "decoder_layers": 6, "vocab_size": 50265}, "encoder-decoder"),
                                      ({"model_type": "vit", "num_hidden_layers": 12, "hidden_size": 768,
                                        "num_attention_heads": 12, "intermediate_size": 3072}, "encoder-only")])
def test_encoder_decoder_and_encoder_models_are_refused_by_what_they_are(cli, tmp_path, cfg, word):
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=f"{word} model, which is not supported") as e:
        model_from_hf_config(str(p))
    assert "needs num_hidden_layers" not in str(e.value)
    cp = cli("--model", str(p))
    assert cp.returncode == 2 and "not supported" in cp.stderr and cp.stderr.count("\n") == 1


def test_ranking_keeps_a_safety_margin_the_user_sees_and_sets():
    m = get_model("llama2-13b")
    r = plan(m, "h100-sxm", gpus_per_node=8, seq=4096)
    top = r["top"]
    assert r["min_headroom_gib"] == pytest.approx(8.0, abs=0.1)
    assert top["headroom_gib"] >= r["min_headroom_gib"] and top["margin_ok"]
    # the 5%-faster micro-batch with ~2 GiB free is ranked, marked tight, and named in the reason
    tight = [c for c in r["candidates"] if c["fits"] and not c["margin_ok"]]
    assert tight and max(c["tokens_per_s_per_gpu"] for c in tight) > top["tokens_per_s_per_gpu"]
    assert "faster but leaves only" in r["why"]
    fits = [c for c in r["candidates"] if c["fits"]]
    first_tight = next(i for i, c in enumerate(fits) if not c["margin_ok"])
    assert all(not c["margin_ok"] for c in fits[first_tight:])   # every safe one before every tight one
    fast = plan(m, "h100-sxm", gpus_per_node=8, seq=4096, min_headroom_gib=0)
    assert fast["top"]["tokens_per_s_per_gpu"] > top["tokens_per_s_per_gpu"]
    assert fast["top"]["headroom_gib"] < 8


def test_min_headroom_flag_is_checked_and_shown(cli):
    cp = cli("--model", "llama2-13b", "--min-headroom", "100")
    assert cp.returncode == 2 and "--min-headroom 100" in cp.stderr
    cp = cli("--model", "llama2-13b", "--min-headroom", "20", "--json")
    assert cp.returncode == 0, cp.stderr
    r = json.loads(cp.stdout)
    assert r["min_headroom_gib"] == 20 and r["top"]["headroom_gib"] >= 20


def test_next_step_is_the_accelerate_call_with_a_recipe_name_it_accepts(cli):
    cp = cli("--model", "llama2-13b")
    assert cp.returncode == 0, cp.stderr
    out = " ".join(cp.stdout.split())
    assert "overdrive train CONFIG" not in out
    assert 'overdrive.accelerate(model, recipe="' in out and 'distributed="fsdp"' in out
    assert "torchrun --nproc_per_node=8 train.py" in out
    name = out.split('recipe="')[1].split('"')[0]
    assert get_recipe(name).name == name


@pytest.mark.parametrize("prec", ["fp32", "bf16", "fp16", "fp8", "fp8-rowwise", "mxfp8", "nvfp4"])
@pytest.mark.parametrize("ac", ["none", "selective", "selective-op", "full"])
@pytest.mark.parametrize("loss", ["standard", "fused"])
def test_every_planned_precision_and_checkpointing_maps_to_a_recipe_accelerate_accepts(prec, ac, loss):
    c = {"precision": prec, "checkpointing": ac, "loss": loss, "sharding": "fsdp", "compile": True,
         "micro_batch": 2, "seq": 4096}
    h = how_to_run(c, gpus_per_node=8)
    r = get_recipe(h["recipe"])
    assert r.name == h["recipe"]
    want = {"fp32": "fp32", "bf16": "bf16", "fp16": "fp16", "nvfp4": "fp4"}.get(prec, "fp8")
    assert r.precision == want and r.compile == "default"
    assert r.activation_checkpointing == {"selective-op": "selective"}.get(ac, ac)
    assert (r.loss == "fused-linear-cross-entropy") == (loss == "fused")
    assert bool(h["not_in_overdrive"]) == (ac == "selective-op")


@pytest.mark.parametrize("field,value,word", [
    ("optimizer_dtype", "8bit", "8-bit AdamW"), ("master_weights", "none", "pure bf16"),
    ("sharding", "zero1", "distributed optimizer"), ("tp", 2, "tensor parallelism"), ("lora_rank", 16, "LoRA"),
    ("offload", "optimizer", "CPUOffloadPolicy"), ("stack", "megatron", "another stack"),
    ("optimizer", "lion", "lion"), ("deepspeed_pipeline", True, "PipelineEngine")])
def test_what_overdrive_does_not_run_is_named_as_another_stacks_feature(field, value, word):
    gaps = not_in_overdrive({"precision": "bf16", "sharding": "fsdp", field: value})
    assert len(gaps) == 1 and word in gaps[0]


def test_suggestions_when_nothing_fits_name_what_overdrive_does_not_run():
    r = plan(get_model("llama3-70b"), "h100-sxm", gpus_per_node=8, seq=8192)
    assert r["top"] is None
    eight_bit = [s for s in r["suggestions"] if s.startswith("8-bit AdamW states")]
    assert eight_bit and all("not run by Overdrive: 8-bit AdamW" in s for s in eight_bit)


def test_a_candidate_records_every_setting_that_shaped_its_figures():
    """plan.json says what was planned: the older-stack and kernel settings beside the search axes."""
    r = plan(get_model("llama3-8b"), "h100-sxm", gpus_per_node=8, nodes=2, seq=4096, global_batch=64, precisions=["bf16"],
             tp=2, pp=2, sequence_parallel=False, deepspeed_pipeline=True, partition_activations=False,
             attention="unfused")
    c = r["candidates"][0]
    assert (c["sequence_parallel"], c["deepspeed_pipeline"], c["partition_activations"], c["attention"]) == \
        (False, True, False, "unfused")
