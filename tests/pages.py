"""The pages a user reads, in the order the README walk runs them: the README, then the guides in docs/
it links. The walk (tests/integration/test_readme.py) runs every command they show; the README fact
checks (tests/unit/test_readme_facts.py) hold every one of them to the flags each command takes."""

import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
# In walk order, in one working folder: a page may use what an earlier one made (docs/bench.md's
# `overdrive report out/bench` reads the README's `make demo`).
PAGES = [README] + [ROOT / "docs" / f"{name}.md" for name in (
    "cli", "accelerate", "tune", "stacks", "bench", "serving", "train", "plan", "doctor", "developers",
    "records", "cpu-kinds")]
