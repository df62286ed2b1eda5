"""Hostile pass on tune (issue 41): a loss that is NaN on some batches is a named failure whether the
candidate finished the rounds or was dropped in them, an unsafe baseline is never cached, a cached
"keep the baseline" is replaceable, and a tampered tune result is schema-checked and escaped."""

from __future__ import annotations

import copy
import json
import math
import random

import pytest
import torch
from torch import nn

from fakes import TORCHAO_EMU, machine
from overdrive.cli import main
from overdrive.env import build_report
from overdrive.errors import UserError
from overdrive.recipes import Recipe
from overdrive.recipes.tuned import save_tuned
from overdrive.tuning.api import _pick, _row
from overdrive.tuning.candidates import named_candidates
from overdrive.tuning.measure import Run, Session
from overdrive.tuning.workload import Workload
import user_models

CPU = build_report(machine(None, torchao=TORCHAO_EMU))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 8)

    def forward(self, x):
        return self.fc(x)


def _batch(step):
    return torch.randn(4, 16)


def _session(monkeypatch, speed: dict, nan_every: dict):
    """Faked workers: each run steps at speed[name] ms; its loss is NaN on every nan_every[name]-th step
    (a batch that overflows), 1.0 otherwise (the warm-up's first 3 steps are finite)."""
    cands = named_candidates([n for n in speed if n != "baseline"], CPU)
    rng = random.Random(0)
    s = Session(Workload(model_fn=Net, batch_fn=_batch), CPU, budget_s=60)
    s.runs = [Run(cand=c, worker=object(), warmup_ms=[50.0, speed[c.name], speed[c.name]], loss=[1.0, 1.0, 1.0],
                  gnorm=[1.0] * 3) for c in cands]
    base = s.runs[0]
    for r in s.runs[1:]:
        r.safety = s._safety(r, base)  # the warm-up's verdict: safe on its 3 finite steps
    s.twin = Run(cand=base.cand, worker=object(), warmup_ms=[50.0, speed["baseline"]] * 2)

    def fake_call(run, msg, timeout, on_timeout):
        name = "baseline" if run is s.twin else run.cand.name
        k, every = len(run.loss), nan_every.get(name)
        return {"steps": [{"ms": speed[name] * rng.uniform(0.99, 1.01), "gnorm": 1.0,
                           "loss": math.nan if every and (k + i) % every == every - 1 else 1.0}
                          for i in range(msg[1])]}

    def fake_end(run, status, reason, *, collect=False):
        run.status, run.reason, run.worker = status, reason, None

    monkeypatch.setattr(s, "_call", fake_call)
    monkeypatch.setattr(s, "_end", fake_end)
    return s


# --- Critical 6: NaN-sometimes losses ------------------------------------------------------------------

def test_a_loss_nan_on_some_batches_is_unsafe_even_for_a_candidate_dropped_mid_rounds(monkeypatch):
    # fp32 leads (finite losses); amp-fp16 and amp-bf16 are NaN on 1 batch in 7 and slow enough to be
    # halved away mid-rounds, where their later losses were never judged.
    speed = {"baseline": 10.0, "fp32": 5.0, "amp-fp16": 9.0, "amp-bf16": 9.5}
    s = _session(monkeypatch, speed, {"amp-fp16": 7, "amp-bf16": 7})
    base = s.runs[0]
    s._timed(base, reserve_s=0.1)
    s.finish(base)
    by = {r.cand.name: r for r in s.runs}
    for name in ("amp-fp16", "amp-bf16"):
        r = by[name]
        assert any(math.isnan(v) for v in r.loss[3:]), "the fake must give NaN after the warm-up"
        assert r.status == "unsafe" and r.safety.safe is False and "loss is nan at step" in r.reason, (r.status,
                                                                                                      r.reason)
    rows = [_row(r, base, CPU, s.floor(base)) for r in s.runs]
    assert [x["safe"] for x in rows[2:]] == [False, False]
    best, _, _ = _pick(rows, s.runs, floor=s.floor(base))
    assert best.name in ("baseline", "fp32")


def test_a_baseline_nan_in_the_timed_rounds_is_a_named_failure_never_cached(monkeypatch):
    speed = {"baseline": 10.0, "fp32": 9.0}
    s = _session(monkeypatch, speed, {"baseline": 7})
    base = s.runs[0]
    s._timed(base, reserve_s=0.1)
    with pytest.raises(UserError, match=r"the baseline .* gives a non-finite loss \(nan at step \d+, \d+ of \d+ steps\)"
                                        r".*nothing is cached"):
        s.finish(base)


