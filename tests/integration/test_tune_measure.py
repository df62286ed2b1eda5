"""tune on the measurement core, end to end: a loss never finite is refused (never "safe", never
cached), an unwritable --out fails before any work, and `overdrive report` renders a tune folder."""

import json
import os

import pytest

import overdrive
from overdrive.cli import main
import user_models

USER_CODE = user_models.TUNE_MLP


@pytest.fixture
def user(tmp_path, monkeypatch):
    overdrive.get_env()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    (tmp_path / "m.py").write_text(USER_CODE)
    return str(tmp_path / "m.py")


def test_tune_out_unwritable_fails_before_any_work(user, tmp_path, capsys):
    ro = tmp_path / "ro"
    ro.mkdir()
    (ro / "theirs.txt").write_text("x")  # a folder that is not ours: refused at once
    rc = main(["tune", f"{user}:model", "--batch", f"{user}:batch", "--loss", f"{user}:loss", "--budget-s", "30",
               "--out", str(ro)])
    err = capsys.readouterr().err
    assert rc == 2 and "did not write" in err and (ro / "theirs.txt").read_text() == "x"
    assert not (tmp_path / "cache").exists()  # nothing measured, nothing cached


@pytest.mark.slow
def test_a_loss_never_finite_is_refused_not_safe(user, tmp_path, capsys):
    rc = main(["tune", f"{user}:model", "--batch", f"{user}:batch", "--loss", f"{user}:nan_loss", "--budget-s", "40",
               "--candidates", "fp32", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == 2 and "non-finite loss" in err
    assert not os.path.exists(tmp_path / "cache" / "overdrive" / "tuned")  # never cached as a winner


@pytest.mark.slow
def test_report_renders_a_tune_folder(user, tmp_path, capsys):
    out = tmp_path / "o"
    rc = main(["tune", f"{user}:model", "--batch", f"{user}:batch", "--loss", f"{user}:loss", "--budget-s", "40",
               "--candidates", "fp32", "--out", str(out)])
    assert rc == 0
    res = json.loads((out / "results.json").read_text())
    assert res["schema"] == "overdrive.tune/1" and res["threads"]["threads"] >= 1
    assert "noise" in res and res["candidates"][0]["safe"] is True
    os.remove(out / "report.html")
    capsys.readouterr()
    assert main(["report", str(out)]) == 0
    text = capsys.readouterr().out
    assert "overdrive tune" in text and "Measured:" in text and (out / "report.html").exists()
    # A second tune into the same folder while it is held: refused in one line.
    from overdrive.measure.lock import claim_results_dir

    with claim_results_dir(str(out)):
        rc = main(["tune", f"{user}:model", "--batch", f"{user}:batch", "--budget-s", "30", "--out", str(out)])
    assert rc == 2 and "in use by another overdrive run" in capsys.readouterr().err
