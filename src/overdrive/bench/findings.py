"""What `overdrive bench` measured on this machine, kept for `overdrive doctor` to say beside its probes.

The doctor's verdict is what the probes expect ("bf16 runs here"); the bench measures what it costs
("amp-fp16 stopped: 41x slower than the baseline"). Each bench of the training workloads writes one
small JSON per machine (`recipes.tuned.machine_fingerprint`: CPU, GPUs, torch build) under the user's
cache; the doctor prints its lines, dated, when one exists for this machine.
"""

from __future__ import annotations

import json
import os

from overdrive.env import EnvReport
from overdrive.io import load_json_bounded

__all__ = ["findings_path", "save_findings", "load_findings", "findings_lines"]


def findings_path(env: EnvReport) -> str:
    from overdrive.recipes.tuned import machine_fingerprint

    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(root, "overdrive", "measured", f"{machine_fingerprint(env)}.json")


def save_findings(results: dict, env: EnvReport) -> str | None:
    """Keep the per-configuration outcome of a bench (speedup and interval, or why it stopped); None when
    the cache cannot be written (a read-only home is no reason to fail a bench)."""
    from overdrive.io import write_atomic

    rows = [{"name": c.get("name"), "precision": c.get("precision"), "status": c.get("status"),
             "reason": c.get("reason") or "", "stopped_at": c.get("stopped_at"), "speedup": c.get("speedup"),
             "speedup_ci": c.get("speedup_ci"),
             "baseline": bool(c.get("baseline"))} for c in results.get("configs") or []]
    doc = {"created": results.get("created"), "suite": (results.get("suite") or {}).get("name"),
           "device": results.get("device"), "recommendation": (results.get("recommendation") or {}).get("text"),
           "configs": rows}
    try:
        p = findings_path(env)
        write_atomic(p, json.dumps(doc, indent=1) + "\n")
    except (OSError, AttributeError, TypeError):  # an unwritable cache, or an env without a platform record
        return None
    return p


def load_findings(env: EnvReport) -> dict | None:
    try:
        doc = load_json_bounded(findings_path(env), what="bench findings")
    except (OSError, ValueError, RecursionError):
        return None
    return doc if isinstance(doc, dict) and isinstance(doc.get("configs"), list) else None


def findings_lines(doc: dict) -> list[str]:
    """'amp-fp16 (fp16): stopped — 41x slower than the baseline ...', 'amp-bf16 (bf16): 1.26x [1.21-1.31]'."""
    out = []
    for c in doc["configs"]:
        if not isinstance(c, dict) or c.get("baseline"):
            continue
        head = f"{c.get('name')} ({c.get('precision')})"
        ci = c.get("speedup_ci")
        if c.get("status") == "ok" and isinstance(c.get("speedup"), (int, float)):
            iv = f" [{ci[0]:.2f}–{ci[1]:.2f}]" if isinstance(ci, list) and len(ci) == 2 else ""
            out.append(f"{head}: {c['speedup']:.2f}x the baseline{iv}")
        elif c.get("stopped_at") == "warm-up" and c.get("reason"):  # "stopped after warm-up: 21x slower ..."
            out.append(f"{head}: {c['reason']}")
        else:
            out.append(f"{head}: {c.get('status')}" + (f" — {c['reason']}" if c.get("reason") else ""))
    return out
