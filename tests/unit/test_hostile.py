"""Hostile inputs: each case a user (or an attacker) tried, and the promised outcome.

One line and exit 2 where the input cannot be used, naming what is wrong and the fix; correct
output where it can. Everything runs in-process through `overdrive.cli.main` or the library
call behind it, with tiny inputs, so the suite stays fast.
"""

from __future__ import annotations

import io
import json
import os
import re
import tempfile
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from overdrive.bench import SUITES, Candidate, load_results, save_results
from overdrive.bench.apply import apply_hint
from overdrive.bench.workloads.recsys import RECSYS_SUITES, recsys_candidates
from overdrive.cli import main
from overdrive.data import MAX_AUTO_VOCAB, DataError, load_tokens
from overdrive.recipes import PRESETS, parse_recipe_name
from overdrive.recsys.data import CriteoSpec, read_criteo_tsv
from overdrive.report.advice import next_step
from overdrive.train.config import ConfigError, load_config

DATA = os.path.join(os.path.dirname(__file__), "data", "bench_cpu_quick.json")
TINY = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "tiny.toml")
FIELDS = [f for f in PRESETS["fp32"].to_dict() if f != "name"]


def _one_line_exit_2(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("overdrive: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    return err


def _results(tmp_path, name="run", **edit) -> str:
    d = json.load(open(DATA))
    for k, v in edit.items():
        d[k] = v
    folder = tmp_path / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "results.json").write_text(json.dumps(d))
    return str(folder)


# --- One 40-digit value in a Criteo TSV --------------------------------------------------------------

def _tsv_line(label="1", dense=None) -> str:
    dense = dense or ["3"] * 13
    return label + "\t" + "\t".join(dense) + "\t" + "\t".join(["68fd1e64"] * 26)


def test_criteo_count_beyond_float32_is_refused_with_file_and_lines(tmp_path, capsys):
    huge = "1" * 40  # 1.1e39 > float32's 3.4e38: it became inf and every configuration read UNSAFE
    lines = [_tsv_line()] * 20 + [_tsv_line(dense=["3"] * 12 + [huge])] + [_tsv_line()] * 3 + \
        [_tsv_line(dense=[huge] + ["3"] * 12)]
    p = tmp_path / "day_0.tsv"
    p.write_text("\n".join(lines) + "\n")
    err = _one_line_exit_2(capsys, ["bench", "--workload", "recsys", "--data", str(p)])
    assert str(p) in err and "lines 21, 25" in err and "float32" in err
    with pytest.raises(DataError, match=r"7 lines .* lines 1, 2, 3, 4, 5 and 2 more"):
        p.write_text("\n".join([_tsv_line(dense=[huge] * 13)] * 7) + "\n")
        read_criteo_tsv(str(p))


def test_criteo_largest_float32_count_is_still_read(tmp_path):
    p = tmp_path / "ok.tsv"
    big = str(int(np.finfo(np.float32).max) // 2)
    p.write_text(_tsv_line(dense=[big] + ["3"] * 12) + "\n")
    batch, st = read_criteo_tsv(str(p), CriteoSpec(table_sizes=(97,) * 26))
    assert st.good == 1 and torch.isfinite(batch.dense).all()


def test_token_file_with_an_id_beyond_any_vocabulary_names_its_positions(tmp_path):
    ids = np.arange(5000, dtype=np.uint32) % 300
    ids[[17, 4000]] = 4_000_000_000  # a corrupt id: the vocabulary would be 4e9 rows
    p = tmp_path / "tokens.bin"
    ids.tofile(p)
    with pytest.raises(DataError, match=r"2 token ids >= 4,194,304 .* positions 17, 4000: is it really uint32"):
        load_tokens(str(p), fmt="uint32")
    toks, vocab = load_tokens(str(p), fmt="uint32", vocab_size=4_000_000_001)  # meant: the user says so
    assert vocab == 4_000_000_001 and MAX_AUTO_VOCAB < vocab


# --- report A B of two different suites --------------------------------------------------------------

def test_report_refuses_to_compare_different_benchmarks_and_says_what_differs(tmp_path, capsys):
    d = json.load(open(DATA))
    a = _results(tmp_path, "a")
    b = _results(tmp_path, "b", suite=dict(d["suite"], name="cpu", seq=128))
    err = _one_line_exit_2(capsys, ["report", a, b])
    assert "suite cpu-quick vs cpu" in err and "sequence length 64 vs 128" in err and "--allow-different" in err
    assert main(["report", a, b, "--allow-different"]) == 0
    out = capsys.readouterr().out
    assert "not compared" in " ".join(out.split()) and "B faster" not in out and "B slower" not in out


def test_report_of_one_suite_on_two_machines_says_so_in_the_verdict(tmp_path, capsys):
    a = _results(tmp_path, "a")
    b = _results(tmp_path, "b", device="NVIDIA H100 80GB HBM3")
    assert main(["report", a, b]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "B's step time is 1.00x A's" in out and "compares the machines as well as the recipes" in out


# --- The winner's Apply line carries the whole recipe ------------------------------------------------

def _printed_recipe(code: str) -> str:
    """Run the printed code against a stand-in `overdrive` and return the recipe it passes."""
    seen = {}
    fake = SimpleNamespace(accelerate=lambda model, recipe: seen.setdefault("recipe", recipe))
    exec(code, {"overdrive": fake, "model": object()})  # noqa: S102 — our own output, the point of the test
    return seen["recipe"]


GPT_CANDIDATES = sorted({c.name: c for s in SUITES.values() for c in s.candidates}.values(), key=lambda c: c.name) + [
    Candidate.preset(n) for n in PRESETS if n != "auto"] + [
    Candidate.preset(n) for n in ("amp-bf16+compile+ckpt", "fp8+fp8_min_dim=512+fused-ce", "fp32+max-autotune")]


@pytest.mark.parametrize("cand", GPT_CANDIDATES, ids=lambda c: c.name)
def test_every_printed_gpt_recipe_parses_back_to_the_recipe_that_ran(cand):
    cfg = {"name": cand.name, "recipe": cand.recipe.to_dict(), "options": {}, "precision": cand.recipe.precision}
    hint = apply_hint(cfg, "gpt")
    printed = _printed_recipe(hint["code"])
    via_set = re.search(r"--set (train\.recipe=\S+?)\)$", hint["train"]).group(1)
    for name in (printed, load_config(None, [via_set]).train.recipe):
        back = parse_recipe_name(name)
        assert {f: getattr(back, f) for f in FIELDS} == {f: getattr(cand.recipe, f) for f in FIELDS}, name


@pytest.mark.parametrize("cand", recsys_candidates(), ids=lambda c: c.name)
def test_every_printed_click_model_recipe_builds_what_ran(cand, monkeypatch):
    # `bag+sparse-adam+bf16` used to print no bf16: the AMP dtype must be in the line.
    import overdrive.recsys as rs

    if cand.options["embedding"] == "torchrec":
        pytest.importorskip("torchrec")
    cfg = {"name": cand.name, "recipe": cand.recipe.to_dict(), "options": dict(cand.options),
           "precision": cand.recipe.precision}
    calls = []
    ns = {"DLRM": rs.DLRM, "build_optimizers": rs.build_optimizers, "torch": torch, "batch": object(),
          "spec": CriteoSpec(table_sizes=(13,) * 26),
          "train_step": lambda model, opts, batch, amp_dtype=None: calls.append((model, opts, amp_dtype))}
    exec(apply_hint(cfg, "recsys")["code"], ns)  # noqa: S102
    model, opts, amp = calls[0]
    assert model.impl == cand.options["embedding"]
    assert amp == {"bf16": torch.bfloat16, "fp16": torch.float16}.get(cand.recipe.precision)
    sparse = {"sparse-adam": torch.optim.SparseAdam, "sparse-adagrad": torch.optim.Adagrad}
    assert type(opts[0]) is sparse.get(cand.options["optimizer"], torch.optim.AdamW)


def test_report_next_step_of_a_bf16_click_winner_keeps_bf16():
    d = json.load(open(DATA))
    d["suite"] = dict(d["suite"], task="recsys", roles=["dlrm"])
    win = next(c for c in recsys_candidates() if c.name == "bag+sparse-adam+bf16")
    cfg = dict(d["configs"][1], name=win.name, recipe=win.recipe.to_dict(), options=dict(win.options),
               precision="bf16", baseline=False, label=win.name)
    # an older writer's hint, as the file holds it: no bf16
    old_code = 'DLRM(spec, embedding="embeddingbag", sparse=True); build_optimizers(model, "sparse-adam")'
    d["recommendation"] = {"name": win.name, "text": "fastest", "apply": {"code": old_code, "train": None}}
    d["configs"] = [d["configs"][0], cfg]
    assert "amp_dtype=torch.bfloat16" in next_step(d).text
    assert RECSYS_SUITES["recsys"].candidates[4].name == win.name


# --- Tracebacks instead of one line ------------------------------------------------------------------

def test_report_on_a_read_only_folder_prints_the_table_and_one_line(tmp_path, capsys, monkeypatch):
    folder = _results(tmp_path)
    before = open(os.path.join(folder, "results.json")).read()

    def read_only(*a, **k):
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(tempfile, "mkstemp", read_only)  # what a read-only mount answers (root ignores chmod)
    assert main(["report", folder]) == 2
    cap = capsys.readouterr()
    assert "overdrive bench" in cap.out and cap.err.count("\n") == 1 and "Read-only file system" in cap.err
    assert "--out DIR" in cap.err and open(os.path.join(folder, "results.json")).read() == before
    monkeypatch.undo()
    import overdrive.report.plots as plots

    monkeypatch.setattr(plots, "write_plots", lambda results, out: [])  # matplotlib is not the point here
    assert main(["report", folder, "--out", str(tmp_path / "elsewhere")]) == 0
    assert (tmp_path / "elsewhere" / "report.html").exists()


def _edit(d, path, value):
    *head, last = path
    o = d
    for k in head:
        o = o[k]
    if value is KeyError:
        del o[last]
    else:
        o[last] = value


@pytest.mark.parametrize("path,value,says", [
    (("configs", 0, "models", "student", "step_ms", "median"), "fast", "step_ms/median: 'fast' is not of type"),
    (("configs", 1, "models", "student", "speedup"), float("nan"), "speedup: nan is not a finite number"),
    (("configs", 0, "models", "teacher", "step_ms", "median"), -1, "step_ms/median: -1 is less than or equal to"),
    (("configs", 1, "models", "student", "speedup_ci"), [1.0], "speedup_ci: [1.0] is too short"),
    (("configs", 1, "memory_saved_pct"), "x", "memory_saved_pct: 'x' is not of type"),
    (("configs", 1, "peak_mb"), float("inf"), "peak_mb: inf is not a finite number"),
    (("suite", "batch"), KeyError, "suite: 'batch' is a required property"),
    (("suite", "roles"), 3, "suite/roles: 3 is not of type 'array'"),
    (("micro", 0, "ms"), None, "micro/0/ms: None is not of type 'object'"),
    (("env", "verdict"), None, "env/verdict: None is not of type 'array'"),
])
def test_hand_edited_results_field_is_named_in_one_line(tmp_path, capsys, path, value, says):
    d = json.load(open(DATA))
    _edit(d, path, value)
    (tmp_path / "results.json").write_text(json.dumps(d))
    err = _one_line_exit_2(capsys, ["report", str(tmp_path)])
    assert says in err, err


def test_results_the_bench_writes_still_load(tmp_path):
    d = json.load(open(DATA))
    d["configs"][1]["models"]["student"]["final_loss"] = float("nan")  # a diverged loss is reported, not refused
    d["configs"][1]["raw"] = {"student_loss": [float("nan")]}
    save_results(d, str(tmp_path))
    assert load_results(str(tmp_path))["suite"]["name"] == "cpu-quick"


def test_markup_in_a_device_name_and_a_data_path_prints_as_text(tmp_path, capsys):
    folder = tmp_path / "x[" / "b]"  # "[/b]" in the path: rich would read a closing tag
    folder.mkdir(parents=True)
    d = json.load(open(DATA))
    d.update(device="CPU [/b] [red]", data="/data/[/b].txt")
    (folder / "results.json").write_text(json.dumps(d))
    assert main(["report", str(folder)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "CPU [/b] [red]" in out and f"re-rendered {folder}/report.html" in out


def test_markup_in_a_gpu_name_and_a_data_note_prints_as_text(tmp_path, capsys, monkeypatch):
    import overdrive.bench as bench
    import overdrive.bench.workloads.gpt as gpt
    import overdrive.env as env

    res = json.load(open(DATA))
    monkeypatch.setattr(env, "get_env", lambda **k: SimpleNamespace(has_gpu=True, gpus=[SimpleNamespace(
        name="NVIDIA [/b] H100")]))
    monkeypatch.setattr(bench, "run_bench", lambda *a, **k: res)
    monkeypatch.setattr(gpt.GPTWorkload, "check_data", lambda self, p: f"{p}: [/b] 5,000 bytes")
    assert main(["bench", "--suite", "cpu-quick", "--data", "corpus[/b].txt"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "on NVIDIA [/b] H100" in out and "data: corpus[/b].txt: [/b] 5,000 bytes" in out


def test_markup_in_probed_names_prints_as_text():
    from rich.console import Console

    from fakes import machine
    from overdrive.env import build_report
    from overdrive.report.doctor import render_doctor

    facts = machine("h100")
    facts["probes"]["gpus"]["gpus"][0]["name"] = "NVIDIA [/b] H100"
    facts["cpu"]["model"] = "Xeon [/i]"
    buf = io.StringIO()
    render_doctor(build_report(facts), Console(file=buf, width=200))
    assert "NVIDIA [/b] H100" in buf.getvalue() and "Xeon [/i]" in buf.getvalue()


def test_train_section_given_as_a_value_then_set_is_one_line(tmp_path, capsys):
    p = tmp_path / "t.toml"
    p.write_text("train = 3\n")
    err = _one_line_exit_2(capsys, ["train", str(p), "--set", "train.steps=5"])
    assert "[train] in" in err and "is 3, not a table of keys" in err


@pytest.mark.parametrize("override,says", [
    ("model.n_layer=100000", "'model.n_layer' = 100,000 is beyond what this trainer takes (at most 1,024)"),
    ("model.n_embd=1048576", "'model.n_embd' = 1,048,576 is beyond"),
    ("data.vocab_size=1000000000", "'data.vocab_size' = 1,000,000,000 is beyond"),
    ("train.global_batch=1000000000000", "'train.global_batch' = 1,000,000,000,000 is beyond"),
])
def test_huge_model_is_refused_before_anything_is_built(tmp_path, capsys, monkeypatch, override, says):
    import overdrive.train.trainer as trainer

    def never(*a, **k):
        raise AssertionError("built a model for a config that should have been refused")

    monkeypatch.setattr(trainer, "build_model", never)
    monkeypatch.setattr(trainer, "load_tokens", never)
    err = _one_line_exit_2(capsys, ["train", TINY, "--set", override,
                                    "--set", f"train.out_dir=\"{tmp_path}\""])
    assert says in err, err


def test_parameter_bound_counts_depth_and_width_together():
    with pytest.raises(ConfigError, match=r"about 52,777B parameters .* beyond 1,000B"):
        load_config(None, ["model.n_layer=1024", "model.n_embd=65536", "model.n_head=64"])
    cfg = load_config(None, ["model.n_layer=96", "model.n_embd=12288", "model.n_head=96"])  # GPT-3 175B passes
    assert cfg.model.n_layer == 96



def _latency_doc() -> dict:
    mode = {"status": "ok", "batches": {"1": {"p50": 0.5, "p99": 0.9}, "16": {"p50": 2.0, "p99": 12.0}},
            "slo_batch": 1, "slo_throughput": 1100.0}
    return {"schema": "overdrive.latency/1", "device": "CPU [/b]", "created": "2026-12-01", "slo_ms": 10.0,
            "workloads": {"recsys": {"model": "DLRM", "unit": "examples/s", "modes": {"fp32": mode},
                                     "best": {"text": "fp32 at batch 1", "mode": "fp32", "batch": 1}}}}


@pytest.mark.parametrize("edit,says", [
    (lambda d: d["workloads"]["recsys"]["modes"]["fp32"].pop("slo_throughput"), "'slo_throughput' is a required"),
    (lambda d: d["workloads"]["recsys"]["modes"]["fp32"]["batches"].update(x={}), "'x' does not match"),
    (lambda d: d["workloads"]["recsys"]["modes"]["fp32"]["batches"]["1"].update(p99=float("nan")),
     "batches/1/p99: nan is not a finite number"),
])
def test_hand_edited_latency_results_field_is_named_in_one_line(tmp_path, capsys, monkeypatch, edit, says):
    import overdrive.report.latency_view as lv

    monkeypatch.setattr(lv, "_plot", lambda r, path: open(path, "wb").close())  # matplotlib is not the point
    d = _latency_doc()
    (tmp_path / "results.json").write_text(json.dumps(d))
    assert main(["report", str(tmp_path)]) == 0 and "CPU [/b]" in capsys.readouterr().out
    edit(d)
    (tmp_path / "results.json").write_text(json.dumps(d))
    err = _one_line_exit_2(capsys, ["report", str(tmp_path)])
    assert says in err, err
