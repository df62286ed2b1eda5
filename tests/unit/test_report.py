"""Report rendering from a real CPU bench result (tests/unit/data: `overdrive bench --quick` on a 2-core
AVX2 host), edited where a test needs another outcome: what a reader sees, in the console and the HTML."""

import copy
import html
import io
import json
import os
import re
import subprocess
import sys

import pytest
from rich.console import Console

import overdrive
from overdrive.bench import load_results, save_results
from overdrive.recipes import PRESETS, get_recipe
from overdrive.report.advice import next_step, precision_note
from overdrive.report.compare import compare_rows, ran_label, write_compare_html
from overdrive.report.html import bench_rows, write_html
from overdrive.report.plots import _losses, loss_deltas
from overdrive.report.tables import render_bench, render_compare

DATA = os.path.join(os.path.dirname(__file__), "data", "bench_cpu_quick.json")


@pytest.fixture
def res():
    with open(DATA) as f:
        return json.load(f)


def _console_text(fn, *args) -> str:
    buf = io.StringIO()
    fn(*args, Console(file=buf, width=250, color_system=None))
    return buf.getvalue()


def _win(res, name):
    """The same result with `name` as the measured winner."""
    r = copy.deepcopy(res)
    c = next(c for c in r["configs"] if c["name"] == name)
    c.update(status="ok", safe=True, speedup=1.31, speedup_ci=[1.2, 1.4])
    r["recommendation"] = {"name": name, "text": f"fastest safe recipe here: {name} — 1.31x", "speedup": 1.31}
    return r


def test_html_shows_the_console_figure_for_mfu_on_cpu(res):
    # No GPU peak on CPU: the console prints the achieved GF/s; the HTML used to print "-".
    console = _console_text(render_bench, res)
    _, rows = bench_rows(res)
    base = res["configs"][0]["models"]["teacher"]
    figure = f"{base['tflops'] * 1e3:.0f} GF/s"
    assert figure in console
    assert rows[0][7] == figure


def test_rows_keep_the_runs_order_after_a_save_and_reload(res, tmp_path):
    # results.json is written with sorted keys, which puts "student" before "teacher".
    save_results(res, str(tmp_path))
    again = load_results(str(tmp_path))
    assert list(again["configs"][0]["models"]) == ["student", "teacher"]
    _, rows = bench_rows(again)
    assert [r[1] for r in rows[:2]] == ["teacher", "student"]
    text = _console_text(render_bench, again)
    assert text.index("teacher") < text.index("student")


# The file's fp32-fused was recorded with optimizer="auto" (an older preset): its fields, what was
# measured, are the fp32 preset's today, and the next step prints those.
@pytest.mark.parametrize("name,preset", [("amp-bf16", "amp-bf16"), ("fp32-fused", "fp32")])
def test_next_step_names_a_preset_that_accelerate_and_train_accept(res, tmp_path, name, preset):
    step = next_step(_win(res, name))
    assert step.code == f'overdrive.accelerate(model, recipe="{preset}")'
    assert step.config == f'train.recipe = "{preset}"  (or --set train.recipe={preset})'
    assert preset in PRESETS
    html = write_html(_win(res, name), str(tmp_path), [])
    page = open(html).read()
    assert "class='next'" in page and f'recipe = &quot;{preset}&quot;' in page


def test_next_step_for_a_non_preset_winner_carries_the_whole_recipe(res):
    # It used to print the nearest preset for the train config and say "compile='default' is left out".
    r = _win(res, "amp-bf16")
    c = next(c for c in r["configs"] if c["name"] == "amp-bf16")
    c["name"] = r["recommendation"]["name"] = "amp-bf16+compile"
    c["recipe"] = dict(c["recipe"], name="amp-bf16+compile", compile="default")
    step = next_step(r)
    assert step.code == 'overdrive.accelerate(model, recipe="amp-bf16+compile")'
    assert step.config == 'train.recipe = "amp-bf16+compile"  (or --set train.recipe=amp-bf16+compile)'
    assert "left out" not in step.text


def test_baseline_winner_says_keep_plain_pytorch(res):
    step = next_step(res)
    assert "keep your plain fp32 PyTorch loop" in step.text and step.code is None


def test_best_precision_next_to_an_fp32_pick_is_explained(res, tmp_path):
    r = copy.deepcopy(res)
    r["env"]["best_precision"] = {"precision": "bf16", "reason": "this CPU has AMX bf16 units"}
    r["env"]["verdict"] = [v.replace("Best precision here: fp32", "Best precision here: bf16")
                           for v in r["env"]["verdict"]]
    why = precision_note(r)
    assert why.startswith("Why fp32 and not bf16") and "amp-bf16 was stopped early" in why
    page = open(write_html(r, str(tmp_path), [])).read()
    assert "class='why'" in page and "the probes' expectation" in page
    assert precision_note(res) is None  # fp32 expected and fp32 won: nothing to explain


