"""What a reader does with a bench result: the next step (the winner in code and in a train config),
and why the winner's precision may differ from the one the doctor's probes expected.

Both read the typed view of a results file (`results.records.BenchRecord`), where a field an older
writer did not write has its one default.
"""

from __future__ import annotations

import re

from overdrive.bench.workloads import Workload, workload_of
from overdrive.results.records import BenchRecord, ConfigRecord

__all__ = ["Step", "next_step", "precision_note", "role_order", "winner", "verdict_text", "bench_record"]


class Step:
    """The next step as plain text (console) and as parts for HTML: a lead, code and a config line."""

    def __init__(self, lead: str, code: str | None = None, config: str | None = None, tail: str = "") -> None:
        self.lead, self.code, self.config, self.tail = lead, code, config, tail

    @property
    def text(self) -> str:
        s = self.lead
        if self.code:
            s += f" in code: {self.code}"
        if self.config:
            s += f"; in a train config: {self.config}"
        return s + self.tail

    def html(self, esc) -> str:
        # `command` in the prose becomes <code>; escaping first keeps the page safe.
        s = re.sub(r"`([^`]+)`", r"<code>\1</code>", esc(self.lead))
        if self.code:
            s += f" in code: <code>{esc(self.code)}</code>"
        if self.config:
            s += f"; in a train config: <code>{esc(self.config)}</code>"
        return s + esc(self.tail)


def bench_record(results: BenchRecord | dict) -> BenchRecord:
    """The typed view the report reads (built once from the document when given one)."""
    return results if isinstance(results, BenchRecord) else BenchRecord.of(results)


def role_order(results: BenchRecord | dict, cfg: ConfigRecord | dict) -> list[str]:
    """The run's model order (teacher before student), whatever order the JSON keys came back in (the
    comparison reads two documents of any age: no record is built for this)."""
    if isinstance(results, BenchRecord):
        roles = results.roles
    else:
        roles = tuple((results.get("suite") or {}).get("roles") or ("teacher", "student"))
    models = cfg.models if isinstance(cfg, ConfigRecord) else (cfg.get("models") or {})
    return [r for r in roles if r in models] + [r for r in models if r not in roles]


def winner(results: BenchRecord | dict) -> ConfigRecord | None:
    """The recommended configuration; the baseline when the bench found nothing measurably faster
    (recommendation name None) but the baseline ran; None when nothing completed."""
    return bench_record(results).winner


def verdict_text(results: BenchRecord | dict) -> str:
    """The recommendation without its trailing "Apply: ..." (the next-step line says that, once)."""
    return bench_record(results).recommendation.verdict


def next_step(results: BenchRecord | dict) -> Step:
    rec = bench_record(results)
    w = rec.winner
    if w is None:
        return Step("Next step: nothing to apply yet — no configuration completed safely; read the statuses and "
                    "notes below, then re-run `overdrive bench`.")
    if rec.recommendation.too_busy:
        return Step("Next step: re-run `overdrive bench --out DIR` when the machine is quieter (or with more rounds, "
                    "--rounds): this host was too busy to tell the recipes apart, so nothing was judged.")
    workload = workload_of(rec.doc) or Workload()
    if w.baseline:
        return Step(f"Next step: keep {workload.baseline_words} — no candidate was measurably faster here. Re-run "
                    "`overdrive bench --out DIR` on the machine you train on: the answer changes with the hardware.")
    # Rebuilt from the winner's recorded recipe, never copied from the file's own hint: one builder
    # (the workload's apply_hint) for the bench and the report, so an older file's truncated hint is mended too.
    return Step(*workload.next_step(w.doc, w.label, workload.apply_hint(w.doc)))


def _evidence(c: ConfigRecord) -> str | None:
    if c.failed:
        return f"{c.name} {c.status}"
    if c.status == "stopped":
        if c.stopped_at == "warm-up":  # its reason says so: "stopped after warm-up: 21x slower ..."
            return f"{c.name} was {c.reason}"
        return f"{c.name} was stopped early ({c.reason or 'too slow'})"
    if not c.safe:
        return f"{c.name} missed the loss tolerance"
    if c.speedup is not None:
        return f"{c.name} ran at {c.speedup:.2f}x the baseline's speed"
    return None


def precision_note(results: BenchRecord | dict) -> str | None:
    """One sentence when the doctor's best precision is not the winner's: the probes predict from
    hardware flags and micro-benchmarks; the recommendation rests on the measured training steps."""
    rec = bench_record(results)
    bp, w = rec.best_precision, rec.winner
    if not bp or w is None or w.precision == bp:
        return None
    if rec.recommendation.too_busy:
        return None  # nothing was recommended: there is no choice of precision to explain
    ev = [e for e in (_evidence(c) for c in rec.configs if c.precision == bp and not c.baseline) if e]
    measured = "; ".join(ev) if ev else f"no {bp} candidate completed in this suite"
    return (f"Why {w.precision} and not {bp}: the doctor expects {bp} to be fastest here ({rec.best_precision_why}), "
            f"a prediction from the hardware. Measured on the training steps: {measured}. The recommendation "
            "follows the measurement.")
