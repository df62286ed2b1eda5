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
