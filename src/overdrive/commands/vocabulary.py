"""One flag vocabulary for every command: a flag means the same thing wherever it appears.

`FLAGS` is the table (the flag table in docs/cli.md is this one, and tests/unit/test_flag_vocabulary.py
reads every command's parser against both): each flag two or more commands share, what it means, and
which commands take it. A flag that has to change its spelling keeps the old one as a deprecated alias
(`deprecated`): hidden from --help, it parses to the same destination and says the new spelling once.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

__all__ = ["Flag", "FLAGS", "DEPRECATED", "deprecated"]


@dataclass(frozen=True, kw_only=True)
class Flag:
    meaning: str
    """What the flag means, in every command that takes it."""
    commands: tuple[str, ...]
    """The commands that take it."""


FLAGS: dict[str, Flag] = {
    "--model": Flag(meaning="the model: a built-in name, your FILE.py:FACTORY (a function returning an nn.Module), "
                            "or a Hugging Face config (folder or .json), as each command supports",
                    commands=("bench", "export", "plan", "tune")),
    "--inputs": Flag(meaning="FILE.py:FN, FN(batch size) returns example inputs for --model (batch first)",
                     commands=("bench", "export")),
    "--dynamic": Flag(meaning="INPUT:AXIS, a further variable dimension of --model's input (repeatable)",
                      commands=("bench", "export")),
    "--configs": Flag(meaning="comma-separated recipe names to measure (the baseline always runs)",
                      commands=("bench", "tune")),
    "--threads": Flag(meaning="torch threads per measuring process (default: from the cores and the host's load)",
                      commands=("bench", "tune")),
    "--seed": Flag(meaning="seed for the initial weights and the data order", commands=("bench", "tune")),
    "--out": Flag(meaning="the folder results (results.json, report.html, ...) are written to",
                  commands=("bench", "emit", "export", "plan", "report", "tune")),
    "--report-to": Flag(meaning="TRACKERS, comma-separated tensorboard, mlflow and/or wandb that the results are "
                                "logged to", commands=("bench", "train", "tune")),
    "--rounds": Flag(meaning="timed rounds, each running every configuration (never optimizer steps)",
                     commands=("bench",)),
    "--budget-s": Flag(meaning="wall-clock budget of the whole run, set-up and compilation included (bench's "
                               "rounds adapt to the noise up to each suite's own cap)", commands=("tune",)),
    "--json": Flag(meaning="print the result as one JSON object on stdout", commands=("doctor", "plan", "tune")),
}

DEPRECATED: dict[tuple[str, str], str] = {
    ("bench", "--steps"): "--rounds",       # it set timed rounds, never optimizer steps
    ("tune", "--hf"): "--model",            # plan --model takes the same config
    ("tune", "--candidates"): "--configs",  # bench's name for the same list
    ("tune", "--loss"): "--loss-fn",        # plan --loss names a cross-entropy implementation
}
"""(command, old spelling) -> the flag that replaced it. The positional FILE.py:FACTORY of export and tune is
the older spelling of --model FILE.py:FACTORY (a positional has no flag to hide: its help says so)."""


class _Deprecated(argparse.Action):
    def __init__(self, option_strings, dest, *, new: str, **kw):
        self.new = new
        super().__init__(option_strings, dest, **kw)

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        where = parser.prog.removeprefix("overdrive").strip()
        print(f"overdrive: note: `{where} {option_string}` is now `{self.new}` (the old spelling still works)",
              file=sys.stderr)


def deprecated(parser: argparse.ArgumentParser, old: str, *, new: str, dest: str, **kw) -> None:
    """Add `old` as a hidden alias of `new` (same dest): parses as before, says the new spelling once."""
    parser.add_argument(old, dest=dest, action=_Deprecated, new=new, help=argparse.SUPPRESS,
                        default=argparse.SUPPRESS, **kw)
