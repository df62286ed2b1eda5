"""What a reader does with a bench result: the next step (the winner in code and in a train config),
and why the winner's precision may differ from the one the doctor's probes expected.

Both read results.json defensively (fields may be added by newer writers; older files lack some).
"""

from __future__ import annotations

import re

from overdrive.bench.workloads import Workload, workload_of

__all__ = ["Step", "next_step", "precision_note", "role_order", "winner", "verdict_text"]


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


def role_order(results: dict, cfg: dict) -> list[str]:
    """The run's model order (teacher before student), whatever order the JSON keys came back in."""
    models = cfg.get("models") or {}
    order = list((results.get("suite") or {}).get("roles") or ("teacher", "student"))
    return [r for r in order if r in models] + [r for r in models if r not in order]


def winner(results: dict) -> dict | None:
    """The recommended configuration; the baseline when the bench found nothing measurably faster
    (recommendation name None) but the baseline ran; None when nothing completed."""
    configs = results.get("configs", [])
    name = (results.get("recommendation") or {}).get("name")
    if name is None:
        return next((c for c in configs if c.get("baseline") and c.get("status") == "ok"), None)
    return next((c for c in configs if c.get("name") == name), None)


def verdict_text(results: dict) -> str:
    """The recommendation without its trailing "Apply: ..." (the next-step line says that, once)."""
    return (results.get("recommendation") or {}).get("text", "-").split(". Apply: ")[0]


def next_step(results: dict) -> Step:
    w = winner(results)
    if w is None:
        return Step("Next step: nothing to apply yet — no configuration completed safely; read the statuses and "
                    "notes below, then re-run `overdrive bench`.")
    if (results.get("recommendation") or {}).get("too_busy"):
        return Step("Next step: re-run `overdrive bench --out DIR` when the machine is quieter (or with more rounds, "
                    "--rounds): this host was too busy to tell the recipes apart, so nothing was judged.")
    workload = workload_of(results) or Workload()
    if w.get("baseline"):
        what = workload.baseline_words
        return Step(f"Next step: keep {what} — no candidate was measurably faster here. Re-run `overdrive bench --out DIR` on "
                    "the machine you train on: the answer changes with the hardware.")
    # Rebuilt from the winner's recorded recipe, never copied from the file's own hint: one builder
    # (the workload's apply_hint) for the bench and the report, so an older file's truncated hint is mended too.
    return Step(*workload.next_step(w, w.get("label") or w["name"], workload.apply_hint(w)))


def precision_note(results: dict) -> str | None:
    """One sentence when the doctor's best precision is not the winner's: the probes predict from
    hardware flags and micro-benchmarks; the recommendation rests on the measured training steps."""
    env_best = ((results.get("env") or {}).get("best_precision") or {})
    bp, why = env_best.get("precision"), env_best.get("reason", "")
    w = winner(results)
    if not bp or w is None or w.get("precision") == bp:
        return None
    if (results.get("recommendation") or {}).get("too_busy"):
        return None  # nothing was recommended: there is no choice of precision to explain
    same = [c for c in results.get("configs", []) if c.get("precision") == bp and not c.get("baseline")]
    ev = []
    for c in same:
        st = c.get("status")
        if st in ("failed", "oom", "crashed", "unavailable"):
            ev.append(f"{c['name']} {st}")
        elif st == "stopped":
            ev.append(f"{c['name']} was stopped early ({c.get('reason') or 'too slow'})")
        elif not c.get("safe", True):
            ev.append(f"{c['name']} missed the loss tolerance")
        elif c.get("speedup") is not None:
            ev.append(f"{c['name']} ran at {c['speedup']:.2f}x the baseline's speed")
    measured = "; ".join(ev) if ev else f"no {bp} candidate completed in this suite"
    return (f"Why {w.get('precision')} and not {bp}: the doctor expects {bp} to be fastest here ({why}), a "
            f"prediction from the hardware. Measured on the training steps: {measured}. The recommendation "
            "follows the measurement.")
