"""The figures the README and docs/ quote come from committed files, not from memory.

- The `make demo` sample, in docs/records.md and trimmed in the README: its caption names a committed run
  folder (results.json written by the bench, sample.json by scripts/record_sample.py); every number in
  the page's table must be in the table the project's own renderer draws from that results.json, the
  caption's machine, CPU kind, load, wall time and date must be sample.json's, and every decimal figure
  the paragraph after it reads must be the run's (records.md: its intervals and the doctor's matmul
  rates; its time table's `make demo` row gives the sample's wall time, load and folder).
- The "Three kinds of CPU" table in docs/cpu-kinds.md: every figure in a row must be in
  docs/cpu-kinds.json under that kind.
Each check is also run on a tampered page, so it is known to fail when a figure drifts.
"""

from __future__ import annotations

import io
import json
import pathlib
import re

from rich.console import Console

ROOT = pathlib.Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
RECORDS = ROOT / "docs" / "records.md"
KINDS = ROOT / "docs" / "cpu-kinds.md"
NUM = re.compile(r"\d+(?:[.,]\d+)*")


def _sample(text: str) -> tuple[str, str]:
    """(caption paragraph, table block) of a page's ```text make demo sample."""
    start = text.index("```text make demo\n")
    block = text[start + len("```text make demo\n"):text.index("```", start + 10)]
    caption = text[:start].rstrip().rsplit("\n\n", 1)[-1]
    return caption, block


def _commentary(text: str) -> str:
    """The paragraph right after the sample, which reads its figures."""
    end = text.index("```", text.index("```text make demo\n") + 10) + 3
    return text[end:].strip().split("\n\n", 1)[0]


def _run_folder(caption: str) -> pathlib.Path:
    m = re.search(r"`(benchmarks/results/cpu/[^`]+?)/?`", caption)
    assert m, "the sample's caption must name its committed run folder (`benchmarks/results/cpu/...`)"
    return ROOT / m.group(1)


def _rendered(results: dict, width: int) -> str:
    from overdrive.report.tables import render_bench

    buf = io.StringIO()
    render_bench(results, Console(file=buf, width=width, color_system=None, force_terminal=False))
    return buf.getvalue()


def _trimmed_sample_problems(text: str, decimals: bool = True) -> tuple[list[str], dict, dict, str, str]:
    """What every page's sample must hold: (problems, results, sample.json, wall, load). decimals: every
    decimal figure of the paragraph after the sample is the run's (records.md's also quotes another run)."""
    caption, block = _sample(text)
    folder = _run_folder(caption)
    if not (folder / "results.json").is_file() or not (folder / "sample.json").is_file():
        return [f"{folder.relative_to(ROOT)} lacks results.json or sample.json"], {}, {}, "", ""
    results = json.loads((folder / "results.json").read_text())
    rec = json.loads((folder / "sample.json").read_text())
    problems = []
    real = set(NUM.findall(_rendered(results, max(len(ln) for ln in block.splitlines()))))
    missing = sorted(set(NUM.findall(block)) - real, key=lambda s: (len(s), s))
    if missing:
        problems.append(f"numbers in the page's sample that its results.json does not give: {missing[:12]}")
    rendered = set(NUM.findall(_rendered(results, 150)))
    drifted = [n for n in NUM.findall(_commentary(text)) if decimals and "." in n and n not in rendered]
    if drifted:
        problems.append(f"the commentary's figures {drifted} are not in the sample's results.json")
    wall = f"{int(rec['wall_s'] // 60)} min {round(rec['wall_s'] % 60)} s"
    load = f"load {rec['load_1min']['min']:.0f}-{rec['load_1min']['max']:.0f}"
    flags = results["env"]["platform"]["cpu"]["flags"]
    kind = "AMX" if flags.get("amx_bf16") else "AVX-512 bf16" if flags.get("avx512_bf16") else "AVX2 only"
    for what, want in (("wall time", wall), ("load", load), ("date", rec["started"][:10]), ("CPU kind", kind),
                       ("CPU kind (sample.json)", rec["cpu_kind"]), ("cores", f"{rec['cores']}-core")):
        if want not in caption:
            problems.append(f"the sample's caption does not give its {what} as recorded: {want!r}")
    return problems, results, rec, wall, load


def sample_problems(text: str) -> list[str]:
    """docs/records.md: the whole sample, its commentary and the time table's row."""
    problems, results, _, wall, load = _trimmed_sample_problems(text, decimals=False)
    if not results:
        return problems
    folder = _run_folder(_sample(text)[0])
    rendered = _rendered(results, 150)
    for fig in re.findall(r"\d+\.\d+x \[\d+\.\d+-\d+\.\d+\]", _commentary(text)):
        if fig.replace("-", "–") not in rendered:
            problems.append(f"the commentary's {fig} is not in the sample's results.json")
    cpu = results["env"]["platform"]["cpu"]["matmul_gflops"]
    rates = f"{cpu['bf16']:.0f} vs {cpu['fp32']:.0f} GFLOP/s"
    if rates not in _commentary(text):
        problems.append(f"the commentary does not quote the doctor's matmul rates of that run ({rates})")
    demo_row = next(ln for ln in text.splitlines() if ln.startswith("| `make demo` |"))
    if f"{wall} at {load}" not in demo_row or str(folder.relative_to(ROOT)) not in demo_row:
        problems.append(f"the time table's `make demo` row does not give the sample's {wall} at {load} and its folder")
    return problems


