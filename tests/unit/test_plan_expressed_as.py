"""Every run's "expressed as" line (validation.plan_flags, the doc's tables) plans what the table says: the flags,
parsed as `overdrive plan` parses them, give the run's prediction. A row field the CLI has no flag for (a model's
head width beside hidden/heads, say) would make the printed line plan another run."""

import argparse
import dataclasses
import json
import shlex

import pytest

from overdrive.commands import plan as cli
from overdrive.env.catalog import gpu_by_key
from overdrive.plan.estimate import estimate
from overdrive.plan.setup import TrainSetup
from overdrive.plan.validation import load_runs, plan_flags, predict

_PARSER = argparse.ArgumentParser()
cli.register(_PARSER.add_subparsers())


def _planned(flags: str):
    """The estimate `overdrive plan <flags>` makes for one fixed configuration (no search: every choice given)."""
    args = _PARSER.parse_args(["plan", *shlex.split(flags)])
    m = cli._model(args)
    if args.qk_norm:
        m = dataclasses.replace(m, qk_norm=True)
    one = {k: v[0] for k, v in cli._search_lists(args).items()}
    s = TrainSetup(gpu=gpu_by_key(args.gpu, mem_gib=args.gpu_mem), **cli._setup_kwargs(args),
                   precision=one["precisions"], sharding=one["shardings"], checkpointing=one["checkpointing"])
    return estimate(m, s)


_RUNS = [r for r in load_runs() if "micro_batch" in r and not r.get("memory_only")]


def test_every_fixed_run_is_checked():
    assert len(_RUNS) > 300


@pytest.mark.parametrize("chunk", range(4))
def test_the_printed_flags_plan_the_tables_prediction(chunk, capsys):
    """Through the CLI itself: `overdrive plan <printed flags> --json`, its top pick against the table."""
    from overdrive.cli import main

    wrong = []
    for r in _RUNS[chunk::4]:
        assert main(["plan", *shlex.split(plan_flags(r)), "--json"]) == 0, r["id"]
        out, p = json.loads(capsys.readouterr().out), predict(r)
        top = out["top"] or out["candidates"][0]   # a run planned not to fit: the candidate the table shows
        if top["tokens_per_s_per_gpu"] != pytest.approx(p["predicted"], rel=1e-9) or \
                top["allocated_gib"] != pytest.approx(p["allocated_gib"], abs=1e-3):
            wrong.append(f"{r['id']}: {top['tokens_per_s_per_gpu']:.1f} vs {p['predicted']:.1f}")
    assert not wrong, wrong


def test_head_dim_plans_a_model_whose_heads_are_not_hidden_over_heads():
    """Qwen3-32B: 64 heads of 128 on a 5120 model (q is 8192 wide), so its attention is wider than 5120/64 = 80."""
    base = ("--layers 64 --hidden 5120 --heads 64 --kv-heads 8 --ffn 25600 --vocab 151936 --gpu h100-sxm --gpus 8 "
            "--seq 4096 --global-batch 64 --micro-batch 1 --precision bf16 --sharding fsdp --checkpointing full")
    narrow, wide = _planned(base), _planned(base + " --head-dim 128")
    assert wide.model.attn_head_dim == 128 and narrow.model.attn_head_dim == 0
    assert wide.model.n_params() > narrow.model.n_params() * 1.02
    assert wide.step_s > narrow.step_s


@pytest.mark.parametrize("flags, needle", [
    ("--head-dim 0", "--head-dim must be a positive integer"),
    ("--head-dim 99999999", "--head-dim must be a positive integer up to 16,777,216, got 99999999"),
    ("--heads 7", "--hidden 512 must divide by --heads 7, or give --head-dim"),
    ("--kv-heads 3 --head-dim 64", "--heads 8 must divide by --kv-heads 3"),
    ("--model llama3-8b --head-dim 64", "keep one")])
def test_bad_model_dims_get_one_line_naming_the_flag(flags, needle, capsys):
    from overdrive.cli import main

    base = "--heads 8" if "--heads" not in flags and "--model" not in flags else ""
    args = ([] if "--model" in flags else ["--layers", "4", "--hidden", "512"]) + (base + " " + flags).split()
    assert main(["plan", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1, err


def test_heads_that_do_not_divide_hidden_plan_with_head_dim():
    e = _planned("--layers 4 --hidden 512 --heads 7 --head-dim 64 --gpu h100-sxm --gpus 1 --seq 1024 --global-batch 8 "
                 "--micro-batch 1 --precision bf16 --sharding none --checkpointing none")
    assert e.model.q_dim == 7 * 64 and e.tokens_per_s_per_gpu > 0
