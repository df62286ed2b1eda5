"""The README, then the guides in docs/ it links, walked top to bottom as a new user would: every fence
is tagged, every command and snippet runs in order in one working folder, and what it prints matches
what the page shows. A page of docs/ that shows a command must be in `PAGES`, so none is skipped.

Fence tags: `bash` (commands, one per line, run in order), `python` (a snippet, run as a script;
`python FILE ARGS` saves it as FILE and runs it with ARGS; a `# "..."` comment after a print is the
line it must print, numbers aside), `text CMD` (what the command CMD shown in a page prints, or
`text python FILE`: what the snippet saved as FILE prints; a table's columns, else the `label:` and
`key=` names of its lines, are compared with the real output's), `toml` (a config shown, not run).
An untagged fence fails the walk, so nothing is skipped silently.

To fit CI time a few commands run in their CPU-sized form (`INSTEAD`: the `--quick` variant, a
smaller budget), and the few that cannot run on a CPU test machine say why. The files a user is
assumed to have (`my.txt`, `day_0.tsv`, ...) are made first (`USER_FILES`). Every table entry
must name a line of a walked page, so the tables cannot go stale.
"""

from __future__ import annotations

import json
import os
import pathlib
import random
import re
import shlex
import shutil
import subprocess
import sys
import time

import pytest

from pages import PAGES, README, ROOT

TAGS = {"bash", "python", "text", "toml"}
QUICK = "--quick --rounds 1 --no-micro"  # one timed round: the same code paths, a fraction of the time

# A page's command (comment stripped) -> (what the walk runs instead, or None to leave it out; why).
INSTEAD: dict[str, tuple[str | None, str]] = {
    "make demo": (f"overdrive bench {QUICK} --out out/bench", "what `make demo` runs, in its quick form"),
    "make doctor": ("overdrive doctor", "what `make doctor` runs (the venv is this test's Python)"),
    "make test-fast": ("make -n test-fast", "the walk is part of the suite: check the target only"),
    "make test": ("make -n test", "the walk is part of the suite: check the target only"),
    "make test-all": ("make -n test-all", "the walk is part of the suite: check the target only"),
    ". .venv/bin/activate": (None, "shell state: the walk runs the installed package's Python directly"),
    'make run ARGS="plan --model llama3-8b --gpu h200"': ("overdrive plan --model llama3-8b --gpu h200",
                                                         "what `make run` runs"),
    "overdrive bench": (None, "the default suite takes minutes; its --quick form runs as `make demo`"),
    "overdrive bench --quick": (f"overdrive bench {QUICK}", "one timed round"),
    "overdrive bench --data my.txt": (f"overdrive bench {QUICK} --data my.txt", "quick form"),
    "overdrive bench --configs bf16,fp8-rowwise --out out/b2": (f"overdrive bench {QUICK} --configs "
                                                               "bf16,fp8-rowwise --out out/b2", "quick form"),
    "overdrive bench --workload recsys --data day_0.tsv": ("overdrive bench --workload recsys --quick --data day_0.tsv",
                                                           "quick form"),
    "overdrive bench --workload inference --slo-ms 5": ("overdrive bench --workload inference --quick --slo-ms 5",
                                                        "quick form (no torch.compile)"),
    "torchrun --nproc_per_node=8 -m overdrive train examples/gpu-1b.toml": (None, "needs 8 GPUs"),
    "overdrive train examples/tiny.toml --set train.recipe=amp-bf16 --set train.steps=300": (
        "overdrive train examples/tiny.toml --set train.recipe=amp-bf16 --set train.steps=20",
        "bf16 runs ~70x slower than fp32 on an AVX2-only CPU (a second run: it gets its own folder)"),
    "overdrive tune --model models.py:make_model --batch models.py:batch --loss-fn models.py:loss --budget-s 300 "
    "--out tuned/": (
        "overdrive tune --model models.py:make_model --batch models.py:batch --loss-fn models.py:loss --budget-s 40 "
        "--out tuned/", "a smaller budget"),
    "overdrive tune --model path/to/config.json --budget-s 300": ("overdrive tune --model path/to/config.json "
                                                                  "--budget-s 40", "a smaller budget"),
    "pip install -e '.[torchao]'": (None, "downloads packages"),
    "pip install -e '.[liger]'": (None, "downloads packages"),
    "pip install -e '.[te]'": (None, "downloads packages"),
    "pip install -e '.[hf]'": (None, "downloads packages"),
    "pip install -e '.[triton]'": (None, "downloads packages"),
    "overdrive serve out/ranker --port 8000": (None, "serves in the foreground until stopped; "
                                               "tests/integration/test_triton_server.py starts and stops it"),
    "overdrive bench --workload inference --server triton --slo-ms 5 --out out/triton-bench": (
        None, "minutes of rate search; tests/integration/test_triton_server.py runs it on a small model"),
    "overdrive bench --workload inference --model ranker.py:make_ranker --inputs ranker.py:example --dynamic ids:1 "
    "--slo-ms 5 --out out/ranker-bench": (
        "overdrive bench --workload inference --suite inference-quick --model ranker.py:make_ranker --inputs "
        "ranker.py:example --dynamic ids:1 --slo-ms 5 --out out/ranker-bench", "quick form (no torch.compile)"),
    "overdrive bench --workload inference --suite inference-serving --slo-ms 5": (
        None, "its request-stream part runs in the --quick form above (the full one takes minutes)"),
}


