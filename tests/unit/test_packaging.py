"""What `pip install` ships: every package-data glob matches a file (a glob that matches nothing hides a
missing file), and the files the code loads at run time are covered."""

import glob
import pathlib
import sys

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_every_package_data_glob_matches_a_file():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())
    data = cfg["tool"]["setuptools"]["package-data"]
    for pkg, patterns in data.items():
        base = ROOT / "src" / pkg.replace(".", "/")
        for pattern in patterns:
            assert glob.glob(str(base / pattern)), f"package-data {pkg}: {pattern!r} matches nothing"
    assert "env/*.json" in data["overdrive"]  # the doctor's JSON schema (overdrive.env.env_schema)


def _shipped(rel: str, patterns: list[str]) -> bool:
    import fnmatch

    return any(fnmatch.fnmatch(rel, p) for p in patterns)


def test_every_data_file_the_package_reads_is_shipped():
    """Every non-Python file under src/overdrive (a schema, a catalog) is read at run time by something:
    each must match a package-data glob, or a wheel install lacks it (bench/results.schema.json did)."""
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = cfg["tool"]["setuptools"]["package-data"]["overdrive"]
    base = ROOT / "src" / "overdrive"
    data = [p.relative_to(base).as_posix() for p in base.rglob("*")
            if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts]
    assert "results/results.schema.json" in data  # the file the old globs missed: the scan sees it
    missing = [d for d in data if not _shipped(d, patterns)]
    assert not missing, f"not in [tool.setuptools.package-data]: {missing}"
    assert not _shipped("results/results.schema.json", ["env/*.json", "plan/*.json"])  # the check can fail
