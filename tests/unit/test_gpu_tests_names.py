"""The GPU tests run only where a GPU is lent (scripts/gpu_check.sh, 15 minutes a lease): a name they use that
does not exist would fail there, on every GPU, for no defect of the GPU paths. Every `overdrive.NAME` they read
and every `from overdrive... import NAME` / `from fakes import NAME` they do is checked here, on CPU."""

import ast
import importlib
from pathlib import Path

import pytest

GPU_TESTS = sorted((Path(__file__).parents[1] / "gpu").glob("test_*.py"))
OURS = ("overdrive", "fakes", "fake_engines")


def _names(path: Path) -> list[tuple[int, str, str]]:
    """(line, module, name) for each name the file takes from Overdrive or the fakes."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] in OURS:
            out += [(node.lineno, node.module, a.name) for a in node.names]
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "overdrive":
            out.append((node.lineno, "overdrive", node.attr))
    return out


def _missing(module: str, name: str) -> bool:
    mod = importlib.import_module(module)
    if hasattr(mod, name):
        return False
    try:  # a submodule, imported by name
        importlib.import_module(f"{module}.{name}")
        return False
    except ImportError:
        return True


@pytest.mark.parametrize("path", GPU_TESTS, ids=lambda p: p.name)
def test_every_name_a_gpu_test_takes_from_overdrive_exists(path):
    names = _names(path)
    assert names, f"{path.name}: no Overdrive name found (the scan is broken)"
    bad = [f"{path.name}:{line} {module}.{name}" for line, module, name in names if _missing(module, name)]
    assert not bad, "names the GPU tests use that do not exist: " + ", ".join(bad)


def test_the_scan_sees_a_missing_name(tmp_path):
    p = tmp_path / "test_x.py"
    p.write_text("import overdrive\nfrom overdrive.recipes import resolve\n"
                 "def test_a():\n    overdrive.no_such_name()\n    overdrive.resolve\n")
    assert [(ln, m, n) for ln, m, n in _names(p) if _missing(m, n)] == [(4, "overdrive", "no_such_name")]