def _criteo_tsv() -> str:
    """1,000 Criteo-format lines (label, 13 integers, 26 hex ids), two with a bad label."""
    rng, lines = random.Random(0), []
    for i in range(1000):
        label = "2" if i in (10, 500) else str(rng.randint(0, 1))
        ints = [str(rng.randint(0, 50)) if rng.random() > 0.1 else "" for _ in range(13)]
        ids = [f"{rng.getrandbits(32):08x}" if rng.random() > 0.05 else "" for _ in range(26)]
        lines.append("\t".join([label, *ints, *ids]))
    return "\n".join(lines) + "\n"


MODELS_PY = '''import torch

def make_model():
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 8))

def batch(step):
    g = torch.Generator().manual_seed(step)
    return torch.randn(16, 32, generator=g), torch.randint(0, 8, (16,), generator=g)

def loss(model, batch):
    x, y = batch
    return torch.nn.functional.cross_entropy(model(x), y)
'''
RANKER_PY = '''import torch

class Ranker(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb, self.lin = torch.nn.Embedding(1000, 16), torch.nn.Linear(16 + 8, 1)

    def forward(self, dense, ids):
        return torch.sigmoid(self.lin(torch.cat([dense, self.emb(ids).sum(1)], 1)))

def make_ranker():
    return Ranker()

def example(batch):
    g = torch.Generator().manual_seed(batch)
    return torch.randn(batch, 8, generator=g), torch.randint(0, 1000, (batch, 5), generator=g)
'''
LLAMA_CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
                "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 128}

# A file the pages' commands assume the user has -> its content.
USER_FILES = {
    "my.txt": lambda: README.read_text() * 4,
    "day_0.tsv": _criteo_tsv,
    "path/to/config.json": lambda: json.dumps(LLAMA_CONFIG),
    "models.py": lambda: MODELS_PY,
    "ranker.py": lambda: RANKER_PY,
}


def fences(text: str) -> list[tuple[str, str, int]]:
    """(info string, body, line number) of every fenced block, in order."""
    out, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        m = re.match(r"^```(.*)$", lines[i])
        if m:
            start, body = i + 1, []
            i += 1
            while i < len(lines) and not lines[i].startswith("```"):
                body.append(lines[i])
                i += 1
            out.append((m.group(1).strip(), "\n".join(body) + "\n", start))
        i += 1
    return out


def commands(body: str) -> list[str]:
    """The commands of a bash fence: one per line, a trailing `  # comment` removed."""
    out = []
    for line in body.splitlines():
        line = re.sub(r"\s+#\s.*$", "", line).strip()
        if line and not line.startswith("#"):
            out.append(line)
    return out


def _name(page: pathlib.Path) -> str:
    return str(page.relative_to(ROOT))


def _all_fences() -> list[tuple[str, str, str]]:
    """(info string, body, "page:line") of every fence of every walked page, in walk order."""
    return [(info, body, f"{_name(page)}:{ln}") for page in PAGES for info, body, ln in fences(page.read_text())]


def _bash_commands() -> list[str]:
    return [c for info, body, _ in _all_fences() if info == "bash" for c in commands(body)]


def _snippet_name(info: str, where: str) -> str:
    """The file a python fence is saved as: its own name, or one made from where it stands."""
    words = info.split()[1:]
    return words[0] if words else "snippet_" + re.sub(r"\W", "_", where) + ".py"


def test_every_fence_is_tagged():
    found = _all_fences()
    untagged = [where for info, _, where in found if not info]
    assert not untagged, f"untagged fences (the walk would skip them): {untagged}"
    unknown = [f"{where} ({info})" for info, _, where in found if info.split()[0] not in TAGS]
    assert not unknown, f"fence tags the walk does not know: {unknown}; use one of {sorted(TAGS)}"
    shown = set(_bash_commands()) | {f"python {_snippet_name(i, w)}" for i, _, w in found if i.split()[0] == "python"}
    for info, _, where in found:
        if info.split()[0] == "text":
            assert info[4:].strip() in shown, f"{where}: `{info}` must name a command or snippet the pages show"


