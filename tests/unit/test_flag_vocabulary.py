"""One flag vocabulary: every command's parser, read as a user meets it, against the table in
overdrive/commands/vocabulary.py and its copy in docs/cli.md (which the README links)."""

import argparse
import os
import re

import pytest

from overdrive.cli import build_parser
from overdrive.commands.vocabulary import DEPRECATED, FLAGS

CLI_DOC = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "cli.md")
SKIP = {"--help", "--verbose"}


def _parsers() -> dict[str, argparse.ArgumentParser]:
    return dict(build_parser()._subparsers._group_actions[0].choices)  # noqa: SLF001 (argparse has no API)


def _flags() -> dict[str, dict[str, argparse.Action]]:
    """flag -> {command: its action}, the visible flags only (deprecated aliases are hidden)."""
    out: dict[str, dict[str, argparse.Action]] = {}
    for cmd, sp in _parsers().items():
        for a in sp._actions:  # noqa: SLF001
            for o in a.option_strings:
                if o.startswith("--") and o not in SKIP and a.help is not argparse.SUPPRESS:
                    out.setdefault(o, {})[cmd] = a
    return out


def test_every_shared_flag_is_in_the_table_with_the_commands_that_take_it():
    flags = _flags()
    for flag, by_cmd in flags.items():
        if len(by_cmd) > 1:
            assert flag in FLAGS, (f"{flag} is taken by {sorted(by_cmd)}: add it to FLAGS in "
                                   "overdrive/commands/vocabulary.py and to the flag table in docs/cli.md")
    for flag, entry in FLAGS.items():
        assert set(entry.commands) == set(flags.get(flag, {})), (
            f"{flag}: the table says {sorted(entry.commands)}, the parsers {sorted(flags.get(flag, {}))}")


def test_a_shared_flag_takes_the_same_kind_of_value_everywhere():
    for flag, by_cmd in _flags().items():
        kinds = {(type(a).__name__, a.type, a.nargs, a.dest) for a in by_cmd.values()}
        assert len(kinds) == 1, f"{flag} differs between commands: {by_cmd}"


def test_deprecated_spellings_are_hidden_aliases_of_their_replacement():
    parsers = _parsers()
    for (cmd, old), new in DEPRECATED.items():
        sp = parsers[cmd]
        [alias] = [a for a in sp._actions if old in a.option_strings]  # noqa: SLF001
        [repl] = [a for a in sp._actions if new.split()[0] in a.option_strings]  # noqa: SLF001
        assert alias.help is argparse.SUPPRESS and alias.dest == repl.dest, (cmd, old, new)
        assert old not in _flags() or cmd not in _flags()[old], f"{cmd} {old} is still shown in --help"


def test_the_docs_table_is_this_table():
    text = open(CLI_DOC).read()
    block = text.split("<!-- flags:begin", 1)[1].split("<!-- flags:end -->", 1)[0]
    rows = {m.group(1): (m.group(2).strip(), tuple(c.strip() for c in m.group(3).split(",")))
            for m in re.finditer(r"^\| `(--[\w-]+)` \| (.+?) \| ([\w, ]+) \|$", block, re.M)}
    assert rows == {f: (e.meaning, e.commands) for f, e in FLAGS.items()}


@pytest.mark.parametrize("argv, dest, value", [
    (["bench", "--steps", "2"], "rounds", 2),                      # it always set rounds: now it is named so
    (["bench", "--rounds", "2"], "rounds", 2),
    (["bench", "--threads", "1"], "threads", 1),                   # tune's --threads, on bench too
    (["export", "--model", "m.py:make"], "model", "m.py:make"),     # was "invalid choice ... recsys, gpt"
    (["tune", "--model", "cfg/config.json"], "model", "cfg/config.json"),  # plan --model's config, on tune too
    (["tune", "--hf", "cfg/config.json"], "model", "cfg/config.json"),
    (["tune", "--candidates", "fp32"], "configs", "fp32"),          # bench's --configs
    (["tune", "--loss", "m.py:loss"], "loss_fn", "m.py:loss"),      # plan --loss names a cross-entropy kind
])
def test_old_and_new_spellings_parse_to_the_same_thing(argv, dest, value, capsys):
    args = build_parser().parse_args(argv)
    assert getattr(args, dest) == value
    said = capsys.readouterr().err
    assert ("is now" in said) == (argv[1] in {o for (c, o) in DEPRECATED if c == argv[0]})


def test_report_re_renders_a_plan_folder(tmp_path, capsys):
    """`report DIR` of a `plan --out DIR` folder re-renders it (it said "pass a folder written by overdrive bench")."""
    from overdrive.cli import main

    assert main(["plan", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--seq", "2048",
                 "--out", str(tmp_path)]) == 0
    os.remove(tmp_path / "report.html")
    capsys.readouterr()
    assert main(["report", str(tmp_path)]) == 0
    assert "re-rendered" in capsys.readouterr().out and (tmp_path / "report.html").exists()
