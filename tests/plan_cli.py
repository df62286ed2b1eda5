"""`overdrive plan` run in-process as a user would, and the check that a refusal is one line (exit 2)."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

from overdrive.cli import main


def invoke(capsys, *a) -> SimpleNamespace:
    """`overdrive plan *a` in-process (a subprocess pays torch's import on every call): returncode,
    stdout, stderr; argparse's own refusals (SystemExit) included."""
    try:
        rc = main(["plan", *a])
    except SystemExit as e:
        rc = e.code
    out = capsys.readouterr()
    return SimpleNamespace(returncode=rc, stdout=out.out, stderr=out.err)


@pytest.fixture
def run(capsys):
    return lambda *a: invoke(capsys, *a)


def refused(cp, needle):
    assert cp.returncode == 2, (cp.returncode, cp.stderr, cp.stdout[:300])
    lines = cp.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("overdrive: error: "), cp.stderr
    assert re.search(needle, lines[0]), lines[0]