def test_every_page_that_shows_a_command_is_walked():
    docs = sorted((ROOT / "docs").glob("*.md"))
    unwalked = [_name(p) for p in docs if p not in PAGES and any(
        info.split()[0] in ("bash", "python") for info, _, _ in fences(p.read_text()) if info)]
    assert not unwalked, f"pages of docs/ that show commands the walk never runs (add them to PAGES): {unwalked}"
    assert all(p.is_file() for p in PAGES), [_name(p) for p in PAGES if not p.is_file()]


def test_the_walk_never_runs_the_suite_it_is_part_of():
    # `make test*` runs pytest, which would run this walk again: each must be checked, not run.
    recursive = [c for c in _bash_commands() if re.match(r"make test\b", c) and INSTEAD.get(c, (c,))[0] == c]
    assert not recursive, f"README commands the walk would run recursively (add them to INSTEAD): {recursive}"


def test_the_walk_tables_name_readme_lines():
    text, cmds = "".join(p.read_text() for p in PAGES), set(_bash_commands())
    stale = [c for c in INSTEAD if c not in cmds]
    assert not stale, f"the walk's INSTEAD table names commands the pages no longer have: {stale}"
    unused = [f for f in USER_FILES if f not in text]
    assert not unused, f"USER_FILES the pages never mention: {unused}"


def _header(text: str) -> list[str]:
    """A printed table's column names: rich's boxed header (a name may wrap over several ┃ lines,
    joined here), else the first line, split on runs of 2+ spaces."""
    lines, rows = text.splitlines(), []
    start = next((i for i, ln in enumerate(lines) if ln.strip().startswith("┃")), None)
    for ln in lines[start:] if start is not None else []:  # the first table's header only
        if not ln.strip().startswith("┃"):
            break
        rows.append(ln.strip().strip("┃").split("┃"))
    if rows:
        cols = [" ".join(r[i].strip() for r in rows if i < len(r)).strip() for i in range(len(rows[0]))]
        return [" ".join(c.split()) for c in cols if c]
    first = next((ln for ln in text.splitlines() if ln.strip()), "")
    return [c.strip() for c in re.split(r"\s{2,}|[│|]", first) if c.strip()]


LABEL = re.compile(r"^\s*([A-Za-z][\w .+/()'-]{0,40}?):\s|\b([a-z_]+)=", re.M)


def _labels(text: str) -> set[str]:
    """The names an untabled output's lines carry: `  precision: ...` and `loss=3.2 lr=...`."""
    return {a or b for a, b in LABEL.findall(text)}


def _like(line: str) -> re.Pattern:
    """A printed line, numbers aside; `…` stands for what the page trimmed."""
    num = r"\d+(?:[.,]\d+)*"
    parts = [num.join(re.escape(bit) for bit in re.split(num, piece.strip())) for piece in line.split("…")]
    return re.compile(".*?".join(parts))


def _compare_sample(sample: str, out: str) -> list[str]:
    """The sample's header columns must be the real output's (the figures are the sample's machine's).
    An output without a boxed table, line by line: a line that carries names (`label: ...`, `key=...`)
    must have its names printed; any other line must be printed as shown, numbers and `…` aside."""
    if any(ln.strip().startswith("┃") for ln in sample.splitlines()) or not _labels(sample):
        real = _header(out)
        cols = _header(sample)
        if len(cols) > 1 or any(ln.strip().startswith("┃") for ln in sample.splitlines()):
            return [f"column {col!r} of the page's sample is not in the output (it has {real})"
                    for col in cols if col not in real]
    problems, real_names = [], _labels(out)
    lines = [ln for ln in sample.splitlines() if ln.strip() and ln.strip() != "…"]
    for ln in lines:
        names = _labels(ln)
        if names:
            problems += [f"{name!r} of the page's sample is not in the output (it has {sorted(real_names)})"
                         for name in sorted(names - real_names)]
        elif not _like(ln).search(out):
            problems.append(f"the page's sample line {ln.strip()!r} is not in the output")
    return problems or ([] if lines else ["the sample is empty: nothing to compare it with"])


def _compare_printed(snippet: str, out: str) -> list[str]:
    """`print(...)  # "expected"`: the expected line, numbers aside, is among the printed lines."""
    problems = []
    for expected in re.findall(r'print\(.*\)\s*#\s*"(.*)"', snippet):
        pattern = re.sub(r"\\d\+(?:\\,\\d\+)*", r"\\d+(?:,\\d+)*", re.sub(r"\d+", r"\\d+", re.escape(expected)))
        if not re.search(pattern, out):
            problems.append(f"printed nothing like {expected!r}")
    return problems