def test_a_cached_kept_baseline_is_replaceable_a_cached_winner_is_not(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    kw = {"signature": "sig", "fingerprint": "fp", "threads": 2}
    p, written = save_tuned(Recipe(name="baseline"), summary="keeping the baseline", confident=True, **kw)
    assert written
    p, written = save_tuned(Recipe(name="baseline"), summary="inconclusive", confident=False, **kw)
    assert written and json.load(open(p))["summary"] == "inconclusive"
    save_tuned(Recipe(name="fp32+foreach", precision="fp32", optimizer="foreach"), summary="1.2x", confident=True, **kw)
    assert not save_tuned(Recipe(name="baseline"), summary="busy", confident=False, **kw)[1]


# --- Critical 3 and Major: a tune result read back is schema-checked and escaped ------------------------

def _cand(name, *, baseline=False, layers=None):
    return {"name": name, "names": [name], "label": name, "baseline": baseline, "stage": 1, "status": "ok",
            "reason": "", "ran": "fp32 eager", "emulated": False, "step_ms": 10.0, "step_ms_p10": 9.0,
            "step_ms_p90": 11.0, "n": 20, "speedup": 1.0, "speedup_ci": None if baseline else [0.9, 1.1],
            "verdict": "baseline" if baseline else "same", "rounds": 4, "warmup_first_step_ms": 50.0,
            "warmup_steps_ms": [50.0], "setup_s": 0.1, "safe": True, "safety": "finite", "loss_delta_pct": 0.0,
            "loss_delta_nats": 0.0, "losses": [2.0, 1.9], "resolved": {}, "recipe": {}, "conversions": {},
            "fp8_filter": None if layers is None else {"shapes": "", "summary": "-", "layers": layers},
            "memory": None}


def _doc(layers):
    return {"schema": "overdrive.tune/1", "best": "baseline", "summary": "Keeping the baseline.",
            "recipe": {"name": "baseline"}, "candidates": [_cand("baseline", baseline=True),
                                                           _cand("fp8", layers=layers)],
            "workload": "Net", "budget_s": 30, "elapsed_s": 29.5, "rounds": 4, "tolerance": "within 1%",
            "created": "2026-12-02T06:00:00+00:00", "baseline": "baseline", "cpu": "cpu", "gpu": None,
            "noise": None, "threads": {"threads": 2, "source": "auto"}}


LAYER = {"fqn": "fc", "shape": "16x8", "tokens": 4, "bf16_ms": 0.1, "fp8_ms": 0.2, "speedup": 0.5,
         "convert": False, "reason": "stays bf16"}


def _write(tmp_path, doc, name="t"):
    d = tmp_path / name
    d.mkdir()
    (d / "results.json").write_text(json.dumps(doc))
    return d


def test_a_tune_result_renders_with_every_text_escaped(tmp_path, capsys):
    layer = dict(LAYER, fqn="<script>alert(1)</script>", reason="<img src=x onerror=alert(2)>")
    d = _write(tmp_path, _doc([layer]))
    assert main(["report", str(d)]) == 0
    page = (d / "report.html").read_text()
    assert "<script>alert" not in page and "<img src=x" not in page and "&lt;script&gt;alert(1)" in page


@pytest.mark.parametrize("path,value,says", [
    (("candidates", 1, "fp8_filter", "layers", 0, "shape"), "<script>alert(1)</script>", "shape"),
    (("candidates", 1, "fp8_filter", "layers", 0, "tokens"), "<img src=x onerror=alert(1)>", "tokens"),
    (("budget_s",), "thirty", "budget_s"),
    (("candidates", 0, "step_ms"), [1], "step_ms"),
    (("candidates", 1, "speedup"), float("inf"), "speedup"),
    (("candidates", 1), None, "candidates/1"),
    (("summary",), None, "summary"),
])
def test_a_tampered_tune_result_is_one_line_naming_the_field(tmp_path, capsys, path, value, says):
    doc = _doc([dict(LAYER)])
    o = doc
    for k in path[:-1]:
        o = o[k]
    if value is None and path[-1] == "summary":
        del o[path[-1]]
    else:
        o[path[-1]] = value
    d = _write(tmp_path, copy.deepcopy(doc))
    assert main(["report", str(d)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and "not a valid overdrive tune result" in err, err
    assert says in err and "<script>" not in err.split("at ")[0]
    assert not (d / "report.html").exists()


# --- Major: a cache folder that cannot be written costs the cache, never the measurement -------------

USER_CODE = user_models.TUNE_MLP


@pytest.mark.slow  # one real tune of the baseline and fp32 (~20 s)
def test_a_cache_folder_that_cannot_be_written_still_writes_the_results(tmp_path, monkeypatch, capsys):
    import overdrive

    overdrive.get_env()
    blocker = tmp_path / "cache"
    blocker.write_text("a file where the cache folder would be (root writes into read-only folders)")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    (tmp_path / "m.py").write_text(USER_CODE)
    m = str(tmp_path / "m.py")
    out = tmp_path / "o"
    rc = main(["tune", f"{m}:model", "--batch", f"{m}:batch", "--loss", f"{m}:loss", "--budget-s", "40",
               "--candidates", "fp32",
               "--out", str(out)])
    assert rc == 0, capsys.readouterr().err
    res = json.loads((out / "results.json").read_text())
    assert res["cache_note"].startswith("not cached (") and "XDG_CACHE_HOME" in res["cache_note"]
    assert "not cached (" in capsys.readouterr().out


# --- Minor: a tampered tune cache entry -------------------------------------------------------------------

def test_a_tampered_cache_entry_is_unreadable_or_renamed_by_its_fields(tmp_path, monkeypatch):
    from overdrive.recipes.tuned import load_tuned, model_signature, machine_fingerprint, tuned_path

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    net = Net()
    p, _ = save_tuned(Recipe(name="fp32+foreach", precision="fp32", optimizer="foreach"),
                      signature=model_signature(net), fingerprint=machine_fingerprint(CPU), summary="1.2x",
                      threads=torch.get_num_threads())
    d = json.load(open(p))
    d["recipe"]["name"] = "amp-bf16 (FAST!)"  # the name says one thing, the fields another
    open(p, "w").write(json.dumps(d))
    rec, why = load_tuned(net, CPU)
    assert rec.name == "fp32+foreach" and "cached as 'amp-bf16 (FAST!)'" in why
    d["recipe"]["fp8_min_dim"] = "big"
    open(p, "w").write(json.dumps(d))
    rec, why = load_tuned(net, CPU)
    assert rec is None and "fp8_min_dim='big'" in why and "unreadable" in why


# --- Minor: plan flags that are empty --------------------------------------------------------------------

@pytest.mark.parametrize("flag", ["--precision", "--sharding", "--checkpointing"])
def test_an_empty_plan_list_flag_is_one_line_not_all_of_them(capsys, flag):
    assert main(["plan", "--model", "llama3-8b", flag, ""]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{flag} '' names an empty value" in err


# --- Minor: a figure near 1e308 in `report` -----------------------------------------------------------------

def test_a_huge_figure_in_report_is_our_one_line_note_not_matplotlibs_warnings(tmp_path, capsys):
    import os
    import warnings

    d = json.load(open(os.path.join(os.path.dirname(__file__), "data", "bench_cpu_quick.json")))
    for m in d["configs"][1]["models"].values():
        m["speedup"], m["speedup_ci"] = 1e308, [1e308, 1e308]
    (tmp_path / "results.json").write_text(json.dumps(d))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert main(["report", str(tmp_path)]) == 0
    assert not [w for w in seen if issubclass(w.category, RuntimeWarning)], [str(w.message) for w in seen]
    assert "could not draw speedup.png: overflow" in capsys.readouterr().out


# --- Minor: the threads a model sets itself are the threads recorded ------------------------------------------

@pytest.mark.slow  # one real tune of the baseline (~20 s)
def test_tune_records_the_threads_the_model_set_not_the_planned_ones(tmp_path, monkeypatch, capsys):
    import overdrive

    overdrive.get_env()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    (tmp_path / "m.py").write_text(USER_CODE.replace("    torch.manual_seed(0)\n",
                                                     "    torch.manual_seed(0)\n    torch.set_num_threads(7)\n"))
    m = str(tmp_path / "m.py")
    rc = main(["tune", f"{m}:model", "--batch", f"{m}:batch", "--loss", f"{m}:loss", "--budget-s", "40",
               "--candidates", "fp32", "--out", str(tmp_path / "o")])
    assert rc == 0, capsys.readouterr().err
    t = json.loads((tmp_path / "o" / "results.json").read_text())["threads"]
    assert t["threads"] == 7 and t["planned"] != 7 and t["source"].startswith("the model")
