"""Hostile pass on `overdrive export` (issue 41): the user's folder and files are never replaced or
written through, a failed export changes nothing, models that mix batch rows are refused whatever row
differs, and a file beside the user's model never shadows a library."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from overdrive.cli import main

MODELS = '''
import torch
from torch import nn


class Lin(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(4, 3)

    def forward(self, x):
        return self.lin(x)


class Mix(nn.Module):
    def __init__(self, how):
        super().__init__()
        self.how = how

    def forward(self, x):
        if self.how == "cumsum":
            return torch.cumsum(x, 0)
        if self.how == "first":  # row 0 is the same alone and in a batch: only later rows differ
            return x - x[:1]
        return x - x[-1:]


class Counter(nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return x * self.calls


CALLS = [0]


class LaterRaises(nn.Module):
    def forward(self, x):
        if not torch.compiler.is_compiling():  # export's own checks call it 9 times; the 10th raises
            CALLS[0] += 1
            if CALLS[0] > 9:
                raise RuntimeError("the cache is gone")
        return x * 2


def lin():
    return Lin()


def cumsum():
    return Mix("cumsum")


def first():
    return Mix("first")


def last():
    return Mix("last")


def counter():
    return Counter()


def later():
    return LaterRaises()


def ex(b):
    return torch.randn(b, 4)


def widening(b):
    return torch.randn(b, 2 * b)
'''


@pytest.fixture
def models(tmp_path):
    (tmp_path / "m.py").write_text(MODELS)
    return str(tmp_path / "m.py")


def _export(models, fn, out, *extra) -> list[str]:
    return ["export", f"{models}:{fn}", "--inputs", f"{models}:ex", "--no-onnx", "--max-batch", "16", "--out",
            str(out), *extra]


def _one_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("overdrive: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


# --- Critical 1: the user's files are never replaced, a link is never written through ----------------

def test_export_refuses_a_folder_of_the_users_own_files_and_never_writes_through_a_link(tmp_path, models, capsys):
    out = tmp_path / "out"
    (out / "triton" / "make").mkdir(parents=True)
    (out / "model.onnx").write_bytes(b"mine")
    (out / "export.json").write_text('{"mine": 1}')
    (out / "triton" / "make" / "config.pbtxt").write_text("mine")
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    os.symlink(victim, out / "model.pt2")
    assert main(_export(models, "lin", out)) == 2
    assert "holds files Overdrive did not write" in _one_line(capsys)
    assert victim.read_text() == "precious" and os.path.islink(out / "model.pt2")
    assert (out / "model.onnx").read_bytes() == b"mine" and (out / "export.json").read_text() == '{"mine": 1}'
    assert (out / "triton" / "make" / "config.pbtxt").read_text() == "mine"


def test_export_into_its_own_folder_refuses_a_planted_link_and_its_lock_is_never_followed(tmp_path, models, capsys):
    out = tmp_path / "out"
    assert main(_export(models, "lin", out)) == 0
    capsys.readouterr()
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    os.remove(out / "model.pt2")
    os.symlink(victim, out / "model.pt2")
    assert main(_export(models, "lin", out)) == 2
    assert "model.pt2 is a symbolic link" in _one_line(capsys) and victim.read_text() == "precious"
    # A lock file planted as a link (the folder looks empty otherwise): never truncated through.
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    os.symlink(victim, fresh / ".overdrive.lock")
    assert main(_export(models, "lin", fresh)) == 2
    _one_line(capsys)
    assert victim.read_text() == "precious"


def test_a_second_export_replaces_the_first_whole_and_a_failed_one_changes_nothing(tmp_path, models, capsys):
    out = tmp_path / "out"
    assert main(_export(models, "lin", out)) == 0
    before = {p: (out / p).read_bytes() for p in ("model.pt2", "export.json", "triton/lin/config.pbtxt")}
    assert json.loads(before["export.json"])["files"][0] == str(out / "model.pt2")  # not the staging folder
    # A model that raises on a later call: one line, and the first export untouched, no staging left.
    assert main(_export(models, "later", out)) == 2
    assert "when called again" in _one_line(capsys)
    assert {p: (out / p).read_bytes() for p in before} == before
    assert not [n for n in os.listdir(out) if n.startswith(".staging-")]
    assert not (out / "triton" / "later").exists()


def test_export_refuses_a_folder_a_running_tune_or_export_holds(tmp_path, models, capsys):
    from overdrive.measure.lock import claim_results_dir

    out = tmp_path / "out"
    with claim_results_dir(str(out), what="overdrive tune"):
        assert main(_export(models, "lin", out)) == 2
        assert "in use by another overdrive run (overdrive tune pid" in _one_line(capsys)
    assert not (out / "model.pt2").exists()


# --- Critical 7: every row against the request alone ------------------------------------------------

@pytest.mark.parametrize("fn", ["cumsum", "first", "last"])
def test_a_model_that_mixes_batch_rows_is_refused_whatever_row_differs(tmp_path, models, capsys, fn):
    assert main(_export(models, fn, tmp_path / "out")) == 2
    assert "answers a request differently alone than beside others" in _one_line(capsys)
    assert not (tmp_path / "out" / "model.pt2").exists()


def test_a_stateful_model_is_refused_as_stateful_not_as_batch_mixing(tmp_path, models, capsys):
    assert main(_export(models, "counter", tmp_path / "out")) == 2
    err = _one_line(capsys)
    assert "differently on two calls in a row" in err and "beside others" not in err


def test_inputs_whose_width_changes_with_the_batch_are_one_line(tmp_path, models, capsys):
    argv = _export(models, "lin", tmp_path / "out")
    argv[argv.index(f"{models}:ex")] = f"{models}:widening"
    assert main(argv) == 2
    assert "only the batch may change with the batch" in _one_line(capsys)


# --- Critical 8: a file beside the model never shadows a library --------------------------------------

def test_a_file_beside_the_model_never_shadows_a_library(tmp_path):
    (tmp_path / "onnx.py").write_text("open(__file__ + '.ran', 'w').write('ran')\n")
    (tmp_path / "helpers.py").write_text("WIDTH = 4\n")
    (tmp_path / "ranker.py").write_text("import helpers\n\ndef make():\n    return helpers.WIDTH\n")
    code = ("import sys\nfrom overdrive.tuning.workload import load_file_fn\n"
            f"assert load_file_fn({str(tmp_path / 'ranker.py:make')!r}, 'model factory')() == 4\n"
            "import onnx\nprint(onnx.__file__)\n"
            f"assert sys.path.index({str(tmp_path)!r}) == len(sys.path) - 1\n")
    cp = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/", timeout=120)
    assert cp.returncode == 0, cp.stderr
    assert not (tmp_path / "onnx.py.ran").exists() and "site-packages" in cp.stdout


# --- Major: a full disk, another model's folder in the repository ---------------------------------------

WIDE = "import torch\nfrom torch import nn\n\ndef make():\n    return nn.Linear(4, 20000)\n\n" \
       "def ex(b):\n    return torch.randn(b, 4)\n"


def test_a_full_disk_during_export_is_one_line_and_leaves_no_partial_model(tmp_path):
    (tmp_path / "wide.py").write_text(WIDE)
    out = tmp_path / "out"
    code = ("import resource, signal, sys\nsignal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
            "resource.setrlimit(resource.RLIMIT_FSIZE, (150_000, 150_000))  # model.pt2 needs ~330 kB\n"
            "from overdrive.cli import main\n"
            f"sys.exit(main(['export', '{tmp_path}/wide.py:make', '--inputs', '{tmp_path}/wide.py:ex', '--no-onnx', "
            f"'--max-batch', '16', '--out', '{out}']))\n")
    cp = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert cp.returncode == 2, (cp.returncode, cp.stderr[-2000:])
    assert cp.stderr.count("\n") == 1 and "File too large" in cp.stderr and "Traceback" not in cp.stderr
    assert sorted(os.listdir(out)) == []  # no model.pt2, no staging, no marker: the folder as it was


def test_another_models_folder_in_the_repository_is_neither_judged_nor_touched(tmp_path, models, capsys):
    out = tmp_path / "out"
    assert main(_export(models, "lin", out)) == 0
    other = out / "triton" / "other"
    other.mkdir()
    cfg = ('name: "other"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 0\n'
           "version_policy: { latest: { num_versions: 1 } }\n")
    (other / "config.pbtxt").write_text(cfg)
    assert main(_export(models, "lin", out)) == 0, capsys.readouterr().err
    assert (other / "config.pbtxt").read_text() == cfg and (out / "export.json").exists()


# --- Minor and Major: --slo-from results are untrusted ----------------------------------------------------

GOOD = {"max_batch_size": 64, "preferred_batch_size": [32, 64], "max_queue_delay_us": 500, "instances": 1,
        "kind": "KIND_CPU"}


def _slo(tmp_path, *, slo=5.0, rate=9000.0, threads=2):
    res = {"slo_ms": slo, "device": "cpu", "created": "now", "workloads": {}, "serving": {"threads": threads,
           "engines": {"onnxruntime": {"label": "ORT", "status": "ok", "best": {"rate": rate, "config": GOOD}}}}}
    (tmp_path / "results.json").write_text(json.dumps(res))
    return str(tmp_path)


@pytest.mark.parametrize("edit,says", [({"threads": 10 ** 9}, "threads 1000000000"), ({"threads": 0}, "threads 0"),
                                       ({"rate": float("nan")}, "rate of nan"), ({"slo": float("nan")}, "slo_ms nan"),
                                       ({"slo": -5}, "slo_ms -5")])
def test_slo_from_refuses_absurd_threads_nan_rates_and_slos(tmp_path, capsys, edit, says):
    d = _slo(tmp_path, **edit)
    assert main(["export", "--model", "recsys", "--slo-from", d, "--out", str(tmp_path / "o")]) == 2
    err = _one_line(capsys)
    assert err.startswith("overdrive: error: --slo-from") and says in err
    assert not (tmp_path / "o" / "triton").exists()


def test_a_deeply_nested_slo_from_is_one_line(tmp_path, capsys):
    (tmp_path / "results.json").write_text('{"slo_ms": ' + "[" * 100000 + "]" * 100000 + "}")
    assert main(["export", "--model", "recsys", "--slo-from", str(tmp_path), "--out", str(tmp_path / "o")]) == 2
    assert "nested too deeply" in _one_line(capsys)


def test_a_note_from_results_prints_without_its_terminal_escapes(tmp_path, capsys, monkeypatch):
    from overdrive.serve import export as ex

    note = "eager served it faster\x1b[2J\x1b]0;owned\x07"
    monkeypatch.setattr(ex, "batching_from", lambda *a, **k: dict(GOOD, source="measured\x1b[31m", note=note))
    monkeypatch.setattr(ex, "export_for_serving", lambda *a, **k: {
        "name": "m", "files": [], "checks": {}, "batching": k["batching"], "triton_check": []})
    assert main(["export", "--model", "recsys", "--slo-from", str(tmp_path), "--out", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out and "\\x1b[2J" in out