def _shell(cmd: str) -> str:
    """`overdrive ...` and `torchrun ...` as the installed package runs them (no activated venv here)."""
    py = shlex.quote(sys.executable)
    if cmd.startswith("overdrive "):
        return f"{py} -m overdrive {cmd[len('overdrive '):]}"
    if cmd.startswith("torchrun "):
        return f"{py} -m torch.distributed.run {cmd[len('torchrun '):]}"
    if cmd.startswith("make "):
        return f"make -C {shlex.quote(str(ROOT))} {cmd[len('make '):]}"
    return cmd


@pytest.mark.slow
def test_readme_walk(tmp_path):
    work = tmp_path / "walk"
    shutil.copytree(ROOT / "examples", work / "examples")
    for name, content in USER_FILES.items():
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        (work / name).write_text(content())
    env = dict(os.environ, PYTHONUNBUFFERED="1", COLUMNS="150", XDG_CACHE_HOME=str(tmp_path / "cache"))
    outputs: dict[str, str] = {}
    failures: list[str] = []

    def run(cmd: str, where: str) -> str:
        t0 = time.monotonic()
        cp = subprocess.run(cmd, shell=True, cwd=work, env=env, capture_output=True, text=True, timeout=900)
        print(f"{where} {time.monotonic() - t0:6.1f} s  {cmd}")  # shown with -s: what each README step costs
        out = cp.stdout + cp.stderr
        if cp.returncode != 0:
            failures.append(f"{where} `{cmd}` exited {cp.returncode}:\n{out[-3000:]}")
        elif "Traceback" in out:
            failures.append(f"{where} `{cmd}` printed a traceback:\n{out[-3000:]}")
        return out

    for info, body, where in _all_fences():
        kind = info.split()[0]
        if kind == "python":
            name, args = _snippet_name(info, where), info.split()[2:]
            (work / name).write_text(body)
            out = outputs[f"python {name}"] = run(shlex.join([sys.executable, name, *args]), where)
            failures += [f"{where}: {p}" for p in _compare_printed(body, out)]
        elif kind == "bash":
            for cmd in commands(body):
                real = INSTEAD.get(cmd, (cmd, ""))[0]
                if real is not None:
                    outputs[cmd] = run(_shell(real), where)
        elif kind == "text":
            cmd = info[4:].strip()
            if cmd in outputs:
                failures += [f"{where} (`{cmd}`): {p}" for p in _compare_sample(body, outputs[cmd])]
    assert not failures, "\n\n".join(failures)


def test_sample_header_is_read_whether_rich_wraps_it_or_not():
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    t = Table()
    for col in ("config", "step ms (median [p10–p90])", "speedup vs baseline"):
        t.add_column(escape(col))
    t.add_row("baseline", "1.0", "1.00x")
    narrow, wide = Console(width=40, record=True), Console(width=200, record=True)
    narrow.print(t), wide.print(t)
    cols = ["config", "step ms (median [p10–p90])", "speedup vs baseline"]
    printed = wide.export_text()
    assert _header(narrow.export_text()) == _header(printed) == cols
    assert _header("config  step ms (median [p10–p90])  speedup vs baseline\nbaseline  1.0  1.00x") == cols
    assert _compare_sample("config  safe\n", printed) == [
        f"column 'safe' of the page's sample is not in the output (it has {cols})"]


def test_an_untabled_sample_is_compared_by_its_labels():
    report = "Overdrive recipe 'auto' on cpu: precision fp32\n  compile: off  — eager\n  precision: fp32  — no bf16\n"
    assert _compare_sample("  precision: bf16  — trimmed\n", report) == []
    assert _compare_sample("  norm: torch\n", report) == [
        "'norm' of the page's sample is not in the output (it has [\"Overdrive recipe 'auto' on cpu\", 'compile', "
        "'precision'])"]
    train = "step=25 loss=3.201 lr=0.002934 step_ms=2096\n"
    assert _compare_sample("step=150 loss=2.1 lr=0.0003\n", train) == []
    assert _compare_sample("step=150 val_loss=2.1\n", train) == [
        "'val_loss' of the page's sample is not in the output (it has ['loss', 'lr', 'step', 'step_ms'])"]
    assert _compare_sample("wrote 3 files\n", "wrote 12 files\n") == []
    assert _compare_sample("wrote 3 files\n", train) == ["the page's sample line 'wrote 3 files' is not in the output"]
    assert _compare_sample("wrote a.pt2, … c.onnx\n", "wrote a.pt2, b.onnx, c.onnx\n") == []
    assert _compare_sample("wrote a.pt2, … d.onnx\n", "wrote a.pt2, b.onnx, c.onnx\n") == [
        "the page's sample line 'wrote a.pt2, … d.onnx' is not in the output"]
