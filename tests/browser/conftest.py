"""One headless Chromium per session; the pages of every report kind rendered from real small runs.

Without Chromium + Playwright every test here is skipped with one line saying what is missing
(`make test` installs both where it has apt and root). Adding a report kind is one PAGES line.
"""

from __future__ import annotations

import os
import shutil
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from kinds import PAGES  # noqa: E402
from runs import build  # noqa: E402


@pytest.fixture(scope="session")
def browser():
    from overdrive.report.browser import BrowserUnavailable, browser_missing, open_browser

    why = browser_missing()
    if why:
        pytest.skip(f"no headless browser: {why}")
    try:
        with open_browser() as ctx:
            yield ctx
    except BrowserUnavailable as e:
        pytest.skip(f"no headless browser: {e}")


@pytest.fixture(scope="session")
def run_dirs(browser):
    """All runs at once (they overlap on 2 cores better than one after another); cached across sessions."""
    return build(sorted({n for runs, _, _ in PAGES.values() for n in runs}))


@pytest.fixture(scope="session")
def rendered(run_dirs, tmp_path_factory):
    """kind -> a fresh page rendered by this session's report code, in a copy of the run's folder."""
    out = {}
    for kind, (runs, render, _) in PAGES.items():
        d = tmp_path_factory.mktemp(kind)
        shutil.copytree(run_dirs[runs[0]], d, dirs_exist_ok=True)
        out[kind] = (render(str(d), *(run_dirs[r] for r in runs[1:]), str(d)) if render
                     else os.path.join(str(d), "report.html"))
    return out