def test_loss_plot_draws_differences_to_the_baseline_within_the_band(res, tmp_path):
    r = copy.deepcopy(res)
    base = r["configs"][0]["raw"]["teacher_loss"]
    r["configs"][1]["raw"]["teacher_loss"] = list(base)
    r["configs"][2]["raw"]["teacher_loss"] = [1.02 * x for x in base]
    tols, d = loss_deltas(r, "teacher")
    assert "baseline" not in d
    assert all(v == 0.0 for v in d["fp32-fused"])
    assert all(abs(v - 2.0) < 1e-9 for v in d["amp-bf16"])
    assert tols == [5.0, 3.0, 1.0]
    _losses(r, str(tmp_path / "loss_curves.png"))  # only this plot: the others take seconds more
    assert (tmp_path / "loss_curves.png").stat().st_size > 0


def _fallback_pair(res):
    """A: fp8 fell back to bf16 (no FP8 engine); B: fp8 emulated by torchao."""
    a, b = copy.deepcopy(res), copy.deepcopy(res)
    fa = next(c for c in a["configs"] if c["name"] == "fp8")
    fa.update(precision="bf16", emulated=False)
    fa["resolved"] = dict(fa["resolved"], precision="bf16", emulated=False, fp8_backend=None)
    b["configs"] = [c for c in b["configs"] if c["name"] != "amp-fp16"]
    return a, b


def test_compare_keys_rows_by_what_ran_not_the_name(res):
    a, b = _fallback_pair(res)
    rows = compare_rows(a, b)
    fp8 = [r for r in rows if r["config"] == "fp8" and r["model"] == "teacher"]
    assert {(r["ran"], r["a_status"], r["b_status"]) for r in fp8} == {("bf16", "stopped", "absent"),
                                                                      ("fp8 emulated", "absent", "stopped")}
    assert ran_label(next(c for c in b["configs"] if c["name"] == "fp8")) == "fp8 emulated"
    fp16 = [r for r in rows if r["config"] == "amp-fp16"]
    assert fp16 and all(r["b_status"] == "absent" for r in fp16)
    text = _console_text(render_compare, a, b)
    assert "A status" in text and "absent: that result has no such row" in text
    assert "fp8 ran as bf16 in A and as fp8 emulated in B" in text


def test_compare_rows_from_b_only_are_kept_and_the_page_has_a_legend(res, tmp_path):
    a, b = _fallback_pair(res)
    rows = compare_rows(b, a)  # now B has amp-fp16 and A does not
    assert [r for r in rows if r["config"] == "amp-fp16" and r["a_status"] == "absent"]
    page = open(write_compare_html(a, b, str(tmp_path))).read()
    assert "class='rec'" in page and "class='next'" in page and "class='legend'" in page
    assert page.index("A status") < page.index("B status")


@pytest.mark.slow
def test_report_screenshot_without_a_browser_is_one_line_exit_2_and_keeps_the_page(res, tmp_path):
    save_results(res, str(tmp_path))
    env = dict(os.environ, OVERDRIVE_CHROMIUM=str(tmp_path / "no-chromium"))
    cp = subprocess.run([sys.executable, "-m", "overdrive", "report", str(tmp_path), "--screenshot"],
                        capture_output=True, text=True, env=env, timeout=300)
    assert cp.returncode == 2, cp.stderr[-2000:]
    assert cp.stderr.count("\n") == 1 and "--screenshot:" in cp.stderr and "Traceback" not in cp.stderr
    assert (tmp_path / "report.html").exists()
    assert re.search(r"(no Chromium found|Playwright is not installed)", cp.stderr)


def test_plan_page_says_how_to_run_the_pick_with_presets_the_trainer_accepts(tmp_path):
    from overdrive.plan import get_model, plan
    from overdrive.report.plan_html import plan_next_step, write_plan_html

    r = plan(get_model("llama3-8b"), "h100-sxm", seq=4096)
    step = plan_next_step(r)
    preset = re.search(r"recipe=&quot;([\w+-]+)&quot;", step).group(1)
    assert get_recipe(preset).name == preset  # a name accelerate() and `overdrive train` accept
    assert "overdrive.accelerate(model, recipe=" in step and "torchrun --nproc_per_node=8 train.py" in step
    assert "overdrive train CONFIG" not in step   # that trains only the reference GPT, not the user's model
    r["top"] = dict(r["top"], sharding="hsdp", tp=2)
    step = plan_next_step(r)
    assert "Not run by Overdrive: hsdp" in step and "tp 2: tensor parallelism is Megatron-Core" in step
    page = open(write_plan_html(r, str(tmp_path))).read()
    assert "class='rec'" in page and "class='next'" in page


