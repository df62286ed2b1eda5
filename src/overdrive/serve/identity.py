"""What identifies a served model, so that a bench's serving results and an export are of one model:
the functions by file name, the files' contents (sha256) and the variable axes."""

from __future__ import annotations

import hashlib
import os

from overdrive.serve.errors import ExportError

__all__ = ["model_identity", "same_model", "CLICK_IDENTITY"]


def _sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def model_identity(factory: str, inputs: str | None, dynamic: list[str] | None = None, *,
                   resolved: dict | None = None) -> dict:
    """{"factory": "FILE.py:FN", "inputs": ..., "sha256": {file name: digest}, "given": the arguments as
    typed}: the functions by file name (a relative or absolute path to the same file is the same model)
    and the files' contents (an edited model file is another model). Modules the file imports are not
    hashed. `same_model` compares two."""
    files = {}
    for ref in (factory, inputs):
        if ref:
            path = ref.rpartition(":")[0]
            try:
                files[os.path.basename(path)] = _sha256(path)
            except OSError as e:
                raise ExportError(f"cannot read {path}: {e.strerror}") from None

    def name(ref):
        return f"{os.path.basename(ref.rpartition(':')[0])}:{ref.rpartition(':')[2]}" if ref else None

    out = {"factory": name(factory), "inputs": name(inputs), "sha256": files,
           "given": {"factory": factory, "inputs": inputs, "dynamic": list(dynamic or [])}}
    if resolved is not None:  # the variable axes by input name (--dynamic 0:1 and ids:1 are one axis)
        out["axes"] = sorted(f"{n}:{ax}" for n, axes in resolved.items() for ax in axes if ax)
    return out


CLICK_IDENTITY = {"builtin": "click"}
"""The built-in click model's identity (results written before identities were recorded measured it too)."""


def same_model(measured: dict | None, exporting: dict) -> str | None:
    """None when a bench's serving results (`measured`: their model_identity) are of the model being
    exported, else what differs, in words."""
    measured = measured or CLICK_IDENTITY

    def what(i):
        return "the built-in click model" if i.get("builtin") else f"{i['factory']} with inputs {i.get('inputs')}"

    if bool(measured.get("builtin")) != bool(exporting.get("builtin")) or \
            measured.get("factory") != exporting.get("factory") or measured.get("inputs") != exporting.get("inputs"):
        return f"it measured {what(measured)}, not {what(exporting)}"
    if "axes" in measured and "axes" in exporting:
        dyn = [measured["axes"], exporting["axes"]]
    else:
        dyn = [sorted((i.get("given") or {}).get("dynamic") or []) for i in (measured, exporting)]
    if dyn[0] != dyn[1]:  # another set of dynamic axes is another ONNX graph than the one timed
        return (f"it measured {what(measured)} with --dynamic {' '.join(dyn[0]) or '(none)'}, not "
                f"{' '.join(dyn[1]) or '(none)'}")
    changed = [f for f, h in (exporting.get("sha256") or {}).items() if (measured.get("sha256") or {}).get(f) != h]
    if changed:
        return f"{', '.join(changed)} changed since it was measured (sha256 differs)"
    return None
