"""`overdrive plan` run in-process as a user would, and the check that a refusal is one line (exit 2)."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

from overdrive.cli import main


@pytest.fixture
def run(capsys):
    def _run(*a):
        try:
            rc = main(["plan", *a])
        except SystemExit as e:
            rc = e.code
        out = capsys.readouterr()
        return SimpleNamespace(returncode=rc, stdout=out.out, stderr=out.err)
    return _run


def refused(cp, needle):
    assert cp.returncode == 2, (cp.returncode, cp.stderr, cp.stdout[:300])
    lines = cp.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("overdrive: error: "), cp.stderr
    assert re.search(needle, lines[0]), lines[0]
