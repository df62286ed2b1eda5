"""Scan Overdrive's own source with an AST finder: the tests that keep one thing in one package
("only checkpoint/ reads a checkpoint", "only measure/ starts a worker") share this."""

from __future__ import annotations

import ast
import pathlib
from collections.abc import Callable

import overdrive

SRC = pathlib.Path(overdrive.__file__).parent


def scan(find: Callable[[ast.AST], list[str]], *, inside: str) -> tuple[dict[str, list[str]], set[str]]:
    """(what `find` reports in each module outside the package `inside`, everything it reports in that
    package): a test asserts the first is empty, and that the second holds what the package itself does,
    so the scan is shown to be able to fail."""
    outside: dict[str, list[str]] = {}
    own: set[str] = set()
    for p in sorted(SRC.rglob("*.py")):
        rel = p.relative_to(SRC).as_posix()
        hits = find(ast.parse(p.read_text(), filename=rel))
        if rel.startswith(f"{inside}/"):
            own.update(hits)
        elif hits:
            outside[rel] = hits
    return outside, own
