"""`overdrive report A B`: two bench results side by side, one row per (configuration, what ran, model).

Rows are keyed by what actually ran, not by the requested name: an `fp8` that fell back to bf16 on A
and an `fp8` emulated on B are different things and get different rows (each "absent" on the other
side), never one row that reads like a like-for-like comparison.

Only runs of the same benchmark compare: `differences` names what differs in the workload (suite,
task, models, batch, sequence, options). `report A B` refuses such a pair unless `--allow-different`,
and then prints the rows without a verdict. A different machine or data file is said in the verdict.
"""

from __future__ import annotations

import os

from overdrive.io import write_atomic
from overdrive.report.advice import role_order
from overdrive.report.page import esc, page, rec_block, table

__all__ = ["ran_label", "compare_rows", "LEGEND", "write_compare_html", "differences", "context_notes"]

# What makes two runs the same benchmark: a step time means something only against the same work.
_WORKLOAD_KEYS = (("name", "suite"), ("task", "task"), ("teacher", "teacher"), ("student", "student"),
                  ("batch", "batch"), ("seq", "sequence length"), ("options", "suite options"))


def _short(v) -> str:
    t = str(v)
    return t if len(t) <= 60 else t[:57] + "..."


def differences(a: dict, b: dict) -> list[str]:
    """What differs between A's and B's workload, in words ("batch 8 vs 16"); empty = the same benchmark."""
    sa, sb = a.get("suite") or {}, b.get("suite") or {}
    out = []
    for key, words in _WORKLOAD_KEYS:
        va, vb = sa.get(key), sb.get(key)
        if va != vb:
            out.append(f"{words} {_short(va)} vs {_short(vb)}")
    return out


def context_notes(a: dict, b: dict) -> list[str]:
    """What differs around the same benchmark and changes what the ratio means (machine, data)."""
    notes = []
    if a.get("device") != b.get("device"):
        notes.append(f"A ran on {a.get('device')} and B on {b.get('device')}: B/A compares the machines as well as "
                     "the recipes")
    if a.get("data") != b.get("data"):
        notes.append(f"A trained on {a.get('data')} and B on {b.get('data')}: losses are not comparable")
    return notes

LEGEND = ("absent: that result has no such row — the configuration was not in its suite, or it ran as something "
          "else (see 'ran as'). -: the row exists but has no such number (stopped early, failed, unavailable, or "
          "an emulated format, which runs for loss parity only and takes no timed turn).")


def ran_label(cfg: dict) -> str:
    """What ran, in a few words: a writer's own label when it has one, else built from the resolved
    recipe (precision, emulation, FP8 backend, compile)."""
    res = cfg.get("resolved") or {}
    for lab in (cfg.get("ran"), cfg.get("label"), res.get("label")):
        if isinstance(lab, str) and lab and lab != cfg.get("name"):  # the name alone says nothing of what ran
            return lab
    prec = cfg.get("precision") or res.get("precision") or "?"
    parts = [prec]
    if cfg.get("emulated") or res.get("emulated"):
        parts.append("emulated")
    elif prec == "fp8" and res.get("fp8_backend"):
        parts.append(f"via {res['fp8_backend']}")
    if res.get("compile") not in (None, "off"):
        parts.append("+ compile")
    return " ".join(parts)


def _med(m: dict) -> float | None:
    return ((m or {}).get("step_ms") or {}).get("median")


def compare_rows(a: dict, b: dict) -> list[dict]:
    """A's rows in A's order, then rows only B has in B's order."""
    def rows_of(res: dict) -> dict:
        out = {}
        for c in res.get("configs", []):
            lab = ran_label(c)
            for role in role_order(res, c) or ["-"]:
                out[(c.get("name"), lab, role)] = (c, (c.get("models") or {}).get(role) or {})
        return out

    ra, rb = rows_of(a), rows_of(b)
    rows = []
    for key in list(ra) + [k for k in rb if k not in ra]:
        ca, ma = ra.get(key, (None, {}))
        cb, mb = rb.get(key, (None, {}))
        sa, sb = _med(ma), _med(mb)
        rows.append({"config": key[0], "ran": key[1], "model": key[2],
                     "a_status": ca.get("status", "?") if ca else "absent",
                     "b_status": cb.get("status", "?") if cb else "absent",
                     "a_ms": (ma.get("step_ms") if ca else None), "b_ms": (mb.get("step_ms") if cb else None),
                     "ratio": sb / sa if sa and sb else None,
                     "a_loss": ma.get("final_loss"), "b_loss": mb.get("final_loss")})
    return rows


