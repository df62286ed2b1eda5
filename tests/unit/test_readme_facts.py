"""README facts that go stale, in the README and every guide in docs/ it links: flags named under a command
that the command does not take, install lines written as if Overdrive were on a package index, test counts
that the suite outgrew."""

import argparse
import re
import shlex

from pages import PAGES, README

from overdrive.cli import build_parser


def _flags_of() -> dict[str, set[str]]:
    subs = build_parser()._subparsers._group_actions[0].choices  # noqa: SLF001 (argparse has no API)
    return {cmd: {o for a in sp._actions for o in a.option_strings if a.help is not argparse.SUPPRESS}  # noqa: SLF001
            for cmd, sp in subs.items()}


def _sections(text: str) -> list[tuple[str | None, str]]:
    """(the command a `## \\`overdrive CMD\\`` section is about, or None; its text)."""
    out = []
    for part in re.split(r"^## ", text, flags=re.M)[1:]:
        m = re.match(r"`overdrive (\w+)", part)
        out.append((m.group(1) if m else None, part))
    return out


def test_every_overdrive_command_line_uses_flags_that_command_takes():
    flags, text, bad = _flags_of(), "\n".join(p.read_text() for p in PAGES), []
    for line in re.findall(r"(?:^|`|ARGS=\")overdrive ([a-z]+(?: [^`\n#\"]*)?)", text, flags=re.M):
        words = shlex.split(line.replace("\\", " "), posix=True) if line.count("'") % 2 == 0 else line.split()
        cmd = words[0]
        if cmd not in flags:
            continue
        bad += [f"overdrive {cmd} {w}" for w in words[1:] if w.startswith("--") and w.split("=")[0] not in flags[cmd]]
    assert not bad, f"README names flags these commands do not take (or only as old spellings): {bad}"


def test_a_commands_section_names_only_its_own_flags_or_says_whose():
    """A bare `--flag` in `overdrive tune`'s section is read as a tune flag (`--reprobe-fused` was a
    benchmark script's): name the program in the same code span when it is another's."""
    flags, bad = _flags_of(), []
    every = set().union(*flags.values())
    for cmd, part in (s for p in PAGES for s in _sections(p.read_text())):
        if cmd not in flags:
            continue
        for span in re.findall(r"`(--[a-z][\w-]*)[^`]*`", part):
            if span not in flags[cmd] and span not in every:
                bad.append(f"{cmd}: {span}")
    assert not bad, bad


def test_install_lines_install_from_the_clone_and_no_test_count_is_stated():
    text = "\n".join(p.read_text() for p in PAGES)
    assert "pip install 'overdrive[" not in text and 'pip install "overdrive[' not in text  # not on an index
    quick = README.read_text().split("## Quick start", 1)[1].split("\n## ", 1)[0]
    assert not re.search(r"\b\d+ (?:tests|passed)\b", quick), "a test count in the Quick start goes stale at once"
