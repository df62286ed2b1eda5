"""Outputs checked before the work, files written with the user's umask, untrusted JSON read
without tracebacks, and the one-line refusals of bad flags that reach them."""

import json
import os

import pytest
import torch

from overdrive.errors import UserError
from overdrive.io import check_writable, read_json, write_atomic


@pytest.mark.parametrize("mask,mode", [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600)])
def test_write_atomic_follows_the_umask(tmp_path, mask, mode):
    old = os.umask(mask)
    try:
        write_atomic(str(tmp_path / "results.json"), "{}")
    finally:
        os.umask(old)
    assert os.stat(tmp_path / "results.json").st_mode & 0o777 == mode


def test_check_writable_refuses_what_cannot_be_written(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(UserError, match="--out .* is a file"):
        check_writable(str(f), flag="--out")
    with pytest.raises(UserError, match="--out .* is not writable"):
        check_writable(str(f / "sub"), flag="--out")
    with pytest.raises(UserError, match="--export .* is a folder"):
        check_writable(str(tmp_path), flag="--export", kind="file")
    check_writable(str(tmp_path / "new" / "deeper"), flag="--out")  # created, and left empty
    assert os.listdir(tmp_path / "new" / "deeper") == []


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_check_writable_refuses_a_read_only_folder(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        with pytest.raises(UserError, match="not writable"):
            check_writable(str(ro / "out"), flag="--out")
    finally:
        ro.chmod(0o755)


SCHEMA = {"type": "object", "required": ["schema", "configs"],
          "properties": {"configs": {"type": "array", "items": {"type": "object", "required": ["name"]}}}}


def test_read_json_one_line_errors(tmp_path):
    p = tmp_path / "r.json"
    p.write_text("[" * 100_000 + "]" * 100_000)  # json.load raises RecursionError on this
    with pytest.raises(ValueError, match="nested too deeply"):
        read_json(str(p), schema=SCHEMA)
    p.write_text(json.dumps({"schema": "x", "configs": [{"nom": 1}]}))
    with pytest.raises(ValueError, match="at configs/0: 'name' is a required property") as e:
        read_json(str(p), schema=SCHEMA, what="result")
    assert "\n" not in str(e.value)
    p.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        read_json(str(p))
    with pytest.raises(FileNotFoundError):
        read_json(str(tmp_path / "nope.json"))
    with pytest.raises(ValueError, match="is a folder"):
        read_json(str(tmp_path))
    p.write_text(json.dumps({"schema": "x", "configs": []}))
    assert read_json(str(p), schema=SCHEMA) == {"schema": "x", "configs": []}


def test_report_refuses_results_with_missing_keys_or_deep_nesting(tmp_path, capsys):
    from overdrive.cli import main

    (tmp_path / "results.json").write_text(json.dumps({"schema": "overdrive.bench/1", "configs": []}))
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "not a valid overdrive bench result" in err and "device" in err and "Traceback" not in err
    deep = "[" * 50_000 + "]" * 50_000
    (tmp_path / "results.json").write_text('{"schema": "overdrive.bench/1", "env": ' + deep + "}")
    assert main(["report", str(tmp_path)]) == 2
    assert "nested too deeply" in capsys.readouterr().err


def test_bench_flags_refused_before_work(tmp_path, capsys):
    from overdrive.cli import main

    assert main(["bench", "--quick", "--rounds", "-1"]) == 2
    assert "--rounds must be >= 1" in capsys.readouterr().err
    (tmp_path / "f").write_text("x")
    assert main(["bench", "--quick", "--out", str(tmp_path / "f" / "out")]) == 2
    err = capsys.readouterr().err
    assert "--out" in err and "not writable" in err


def test_a_cpu_allocation_failure_is_classified_oom():
    from overdrive.measure.worker import classify as _classify

    try:
        torch.empty(1 << 60, dtype=torch.uint8)  # the CPU allocator's own failure, not a stand-in
    except RuntimeError as e:
        err = e
    assert _classify(err) == "oom"
    assert _classify(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")) == "oom"
    assert _classify(RuntimeError("injected backend failure (test)")) == "backend"


def test_read_json_refuses_a_fifo_and_an_oversized_file_in_one_line(tmp_path, monkeypatch):
    """The one bounded reader behind read_json (a plan.json or tuned recipe a user hands over): a FIFO
    is refused before it is opened (opening it would block), a file over the limit before it is read."""
    import overdrive.io as oio

    fifo = tmp_path / "plan.json"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match="not a regular file"):
        oio.read_json(str(fifo), what="plan result")
    big = tmp_path / "big.json"
    big.write_text("[" + "0," * 64 + "0]")
    monkeypatch.setattr(oio, "MAX_JSON_BYTES", 16)
    with pytest.raises(ValueError, match="too large"):
        oio.load_json_bounded(str(big), what="a plan result", limit=oio.MAX_JSON_BYTES)
    assert oio.load_json_bounded(str(big), what="a list") == [0] * 65  # under the default limit: read


def test_no_reader_opens_a_json_file_itself():
    """Every JSON file read from disk goes through io.load_json_bounded (regular file, size limit, one-line
    errors): a json.load(f) of its own would open a FIFO a user left in a results folder and block."""
    import ast
    import pathlib

    src = pathlib.Path(__file__).resolve().parents[2] / "src" / "overdrive"
    own = []
    for p in src.rglob("*.py"):
        if p.name == "io.py" and p.parent == src:
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            f = getattr(node, "func", None)
            if isinstance(f, ast.Attribute) and f.attr == "load" and getattr(f.value, "id", "") == "json":
                own.append(f"{p.relative_to(src)}:{node.lineno}")
    assert not own, f"json.load outside overdrive.io (use load_json_bounded): {own}"


def _returns_within(fn, seconds=10.0):
    import threading

    out = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - the test looks at what came back
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), "the reader blocked on a FIFO"
    return out


def test_a_fifo_in_place_of_a_json_file_never_blocks(tmp_path):
    """A FIFO where a results.json, a run's config.json, a checkpoint manifest, a recipe or an emit index
    should be: each reader answers (None, False or a one-line UserError) instead of blocking on open()."""
    from overdrive.checkpoint.manifest import MANIFEST, read_manifest
    from overdrive.emit import _our_index
    from overdrive.errors import UserError
    from overdrive.measure.lock import is_ours
    from overdrive.recipes import Recipe
    from overdrive.train.rundir import _run_id_of

    for name in ("results.json", "config.json", MANIFEST, "recipe.json", "emit.json"):
        os.mkfifo(tmp_path / name)
    assert _returns_within(lambda: is_ours(str(tmp_path))) == {"value": False}
    assert _returns_within(lambda: _run_id_of(str(tmp_path))) == {"value": None}
    assert _returns_within(lambda: read_manifest(str(tmp_path))) == {"value": None}
    for call in (lambda: Recipe.load(str(tmp_path / "recipe.json")), lambda: _our_index(str(tmp_path / "emit.json"))):
        err = _returns_within(call).get("error")
        assert isinstance(err, UserError) and "\n" not in str(err), err
