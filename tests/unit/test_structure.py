"""The code's shape, counted from the code itself (an AST scan of src/overdrive): no module over 400
lines, at most 10 functions over 60, no import cycle between modules (imports anywhere in a file count),
and the low-precision formats' names spelled only in `overdrive.formats` (plus at most three other files)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "overdrive"
MAX_LINES = 400
MAX_FUNCTION_LINES = 60
MAX_LONG_FUNCTIONS = 10


def _modules() -> dict[str, tuple[Path, ast.Module]]:
    out = {}
    for path in sorted(SRC.rglob("*.py")):
        parts = path.relative_to(SRC.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = (path, ast.parse(path.read_text(), filename=str(path)))
    return out


MODULES = _modules()


def _imports(name: str, path: Path, tree: ast.Module) -> set[str]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in MODULES)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                full = f"{target}.{alias.name}"
                if full in MODULES:
                    found.add(full)
                elif target in MODULES:
                    found.add(target)
    found.discard(name)
    return found


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index, low, stack, on_stack, out, counter = {}, {}, [], set(), [], [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter[0]
                    counter[0] += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        out.append(sorted(component))
    return out


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_is_over_400_lines():
    long = {str(p.relative_to(SRC)): n for p, _ in MODULES.values() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"split these by responsibility: {long}"


def test_at_most_ten_functions_are_over_60_lines():
    long = sorted(
        (node.end_lineno - node.lineno + 1, f"{path.relative_to(SRC)}:{node.name}")
        for path, tree in MODULES.values()
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    )
    assert len(long) <= MAX_LONG_FUNCTIONS, f"{len(long)} functions over {MAX_FUNCTION_LINES} lines: {long}"


def test_no_import_cycles():
    graph = {name: _imports(name, path, tree) for name, (path, tree) in MODULES.items()}
    assert _cycles(graph) == []


def test_format_names_live_in_the_formats_package():
    """A format's name (or a spelling of it) as a string in code outside `overdrive.formats` is a copy of
    format knowledge; at most three files may spell one (other stacks' vocabularies)."""
    from overdrive.formats import FORMATS

    bits = {f.bits for f in FORMATS.values()}  # "fp8", "fp4": a precision, not a format's name
    spelled = {s for f in FORMATS.values() for s in (f.name, f.preset, *f.aliases)} - bits
    files = {
        str(path.relative_to(SRC))
        for path, tree in MODULES.values()
        if "formats" not in path.relative_to(SRC).parts
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and node.value in spelled
    }
    assert len(files) <= 3, f"format names spelled outside overdrive.formats: {sorted(files)}"
