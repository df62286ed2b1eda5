"""Swap LayerNorm / RMSNorm modules for fused ones (Transformer Engine, Apex, Liger).

Weights are shared with the original module, so state_dict keys and values are unchanged.
The engines' classes are imported only here, only when the resolved recipe chose them.
"""

from __future__ import annotations

import importlib

from torch import nn

from overdrive.convert.swap import LayerDecision, share_params, swap_modules

__all__ = ["norm_kind", "convert_norms"]

# (module, class) per backend and kind. Signatures as the projects define them:
#   te.LayerNorm(hidden_size, eps=), te.RMSNorm(hidden_size, eps=)
#   apex.normalization.FusedLayerNorm(normalized_shape, eps=), FusedRMSNorm(normalized_shape, eps=)
#   liger_kernel.transformers.LigerLayerNorm(hidden_size, eps=), LigerRMSNorm(hidden_size, eps=)
_CLASSES = {
    "transformer_engine": ("transformer_engine.pytorch", {"layernorm": "LayerNorm", "rmsnorm": "RMSNorm"}),
    "apex": ("apex.normalization", {"layernorm": "FusedLayerNorm", "rmsnorm": "FusedRMSNorm"}),
    "liger": ("liger_kernel.transformers", {"layernorm": "LigerLayerNorm", "rmsnorm": "LigerRMSNorm"}),
}


def norm_kind(m: nn.Module) -> str | None:
    """"layernorm", "rmsnorm" or None. Recognises torch's classes and HF-style `*RMSNorm` modules."""
    if isinstance(m, nn.LayerNorm):
        return "layernorm"
    if isinstance(m, nn.RMSNorm) or type(m).__name__.endswith("RMSNorm"):
        w = getattr(m, "weight", None)
        if isinstance(w, nn.Parameter) and w.dim() == 1:
            return "rmsnorm"
    return None


def _eps(m: nn.Module) -> float:
    for attr in ("eps", "variance_epsilon"):
        v = getattr(m, attr, None)
        if isinstance(v, float):
            return v
    return 1e-6 if norm_kind(m) == "rmsnorm" else 1e-5  # nn.RMSNorm(eps=None) uses finfo.eps; close enough


def convert_norms(model: nn.Module, backend: str) -> list[LayerDecision]:
    """Swap every norm for `backend`'s fused module; report each (converted or why not)."""
    if backend == "torch":
        return []
    mod_name, classes = _CLASSES[backend]
    lib = importlib.import_module(mod_name)

    def decide(m: nn.Module, fqn: str) -> tuple[bool, str] | None:
        k = norm_kind(m)
        if k is None or type(m).__module__.startswith(mod_name.split(".")[0]):
            return None
        w = m.weight if isinstance(getattr(m, "weight", None), nn.Parameter) else None
        if w is None:
            return False, "no affine weight: nothing to fuse that torch does not already"
        if k == "layernorm" and getattr(m, "bias", None) is None:
            return False, f"LayerNorm without bias: {backend}'s LayerNorm always has one (state_dict would change)"
        if w.dim() != 1:
            return False, "normalises over more than one dimension"
        return True, f"{backend} {classes[k]}"

    def factory(m: nn.Module, fqn: str) -> nn.Module:
        k = norm_kind(m)
        new = getattr(lib, classes[k])(m.weight.shape[0], eps=_eps(m))
        new = new.to(device=m.weight.device)
        share_params(m, new)
        return new

    def kind(m: nn.Module) -> str:
        return f"{type(m).__name__}({m.weight.shape[0] if getattr(m, 'weight', None) is not None else '?'})"

    return swap_modules(model, decide, factory, kind)