def _kinds_rows(text: str) -> dict[str, str]:
    part = text[text.index("**Three kinds of CPU.**"):]
    part = part[:part.index("\n\n", part.index("| kind |"))]
    return {r.split("|")[1].strip(): r for r in part.splitlines() if r.startswith("| ") and "---" not in r
            and not r.startswith("| kind ")}


def kinds_problems(text: str) -> list[str]:
    kinds = json.loads((ROOT / "docs" / "cpu-kinds.json").read_text())["kinds"]
    rows, problems = _kinds_rows(text), []
    if sorted(rows) != sorted(kinds):
        problems.append(f"docs/cpu-kinds.md's CPU kinds {sorted(rows)} are not docs/cpu-kinds.json's {sorted(kinds)}")
    for kind, row in rows.items():
        source = json.dumps(kinds.get(kind, {}))
        have = set(NUM.findall(source)) | {n.replace("-", "") for n in NUM.findall(source)}
        missing = [n for n in NUM.findall(row.replace("-", " ")) if n not in have and n not in ("512",)]
        if missing:
            problems.append(f"{kind}: figures not in docs/cpu-kinds.json: {missing}")
        if f"`auto` picks {kinds.get(kind, {}).get('auto')}" not in row:
            problems.append(f"{kind}: the row's `auto` is not docs/cpu-kinds.json's")
    return problems


def test_the_sample_table_and_caption_are_the_committed_runs():
    assert sample_problems(RECORDS.read_text()) == []


def test_the_readmes_trimmed_sample_is_the_same_committed_run():
    text = README.read_text()
    assert _run_folder(_sample(text)[0]) == _run_folder(_sample(RECORDS.read_text())[0])
    assert _trimmed_sample_problems(text)[0] == []


def test_the_cpu_kinds_table_quotes_docs_cpu_kinds_json():
    assert kinds_problems(KINDS.read_text()) == []


def _tamper_first_number(block: str) -> str:
    m = re.search(r"│ baseline\s+│ \w+\s+│ (\d+\.\d)", block)
    assert m, "the sample has a baseline row"
    return block[:m.start(1)] + "9" + block[m.start(1):]


def test_the_checks_fail_when_a_figure_drifts():
    text = RECORDS.read_text()
    caption, block = _sample(text)
    drifted = text.replace(block, _tamper_first_number(block))
    assert any("does not give" in p for p in sample_problems(drifted))
    wall = re.search(r"\d+ min \d+ s", caption).group(0)
    assert any("wall time" in p for p in sample_problems(text.replace(caption, caption.replace(wall, "1 min 2 s"))))
    comm = _commentary(text)
    fig = re.search(r"\d+\.\d+x \[\d+\.\d+-\d+\.\d+\]", comm).group(0)
    assert any("commentary" in p for p in sample_problems(text.replace(comm, comm.replace(fig, "9" + fig))))
    kinds = KINDS.read_text()
    row = _kinds_rows(kinds)["AVX2 only"]
    assert any("AVX2 only" in p for p in kinds_problems(kinds.replace(row, row.replace("93 GFLOP", "95 GFLOP"))))
    assert any("`auto`" in p for p in kinds_problems(kinds.replace(row, row.replace("picks fp32", "picks bf16"))))
    readme = README.read_text()
    caption, block = _sample(readme)
    assert any("does not give" in p for p in _trimmed_sample_problems(readme.replace(block, _tamper_first_number(block)))[0])
    assert any("load" in p for p in _trimmed_sample_problems(readme.replace(caption, caption.replace("load 0-5", "load 0-3")))[0])
    comm = _commentary(readme)
    fig = re.search(r"\d+\.\d+x", comm).group(0)
    assert any("commentary" in p for p in _trimmed_sample_problems(readme.replace(comm, comm.replace(fig, "9" + fig)))[0])


def test_record_sample_names_the_three_kinds_by_their_flags():
    import importlib.util

    spec = importlib.util.spec_from_file_location("record_sample", ROOT / "scripts" / "record_sample.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.cpu_kind({"avx2", "avx512f", "avx512_bf16", "amx_bf16"}) == "AMX"
    assert mod.cpu_kind({"avx2", "avx512f", "avx512_bf16"}) == "AVX-512 bf16"
    assert mod.cpu_kind({"avx2", "avx512f"}) == mod.cpu_kind({"avx2"}) == "AVX2 only"
