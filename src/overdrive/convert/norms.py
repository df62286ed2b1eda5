"""Swap LayerNorm / RMSNorm modules for fused ones (Transformer Engine, Apex, Liger).

Weights are shared with the original module, so state_dict keys and values are unchanged.
The engines' classes are imported only here, only when the resolved recipe chose them.
"""

from __future__ import annotations

import importlib

import torch
import torch.nn.functional as F
from torch import nn

from overdrive.convert.swap import LayerDecision, share_params, swap_modules

__all__ = ["norm_kind", "convert_norms", "rms_offset"]

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


def rms_offset(m: nn.Module) -> float | None:
    """0.0 for x/rms(x)*w, 1.0 for Gemma-style x/rms(x)*(1+w) (Gemma, Qwen3-Next: weight initialised to
    zero), None when the module's forward is neither. Decided from what the module computes on a probe
    input, not from its class name: swapping a Gemma-style norm for a standard one (LigerRMSNorm's
    default offset=0) multiplies by w ~ 0 and wipes the output."""
    w = getattr(m, "weight", None)
    if not isinstance(w, torch.Tensor) or w.dim() != 1:
        return None
    if w.is_meta:  # nothing to run: the class name is all there is
        return 1.0 if "gemma" in type(m).__name__.lower() else 0.0
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, w.shape[0], generator=g).to(device=w.device, dtype=w.dtype)
    try:
        with torch.no_grad():
            y = m(x).float()
    except Exception:  # a norm that needs more than one tensor argument
        return None
    base = F.rms_norm(x.float(), (w.shape[0],), eps=_eps(m))
    tol = 2e-2 if w.dtype in (torch.float16, torch.bfloat16) else 1e-4
    for offset in (0.0, 1.0):
        ref = base * (offset + w.detach().float())
        if torch.allclose(y, ref, rtol=tol, atol=tol * max(1.0, float(ref.abs().max()))):
            return offset
    return None


def convert_norms(model: nn.Module, backend: str) -> list[LayerDecision]:
    """Swap every norm for `backend`'s fused module; report each (converted or why not)."""
    if backend == "torch":
        return []
    mod_name, classes = _CLASSES[backend]
    lib = importlib.import_module(mod_name)
    offsets: dict[int, float] = {}

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
        if k == "rmsnorm":
            off = rms_offset(m)
            if off is None:
                return False, "its forward is neither x/rms(x)*w nor x/rms(x)*(1+w) on a probe input: kept as is"
            offsets[id(m)] = off
            if off == 1.0:
                if backend == "apex":
                    return False, "Gemma-style RMSNorm (x*(1+w)): Apex FusedRMSNorm has no offset, kept in torch"
                how = "zero_centered_gamma=True" if backend == "transformer_engine" else \
                    "offset=1.0, casting_mode='gemma'"
                return True, f"{backend} {classes[k]}({how}): Gemma-style x*(1+w), detected from its output"
        return True, f"{backend} {classes[k]}"

    def factory(m: nn.Module, fqn: str) -> nn.Module:
        k = norm_kind(m)
        kw: dict = {}
        if backend == "liger" and k == "rmsnorm":
            # LigerRMSNorm's default in_place=True writes dX into dY's storage (liger_kernel ops/rms_norm.py:
            # 555-556), which Liger itself says gives wrong gradients when something else still needs dY
            # (:646-648, a residual add beside the norm: post- and sandwich-norm blocks). Any model can come
            # through here, so the norm gets its own dX (one zeros_like, :557-558), as Liger's Gemma patches do.
            kw = {"in_place": False}
        if offsets.get(id(m)) == 1.0:  # the swapped module must compute x*(1+w) too, as Liger's Gemma patch does
            kw = {"zero_centered_gamma": True} if backend == "transformer_engine" else \
                {"offset": 1.0, "casting_mode": "gemma", "in_place": False}
        new = getattr(lib, classes[k])(m.weight.shape[0], eps=_eps(m), **kw)
        new = new.to(device=m.weight.device)
        share_params(m, new)
        return new

    def kind(m: nn.Module) -> str:
        return f"{type(m).__name__}({m.weight.shape[0] if getattr(m, 'weight', None) is not None else '?'})"

    return swap_modules(model, decide, factory, kind)
