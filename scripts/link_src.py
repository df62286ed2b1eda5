"""Make `src/` importable in the running venv without building anything (the offline fallback of
`make demo TORCH=system`): a .pth file for the source tree and an `overdrive` script in bin/.

Run with the venv's own Python. Exits 2 naming any runtime dependency this Python cannot import
(install it into the system Python, or run online once).
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import sys
import sysconfig

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]
# Import names of the runtime dependencies whose distribution name differs from it.
_IMPORT_NAME = {"tomli": "tomli"}


def main() -> int:
    site = pathlib.Path(sysconfig.get_paths()["purelib"])
    (site / "overdrive-src.pth").write_text(str(ROOT / "src") + "\n")
    script = pathlib.Path(sys.prefix) / "bin" / "overdrive"
    script.write_text(f"#!{sys.executable}\nimport sys\nfrom overdrive.cli import main\nsys.exit(main())\n")
    script.chmod(0o755)
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    missing = []
    for dep in deps:
        if ";" in dep and "python_version < '3.11'" in dep and sys.version_info >= (3, 11):
            continue
        name = dep.split(";")[0].split("[")[0]
        for op in "<>=!~ ":
            name = name.split(op)[0]
        if importlib.util.find_spec(_IMPORT_NAME.get(name, name.replace("-", "_"))) is None:
            missing.append(name)
    print(f"linked {ROOT / 'src'} into {site} (no build: pip could not install it here)")
    if missing:
        print(f"missing runtime dependencies: {', '.join(missing)}: install them into {sys.base_prefix}'s Python "
              f"(pip install {' '.join(missing)}) or run once with a network", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