def relabelled(rows: list[dict]) -> list[str]:
    """Configurations that ran as different things in A and B (so they sit on separate rows)."""
    by: dict[str, dict[str, set]] = {}
    for r in rows:
        d = by.setdefault(r["config"], {"a": set(), "b": set()})
        if r["a_status"] != "absent":
            d["a"].add(r["ran"])
        if r["b_status"] != "absent":
            d["b"].add(r["ran"])
    return [f"{n} ran as {', '.join(sorted(d['a']))} in A and as {', '.join(sorted(d['b']))} in B: not the same "
            "thing, so not compared row to row" for n, d in by.items() if d["a"] and d["b"] and d["a"] != d["b"]]


def _ms(s: dict | None) -> str:
    if not s or s.get("median") is None:
        return "-"
    if s.get("p10") is None or s.get("p90") is None:
        return f"{s['median']:.1f}"
    return f"{s['median']:.1f} [{s['p10']:.1f}–{s['p90']:.1f}]"


def verdict(a: dict, b: dict, rows: list[dict]) -> str:
    diff = differences(a, b)
    if diff:
        return (f"A vs B: not compared — they are different benchmarks ({'; '.join(diff)}); a step-time ratio "
                "between different work says nothing about the recipes")
    both = [r["ratio"] for r in rows if r["ratio"] is not None and r["config"] and r["a_status"] == "ok"
            and r["b_status"] == "ok"]
    if not both:
        return "A vs B: no configuration ran the same way in both with timings, so step times are not compared"
    import statistics

    g = statistics.geometric_mean(both)
    faster = "faster" if g < 1 else "slower"
    ctx = "".join(f" Note: {n}." for n in context_notes(a, b))
    return (f"A vs B: over the {len(both)} rows timed in both, B's step time is {g:.2f}x A's "
            f"(geometric mean; B {faster}).{ctx} B's pick: {(b.get('recommendation') or {}).get('text', '-')}")


def write_compare_html(a: dict, b: dict, out_dir: str, *, names: tuple[str, str] = ("A", "B")) -> str:
    from overdrive.report.advice import next_step

    rows = compare_rows(a, b)
    body = [f"<h1>overdrive report: A vs B</h1><p class='meta'>A = {esc(names[0])}: {esc(str(a.get('device')))} "
            f"({esc(str(a.get('created')))}) · B = {esc(names[1])}: {esc(str(b.get('device')))} "
            f"({esc(str(b.get('created')))})</p>"]
    body += rec_block(verdict(a, b, rows), next_step(b).html(esc).replace("Next step:", "Next step (from B):", 1))
    cells = [[esc(str(r["config"])), esc(r["ran"]), esc(r["model"]), esc(r["a_status"]), esc(r["b_status"]),
              _ms(r["a_ms"]) if r["a_status"] != "absent" else "absent",
              _ms(r["b_ms"]) if r["b_status"] != "absent" else "absent",
              f"{r['ratio']:.2f}" if r["ratio"] is not None else "-",
              f"{r['a_loss']:.3f}" if r["a_loss"] is not None else "-",
              f"{r['b_loss']:.3f}" if r["b_loss"] is not None else "-"] for r in rows]
    body.append(table(["config", "ran as", "model", "A status", "B status", "A step ms [p10–p90]",
                       "B step ms [p10–p90]", "B/A time", "A loss", "B loss"], cells, left=5))
    body.append(f"<p class='legend'>{esc(LEGEND)}</p>")
    body += [f"<p class='note'>{esc(n)}</p>" for n in relabelled(rows)]
    body.append(f"<p class='note'>A: {esc((a.get('recommendation') or {}).get('text', '-'))}</p>"
                f"<p class='note'>B: {esc((b.get('recommendation') or {}).get('text', '-'))}</p>")
    path = os.path.join(out_dir, "compare.html")
    os.makedirs(out_dir, exist_ok=True)
    write_atomic(path, page("overdrive report A vs B", body))
    return path
