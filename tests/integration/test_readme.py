"""The README's Python examples run as printed."""

import pathlib
import re
import subprocess
import sys

import pytest

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


@pytest.mark.slow
def test_readme_python_examples_run(tmp_path):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "README has no Python example"
    for i, code in enumerate(blocks):
        f = tmp_path / f"example_{i}.py"
        f.write_text(code)
        cp = subprocess.run([sys.executable, str(f)], capture_output=True, text=True, timeout=300)
        assert cp.returncode == 0, f"README example {i} failed:\n{cp.stderr[-2000:]}"
