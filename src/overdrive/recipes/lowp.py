"""Resolve a low-precision format to the engine that runs it here: a loop over the format's engines.

For the format a recipe asks for (`formats.FORMATS`), in its engine order (`Format.order`: the user's
backend first; under torch.compile torchao before Transformer Engine for the FP8 formats, as te.Linear
breaks the graph):
1. each real engine is checked here (installed, working, new enough (`Engine.since`), the format's own
   probe on this GPU, no activation checkpointing against TE); an engine may run a sibling format
   instead (`Engine.instead`, `Engine.older`), said as a fallback;
2. no real engine: emulation (numerics only, never a speedup) where the format's emulated engine works,
   unless FP8 hardware is here and the format names a `fallback` format (MXFP8/NVFP4 on an H100: per-tensor
   FP8 is a real speedup where emulation would be a slowdown; ask for `fp8_backend="emulated"` to study
   the numerics there);
3. then the fallback format, through the same loop; or no low precision at all (the best precision here).
Every step is one Decision in the log; a fallback raises under strict.
"""

from __future__ import annotations

from dataclasses import dataclass

from overdrive.env import EnvReport
from overdrive.formats import EMULATED, FORMATS, TE, TORCHAO, Engine, Format, get_format

__all__ = ["resolve_format", "TE_AC_CONFLICT", "TE_COMPILE_BREAKS", "te_has_current_scaling"]

# Why TE FP8 and activation checkpointing are not combined: torch.utils.checkpoint recomputes the
# block outside TE's FP8 autocast, so the recompute saves other tensors and torch raises CheckpointError
# (TE's own te.distributed.checkpoint re-enters the autocast; our checkpointing uses torch's).
TE_AC_CONFLICT = ("Transformer Engine FP8 is not combined with activation checkpointing: the recompute runs "
                  "outside TE's FP8 autocast (CheckpointError)")

# Transformer Engine under torch.compile: te.Linear.forward is `@no_torch_dynamo()` (torch._dynamo.disable)
# in every 2.x release (transformer_engine/pytorch/module/linear.py, v2.0 line 935 ... v2.18 line 1797;
# the decorator in transformer_engine/pytorch/jit.py), so the graph breaks at every TE linear.
TE_COMPILE_BREAKS = ("te.Linear.forward is torch._dynamo.disable'd (@no_torch_dynamo, every TE 2.x): "
                     "torch.compile breaks the graph at every TE linear")

_ENGINE_NAME = {TE: "Transformer Engine", TORCHAO: "torchao"}


def te_has_current_scaling(te_version: str | None) -> bool:
    """Transformer Engine has Float8CurrentScaling (unknown version: assume it does)."""
    return not any(e.predates(te_version) for f in FORMATS.values() for e in f.engines
                   if e.backend == TE and e.api == "Float8CurrentScaling")


@dataclass(frozen=True, kw_only=True)
class _Ask:
    env: EnvReport
    backend: str
    """The backend the user asked for ("auto", an engine, "emulated")."""
    compiled: bool
    recompute: str | None
    """Why the blocks are recomputed (activation checkpointing), which rules Transformer Engine out."""


def _te_why(f: Format, eng: Engine, ask: _Ask) -> str | None:
    """Why Transformer Engine cannot run `f` here (None: it can)."""
    env, te = ask.env, ask.env.engine(TE)
    if f.probed:  # the format's own probe: is_<kind>_available, its te.Linear smoke run
        if ask.recompute:
            return TE_AC_CONFLICT
        if te.status == "missing":
            return "Transformer Engine is not installed"
        if not te.ok and te.status != "unsupported":
            return f"Transformer Engine is {te.status}: {te.reason}"
        if not env.gpus:
            return "Transformer Engine needs a CUDA GPU"
        if eng.predates(te.version):
            return _predates(f, eng, te.version)
        avail = te.details.get(f"is_{f.kind}_available")
        if avail is False or (avail is None and not any(g.capabilities.get(f.kind) for g in env.gpus)):
            g = env.gpus[0]
            why = te.details.get(f"{f.kind}_reason") or f"{f.label} needs SM {f.min_cc[0]}.x"
            return f"Transformer Engine: {why} ({g.name} is SM {g.cc[0]}.{g.cc[1]})"
        if te.details.get(f"{f.kind}_smoke_ok") is False:
            return f"Transformer Engine's {f.label} te.Linear failed here: {te.details.get(f'{f.kind}_smoke_error')}"
    if not te.ok:
        return f"Transformer Engine is {te.status}: {te.reason}"
    if ask.recompute:
        return ask.recompute
    if eng.unsupported:
        return eng.unsupported
    if eng.predates(te.version) and not eng.older:  # (with `older`, the older sibling runs: `_real`)
        return _predates(f, eng, te.version)
    return None


