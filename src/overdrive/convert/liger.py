"""Liger-Kernel's own model patches for the Hugging Face families it supports.

`apply_liger_kernel_to_<family>(model=...)` (Liger's public API, chosen by `config.model_type`
through Liger's own table) brings RoPE, SwiGLU/GeGLU, its RMSNorm (with Gemma's `1 + w` offset
handled by Liger itself) and, when asked, the fused linear cross-entropy inside `model(labels=...)`.
Liger patches the live modules' `forward` in place, and also rebinds names in the family's
`transformers` modeling module: models of that family built afterwards in this process get them too.

A model Liger has no patch for (not HF, or an unknown family) returns `applied=False` with the
reason, and the caller swaps the norms only.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field

from torch import nn

from overdrive.convert.swap import LayerDecision

__all__ = ["LigerPatch", "apply_liger_model_patches", "liger_family"]


@dataclass
class LigerPatch:
    applied: bool
    family: str | None
    summary: str
    reason: str
    decisions: list[LayerDecision] = field(default_factory=list)


def liger_family(model: nn.Module) -> str | None:
    """The `config.model_type` of a Hugging Face model, or None."""
    cfg = getattr(model, "config", None)
    return getattr(cfg, "model_type", None) if cfg is not None else None


def _liger_table() -> dict:
    from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN

    return MODEL_TYPE_TO_APPLY_LIGER_FN


def _patched_modules(model: nn.Module) -> list[LayerDecision]:
    """Which live modules now run a Liger forward, read back from the modules themselves."""
    out = []
    for fqn, m in model.named_modules():
        fwd = m.__dict__.get("forward")
        owner = getattr(getattr(fwd, "__func__", None), "__qualname__", "")
        if owner.startswith("Liger") or (fqn == "" and "lce_forward" in owner):
            what = owner.split(".")[0] if owner.startswith("Liger") else "fused linear cross-entropy forward"
            out.append(LayerDecision(fqn=fqn or "(model)", kind=type(m).__name__, converted=True,
                                     reason=f"Liger {what}"))
    return out


def apply_liger_model_patches(model: nn.Module, *, fused_linear_cross_entropy: bool = False) -> LigerPatch:
    """Apply Liger's patch for this model's family, if Liger has one."""
    family = liger_family(model)
    if family is None:
        return LigerPatch(False, None, "norms only", "not a Hugging Face model: Liger's model patches need "
                          "config.model_type; only the norms are swapped for Liger's")
    table = _liger_table()
    fn = table.get(family)
    if fn is None:
        return LigerPatch(False, family, "norms only", f"Liger has no model patch for '{family}' (it has "
                          f"{len(table)} families, e.g. llama, mistral, qwen2, gemma, phi3): only the norms "
                          "are swapped for Liger's")
    params = inspect.signature(fn).parameters
    kw = {k: v for k, v in {"rope": True, "rms_norm": True, "swiglu": True, "geglu": True,
                            "fused_linear_cross_entropy": fused_linear_cross_entropy,
                            "cross_entropy": False}.items() if k in params}
    fn(model=model, **kw)
    decisions = _patched_modules(model)
    on = [k for k in ("rope", "rms_norm", "swiglu", "geglu", "fused_linear_cross_entropy") if kw.get(k)]
    return LigerPatch(True, family, f"{fn.__name__}({', '.join(on)})",
                      f"Liger's own patch for '{family}': {', '.join(on)}"
                      + ("" if fused_linear_cross_entropy else "; loss stays torch cross-entropy (recipe loss)"),
                      decisions)