def test_newer_results_the_benchs_apply_hint_labels_and_no_evidence_verdict(res, tmp_path):
    # Newer writers: the recommendation carries its own "Apply: ..." hint, a configuration its label
    # (what ran, fallbacks included) and the candidates that resolved to the same thing; `safe` may be
    # None (quality not assessed); with no measurable winner the recommendation's name is None.
    r = _win(res, "amp-bf16")
    code = 'overdrive.accelerate(model, recipe="amp-bf16")'
    r["recommendation"].update(text=r["recommendation"]["text"] + f". Apply: {code}", apply={"code": code,
                               "train": 'train.recipe = "amp-bf16"'})
    fp8 = next(c for c in r["configs"] if c["name"] == "fp8")
    fp8.update(label="fp8 → fp8 emulated (fallback: no FP8 GPU)", safe=None, not_assessed_reason="too few steps")
    fused = next(c for c in r["configs"] if c["name"] == "fp32-fused")
    fused["also"] = [{"name": "fp32", "label": "fp32"}]
    step = next_step(r)
    assert step.code == code and step.config.startswith('train.recipe = "amp-bf16"')
    console = _console_text(render_bench, r)
    assert console.count(code) == 1  # said once, in the recommendation
    page = open(write_html(r, str(tmp_path), [])).read()
    assert page.count(html.escape(code)) == 1 and "class='next'" in page  # once, on the next-step line
    _, rows = bench_rows(r)
    names = [row[0] for row in rows]
    assert "fp8 → fp8 emulated (fallback: no FP8 GPU) (emulated)" in names and "fp32-fused = fp32" in names
    assert "not assessed" in [row[-1] for row in rows] and "fp8: too few steps" in page
    r["recommendation"] = {"name": None, "text": "no recipe was measurably faster than the baseline here",
                           "apply": None}
    r["env"]["best_precision"] = {"precision": "bf16", "reason": "AMX"}
    assert "keep your plain fp32 PyTorch loop" in next_step(r).text
    assert precision_note(r).startswith("Why fp32 and not bf16")


def test_a_clipped_reason_ends_at_a_word():
    from overdrive.report.tables import _clip

    long = "liger_kernel unsupported: imports, but LigerRMSNorm forward+backward needs a CUDA device (no GPU here)"
    out = _clip(long)
    assert len(out) <= 82 and out.endswith(" …") and long.startswith(out[:-2])
    assert long.split()[len(out[:-2].split()) - 1] == out[:-2].split()[-1]  # the last word is whole
    assert _clip("short reason") == "short reason"


def test_loss_plot_scales_to_the_judged_tail_not_the_first_steps():
    from overdrive.report.plots import judged_window

    spiky = {"fp8": [0.0, 60.0, -8.0] + [0.5] * 37}  # a fresh model's first steps swing by tens of percent
    start, lim = judged_window(spiky, [5.0, 3.0], 40)
    assert start == 31  # the verdict's tail: the last quarter of 40 steps
    assert lim == pytest.approx(6.5)  # the widest band (5%) and the tail, not the 60% spike
    assert judged_window({"a": [0.1, -0.2, 0.3, 0.1]}, [1.0], 4) == (2, None)  # nothing to clip: matplotlib's own


@pytest.mark.parametrize("cols,width", [(None, 150), ("80", 150), ("220", 220), ("wide", 150)])
def test_a_piped_console_is_wide_and_only_widened_by_columns(monkeypatch, cols, width):
    from overdrive.report.console import wide_console

    if cols is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", cols)
    assert wide_console().width == width  # pytest's stdout is not a terminal: the piped case


def test_a_non_answer_is_never_drawn_as_a_result(res, tmp_path):
    """'too busy to judge' is no verdict: the bench and tune pages drew it in the green box of a result."""
    from overdrive.report.tune_view import write_report
    from overdrive.results.records import TuneRecord

    r = copy.deepcopy(res)
    r["recommendation"] = {"name": None, "text": "the host was too busy to judge: ...", "too_busy": True}
    page = open(write_html(r, str(tmp_path / "busy"), [])).read()
    assert "<p class='rec none'>" in page
    page = open(write_html(_win(res, "amp-bf16"), str(tmp_path / "win"), [])).read()
    assert "<p class='rec'>" in page
    tune = {"workload": "m", "cpu": "CPU", "created": "now", "budget_s": 60, "elapsed_s": 60, "rounds": 4,
            "summary": "The host was too busy to judge: ...", "noise": {"too_busy": True}, "tolerance": "fp32 1%",
            "baseline": "baseline", "candidates": [], "best": "baseline"}
    out = write_report(TuneRecord.of(tune), str(tmp_path / "tune"))
    assert "<p class='rec none'>" in open(out).read()