def _predates(f: Format, eng: Engine, version: str | None) -> str:
    return (f"Transformer Engine {version} predates {f.label} ({eng.api} first in {'.'.join(map(str, eng.since))}): "
            "pip install -U transformer_engine[pytorch]")


def _ao_why(f: Format, eng: Engine, ask: _Ask) -> str | None:
    """Why torchao cannot run `f` here (None: it can)."""
    env, ao = ask.env, ask.env.engine(TORCHAO)
    if not f.probed:
        return None if ao.ok else f"torchao is {ao.status}: {ao.reason}"
    if ao.status == "missing":
        return "torchao is not installed"
    if not env.gpus or not any(g.capabilities.get(f.kind) for g in env.gpus):
        where = f"{env.gpus[0].name} is SM {env.gpus[0].cc[0]}.{env.gpus[0].cc[1]}" if env.gpus else "no GPU here"
        return f"torchao's {f.label} kernels need SM {f.min_cc[0]}.x ({where})"
    if ao.details.get(f"{f.kind}_ok"):
        return None
    err = ao.details.get(f"{f.kind}_error")
    return f"torchao's {f.label} training linear failed here: {err}" if err else \
        f"torchao's {f.label} training linear was not probed on this GPU (torchao {ao.version})"


def _emulation_why(f: Format, eng: Engine | None, ask: _Ask) -> str | None:
    """Why the format cannot be emulated here (None: it can). An engine without a probe (`api`) is plain torch."""
    ao = ask.env.engine(TORCHAO)
    if eng is None:
        return f"{f.label} has no emulation"
    if not eng.api or ao.details.get(eng.api):
        return None
    if ao.status == "missing":
        return f"torchao is not installed (pip install 'torchao>=0.10' for its {f.label} emulation)"
    return f"torchao's {f.label} emulation failed here: {ao.details.get(eng.api.replace('_ok', '_error')) or ao.reason}"


_CHECKS = {TE: _te_why, TORCHAO: _ao_why}


def _label(f: Format, eng: Engine, ask: _Ask, *, reordered: bool) -> str:
    gpu = ask.env.gpus[0].name
    what = f"{f.label} ({f.scaling})" if f.scaling != f.kind else f.label
    label = f"{_ENGINE_NAME[eng.backend]} runs {what} on {gpu}"
    if eng.backend == TE and ask.compiled:
        label += f"; {TE_COMPILE_BREAKS}"
    if reordered:
        label += f" (preferred under torch.compile: {TE_COMPILE_BREAKS})"
    return label


def _want(f: Format, backend: str) -> str:
    return f"{f.kind} ({f.scaling}, backend {backend})" if f.scaling != f.kind else f"{f.kind} (backend {backend})"


