"""The workload protocol: one registry, user data per workload, and a new workload in one class."""

import dataclasses
import random

import pytest

from fakes import machine
from overdrive.bench import Candidate, Suite, run_bench
from overdrive.bench.workloads import WORKLOADS, Task, Workload, workload_for_task
from overdrive.bench.workloads.recsys import RECSYS_SUITES
from overdrive.data import DataError
from overdrive.env import build_report
from overdrive.recsys.data import CriteoSpec

CPU = build_report(machine(None))


def _criteo_line(i: int) -> str:
    rng = random.Random(i)  # labels independent of the features: nothing to learn
    dense = [str(rng.randrange(50)) if k % 5 else "" for k in range(13)]  # some empty fields, as in Criteo
    cats = [format(rng.getrandbits(32), "08x") for _ in range(26)]
    return "\t".join([str(rng.randrange(2)), *dense, *cats])


@pytest.fixture
def tsv(tmp_path):
    lines = [_criteo_line(i) for i in range(400)]
    lines[3] = "2\t" + lines[3][2:]              # label not 0/1
    lines[7] = "1\tfoo"                           # too few fields
    lines[9] = "1\t" + "x\t" * 38 + "ff"            # dense value not an integer
    p = tmp_path / "day_0.tsv"
    p.write_text("\n".join(lines) + "\n")
    return p


def test_registry_serves_every_workload_and_task():
    assert set(WORKLOADS) == {"transformer", "recsys", "inference"}
    assert workload_for_task("gpt") is WORKLOADS["transformer"]
    assert workload_for_task("recsys") is WORKLOADS["recsys"]
    with pytest.raises(ValueError, match="unknown bench task"):
        workload_for_task("speech")


def test_recsys_reads_a_users_criteo_tsv_and_counts_malformed_lines(tsv):
    note = WORKLOADS["recsys"].check_data(str(tsv))
    assert "400 lines, 397 read, 3 malformed" in note
    assert "label not 0/1: 1" in note and "2 fields, expected 40: 1" in note and "not an integer: 1" in note
    with pytest.raises(DataError, match="does not exist"):
        WORKLOADS["recsys"].check_data(str(tsv) + ".missing")
    small = CriteoSpec(table_sizes=(50,) * 26)
    suite = RECSYS_SUITES["recsys-quick"]
    suite = dataclasses.replace(suite, batch=64, rounds=2, steps_per_round=1, warmup=1, parity_steps=3, options=dict(
        suite.options, table_sizes=list(small.table_sizes), train_examples=300, val_examples=100))
    res = run_bench(suite.with_candidates(suite.candidates[:2]), env=CPU, data=str(tsv), micro=False, isolate=False,
                    threads=1)
    base = res["configs"][0]
    assert res["data"] == str(tsv) and base["status"] == "ok"
    assert base["final"]["n"] == 397 - int(0.8 * 397)  # the last 20% of the good lines are held out
    # Random labels carry no signal: the baseline's AUC is near chance, so quality is "not assessed", never safe.
    other = res["configs"][1]
    assert other["safe"] is None and "near chance" in other["not_assessed_reason"]


class _Echo(Task):
    """The smallest task: fit y = 2x with one weight (what a README example needs, nothing more)."""

    def __init__(self, spec):
        super().__init__(spec)
        import torch

        self.w = torch.zeros(1, requires_grad=True)
        self.opt = torch.optim.SGD([self.w], lr=spec["lr"])

    def step(self):
        import torch

        x = torch.linspace(-1, 1, 32)
        a = self.clock.mark()
        loss = ((self.w * x - 2 * x) ** 2).mean()
        loss.backward()
        self.opt.step()
        self.opt.zero_grad()
        b = self.clock.mark()
        self.clock.sync()
        return {"fit_ms": self.clock.elapsed_ms(a, b), "fit_loss": loss.item(), "fit_skipped": False}


class _EchoWorkload(Workload):
    name, task, roles = "echo", "echo", ("fit",)

    def build(self, spec):
        return _Echo(spec)

    def quality_rows(self, run, base, suite):
        return {"fit": {"final_loss": run.loss["fit"][-1] if run.loss["fit"] else None, "loss_delta_pct": None,
                        "unsafe_reason": None, "assessed": run.status == "ok"}}


def test_a_new_workload_is_one_class_and_one_registry_line(monkeypatch):
    monkeypatch.setitem(WORKLOADS, "echo", _EchoWorkload())
    suite = Suite(name="echo", task="echo", roles=("fit",), teacher="-", student="-", batch=32, seq=1, warmup=1,
                  rounds=2, steps_per_round=3, budget_s=60, parity_steps=10, micro="none", lr=0.1,
                  candidates=(Candidate.preset("baseline", baseline=True),))
    res = run_bench(suite, env=CPU, micro=False, isolate=False)
    base = res["configs"][0]
    assert base["status"] == "ok" and base["safe"] is True
    assert len(base["raw"]["fit_loss"]) == 10 and base["raw"]["fit_loss"][-1] < base["raw"]["fit_loss"][0]


class _EchoReported(_EchoWorkload):
    """The same made-up workload with what the report asks of it: a title, its columns and an apply hint."""
    name, task = "echo-report", "echo-report"
    rate_key, quality_header, loss_header, baseline_words = "examples_per_s", "final fit loss", "fit Δ", "plain SGD"

    def title(self, suite):
        return f"suite {suite['name']}: fit y = 2x with one weight, batch {suite['batch']}"

    def quality_cell(self, m, cfg):
        return "-" if m.get("final_loss") is None else f"{m['final_loss']:.2e}"

    def apply_hint(self, cfg):
        return {"code": f"fit(lr={cfg['options'].get('lr', 0.1)})", "train": None}


def test_a_made_up_workload_goes_through_analysis_results_and_report(monkeypatch, tmp_path):
    """One class and one registry line: the analysis, the schema'd writer and reader, the CSV, the console
    table, the page and the next step all ask the workload, never a name."""
    import csv
    import io

    from rich.console import Console

    from overdrive.bench import load_results, save_results
    from overdrive.report.advice import next_step
    from overdrive.report.html import write_html
    from overdrive.report.tables import render_bench

    monkeypatch.setitem(WORKLOADS, "echo-report", _EchoReported())
    suite = Suite(name="echo", task="echo-report", roles=("fit",), teacher="-", student="-", batch=32, seq=1,
                  warmup=1, rounds=2, steps_per_round=3, budget_s=60, parity_steps=10, micro="none", lr=0.1,
                  candidates=(Candidate.preset("baseline", baseline=True),))
    res = run_bench(suite, env=CPU, micro=False, isolate=False)
    m = res["configs"][0]["models"]["fit"]
    assert m["examples_per_s"] > 0 and m["tokens_per_s"] is None and m["tflops"] is None  # no GPT figures
    save_results(res, str(tmp_path))
    back = load_results(str(tmp_path))  # checked against the schema when written and when read
    rows = list(csv.DictReader(open(tmp_path / "results.csv")))
    assert [(r["config"], r["model"]) for r in rows] == [("baseline", "fit")] and float(rows[0]["examples_per_s"]) > 0
    buf = io.StringIO()
    render_bench(back, Console(file=buf, width=240, color_system=None))
    out = buf.getvalue()
    assert "fit y = 2x with one weight, batch 32" in out and "final fit loss" in out and "fit Δ" in out
    assert "DLRM" not in out and "MFU" not in out and "held-out AUC" not in out
    calm = dict(back, recommendation=dict(back["recommendation"], too_busy=False, name=None))  # the host's load aside
    assert "keep plain SGD" in next_step(calm).text
    page = open(write_html(back, str(tmp_path), [])).read()
    assert "fit y = 2x with one weight" in page and "final fit loss" in page and "DLRM" not in page


def test_worker_compile_threads_follow_the_cores_it_has(monkeypatch):
    import os

    from overdrive.bench.task import PROGRAM
    from overdrive.measure.worker import worker_main

    class Closed:
        def recv(self):
            raise EOFError

    monkeypatch.delenv("TORCHINDUCTOR_COMPILE_THREADS", raising=False)
    worker_main(Closed(), PROGRAM, compile_threads=4)  # 16 cores shared by 4 workers: not 1 (serialised Triton compiles)
    assert os.environ["TORCHINDUCTOR_COMPILE_THREADS"] == "4"


def test_a_suite_without_compiles_captures_no_cuda_graphs():
    """inference-quick (the GPU check's) runs no compile; CUDA graphs are torch.compile's
    reduce-overhead mode, one cold capture per shape: left out there too, with the reason."""
    from overdrive.bench.workloads.inference import LATENCY_SUITES, _modes

    h100 = build_report(machine("h100"))
    assert h100.has_gpu and h100.engine_ok("torch.compile")
    quick = _modes(h100, LATENCY_SUITES["inference-quick"])
    assert "compile" not in quick and "runs no compile" in quick["cuda-graphs"]
    full = _modes(h100, LATENCY_SUITES["inference-gpu"])
    assert full["compile"] is None and full["cuda-graphs"] is None
    assert "need a GPU" in _modes(CPU, LATENCY_SUITES["inference"])["cuda-graphs"]


def test_nothing_outside_a_workloads_file_branches_on_its_name():
    """The bench, its results, the report and the bench/report commands ask the workload (its title,
    columns, hint, kind, flags), never compare a workload's name or task to a literal."""
    import ast
    import pathlib

    src = pathlib.Path(__file__).resolve().parents[2] / "src" / "overdrive"
    names = {k for k in WORKLOADS} | {w.task for w in WORKLOADS.values()}
    files = [p for d in ("bench", "report", "results") for p in (src / d).rglob("*.py") if "workloads" not in p.parts]
    files += [src / "commands" / "bench.py", src / "commands" / "report.py"]
    found = []
    for p in files:
        for n in ast.walk(ast.parse(p.read_text())):
            if isinstance(n, ast.Compare) and any(isinstance(c, ast.Constant) and c.value in names
                                                  for c in [n.left, *n.comparators]):
                found.append(f"{p.relative_to(src)}:{n.lineno}: {ast.unparse(n)}")
            if (isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "get" and len(n.args) == 2
                    and isinstance(n.args[1], ast.Constant) and n.args[1].value in names):
                found.append(f"{p.relative_to(src)}:{n.lineno}: {ast.unparse(n)}")
    assert not found, found
    assert len(files) > 20  # the scan sees the packages it claims to