def _real(f: Format, ask: _Ask, log, reasons: list[str]) -> tuple[str, Format] | None:
    """The first real engine in `f`'s order that runs here (the format it runs may be a sibling)."""
    order = f.order(ask.backend, compiled=ask.compiled and ask.env.engine(TORCHAO).ok)
    reordered = ask.backend == "auto" and order[:1] != f.order("auto")[:1] and ask.env.engine(TE).ok
    for eng in order:
        why = _CHECKS[eng.backend](f, eng, ask)
        runs = f
        if why is None and eng.backend == TE and eng.predates(ask.env.engine(TE).version) and eng.older:
            no = f"Transformer Engine {ask.env.engine(TE).version} has no {eng.api} (first in TE " \
                 f"{'.'.join(map(str, eng.since))})"
            if ask.compiled:
                why = f"{no} and its {FORMATS[eng.older].engine(TE).api} fails under torch.compile"
            else:
                runs = FORMATS[eng.older]
                log.add("fp8_scaling", f.scaling, runs.scaling, f"{no} → {runs.engine(TE).api} (amax history 16); "
                        "pip install -U transformer_engine[pytorch] for current scaling", fallback=True)
        if why is not None:
            reasons.append(why)
            continue
        if eng.instead:
            runs = FORMATS[eng.instead]
            log.add("fp8_scaling", f.scaling, runs.scaling, eng.instead_why, fallback=True)
        label = _label(runs, eng, ask, reordered=reordered and eng.backend == TORCHAO)
        if ask.backend in ("auto", eng.backend):
            conflict = next((x for x in reasons if TE_AC_CONFLICT in x), None)
            log.add(f.kind, _want(f, ask.backend), eng.backend, label + (f" ({conflict})" if conflict else ""))
        else:
            log.add(f.kind, _want(f, ask.backend), eng.backend, f"{ask.backend} {f.label} requested: "
                    f"{'; '.join(reasons)} → {label}", fallback=True)
        return eng.backend, runs
    return None


def _emulated(f: Format, ask: _Ask, log, reasons: list[str]) -> tuple[str, Format] | None:
    eng = f.engine(EMULATED)
    fp8_gpu = any(g.capabilities.get("fp8") for g in ask.env.gpus)
    why = _emulation_why(f, eng, ask)
    if why is not None:
        reasons.append(why)
        return None
    if ask.backend != EMULATED and f.fallback and fp8_gpu:
        return None  # the fallback format runs for real on this FP8 GPU
    runs = FORMATS[eng.instead] if eng.instead else f
    label = f"{f.emulation}, numerics only, not faster" if not f.probed else \
        f"emulated {f.label}: {f.emulation}, on the forward, grad-input and grad-weight GEMMs; numerics only, not faster"
    where = "; ".join(reasons) if fp8_gpu or f.probed else "no GPU with SM >= 8.9 here"
    if ask.backend == EMULATED:
        log.add(f.kind, _want(f, ask.backend), EMULATED, label)
    else:
        log.add(f.kind, _want(f, ask.backend), EMULATED, f"{f.kind} requested: {where} → {label}", fallback=True)
    return EMULATED, runs


def resolve_format(scaling: str, backend: str, env: EnvReport, log, *, compiled: bool = False,
                   recompute: str | None = None) -> tuple[str | None, str | None, str]:
    """(backend, fp8_scaling, precision that runs) for the format `scaling` names, asked on `backend`;
    (None, None, the best precision here) when no engine runs it. `recompute`: why the blocks are
    recomputed (activation checkpointing), which Transformer Engine does not combine with FP8."""
    f = get_format(scaling)
    ask = _Ask(env=env, backend=backend, compiled=compiled, recompute=recompute)
    while True:
        reasons: list[str] = []
        got = _real(f, ask, log, reasons) or _emulated(f, ask, log, reasons)
        if got:
            return got[0], got[1].scaling, got[1].bits
        if not f.fallback:
            break
        nxt = FORMATS[f.fallback]
        log.add("fp8_scaling", f.scaling, nxt.scaling, f"{f.scaling} requested: {'; '.join(reasons)} → per-tensor "
                f"({nxt.scaling}) {nxt.label}", fallback=True)
        f = nxt
    emulation = _emulation_why(f, f.engine(EMULATED), ask)
    where = "no GPU with SM >= 8.9 here" if not any(g.capabilities.get("fp8") for g in env.gpus) else \
        "; ".join(r for r in reasons if r != emulation)
    alt = env.best_precision
    log.add(f.kind, _want(f, backend), f"none ({alt})", f"{f.kind} requested: {where}, and {emulation} → {alt}",
            fallback=True)
    return None, None, alt
