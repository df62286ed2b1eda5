"""`resolve(recipe, env)`: what actually runs here, field by field, and why.

Every field records the backend chosen; where the request could not be met, the fallback and
its reason in words a user can act on. `strict=True` raises `RecipeUnavailable` instead.

The `auto` order, and the figures behind it (from the engines' own published numbers, cited below;
our own bench results refine them):
- precision: the environment's best precision (bf16 on Ampere+, fp16 on Volta/Turing, fp32 on
  a CPU without working bf16 units, where bf16 measured ~70x slower). FP8 is never automatic:
  without torch.compile and on small shapes it is often slower than bf16 (an FP8 FFN 3.14 ms
  vs 0.92 ms fp16 in pytorch/ao torchao/float8/README.md), so `overdrive bench` measures it
  before you pick it.
- FP8 backend: Transformer Engine (fused FP8 kernels, 1.5x over TE bf16 on H100: NVIDIA/TransformerEngine
  docs/examples/quickstart.ipynb) > torchao (+10-28% over bf16 with compile on 8xH100: pytorch/ao
  torchao/float8/README.md, pytorch/torchtitan docs/float8.md) > torchao emulation (numerics only) > no FP8.
  Under torch.compile torchao comes first: te.Linear.forward is torch._dynamo.disable'd in every TE 2.x
  (TE_COMPILE_BREAKS), so the graph would break at each TE linear; torchao's float8 is traced into it.
- optimizer: torch fused AdamW (one kernel for all parameters; Apex FusedAdam's 10-15% edge
  predates torch's fused=True) > Apex FusedAdam > foreach > for-loop.
- norm: under compile, torch (inductor fuses norms; hand-written kernels can break graphs);
  FP8 via Transformer Engine, TE's norms; otherwise Liger > Apex > torch on GPU; torch on CPU.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from overdrive.env import EnvReport
from overdrive.formats import TE, find_format
from overdrive.recipes.lowp import TE_AC_CONFLICT, TE_COMPILE_BREAKS, resolve_format, te_has_current_scaling
from overdrive.recipes.names import get_recipe
from overdrive.recipes.recipe import Recipe

__all__ = ["resolve", "ResolvedRecipe", "Decision", "RecipeUnavailable", "TE_AC_CONFLICT", "TE_COMPILE_BREAKS"]


class RecipeUnavailable(RuntimeError):
    """strict=True and a requested backend cannot run here; the message says why."""


@dataclass(frozen=True, kw_only=True)
class Decision:
    field: str
    requested: str
    chosen: str
    reason: str
    fallback: bool = False


@dataclass(frozen=True, kw_only=True)
class ResolvedRecipe:
    recipe: Recipe
    device: str
    precision: str
    """fp32 | fp16 | bf16 | fp8 (what runs)."""
    autocast_dtype: str | None
    """"bfloat16" / "float16" under torch.autocast, None for fp32."""
    grad_scaler: bool
    fp8_backend: str | None
    """transformer_engine | torchao | emulated | None."""
    fp8_scaling: str | None
    optimizer: str
    norm: str
    loss: str
    compile: str
    activation_checkpointing: str
    checkpoint_every: int
    fp8_min_dim: int
    fp8_convert_head: bool
    decisions: tuple[Decision, ...] = field(default_factory=tuple)

    @property
    def fallbacks(self) -> list[Decision]:
        return [d for d in self.decisions if d.fallback]

    @property
    def emulated(self) -> bool:
        """FP8 runs emulated: numerics only, never to be reported as a speedup."""
        return self.fp8_backend == "emulated"

    def to_dict(self) -> dict:
        d = asdict(self)
        d["recipe"] = self.recipe.to_dict()
        d["decisions"] = [asdict(x) for x in self.decisions]
        d["emulated"] = self.emulated
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "ResolvedRecipe":
        d = dict(d)
        d.pop("emulated", None)
        d["recipe"] = Recipe(**d["recipe"])
        d["decisions"] = tuple(Decision(**x) for x in d["decisions"])
        return cls(**d)


class _Log:
    def __init__(self, strict: bool) -> None:
        self.strict, self.items = strict, []

    def add(self, fld: str, requested: str, chosen: str, reason: str, fallback: bool = False) -> str:
        if fallback and self.strict:
            raise RecipeUnavailable(f"{fld}: {reason}")
        self.items.append(Decision(field=fld, requested=requested, chosen=chosen, reason=reason, fallback=fallback))
        return chosen


def _precision(r: Recipe, env: EnvReport, log: _Log) -> str:
    req = r.precision
    if req == "auto":
        return log.add("precision", req, env.best_precision, env.best_precision_reason)
    if req == "fp32":
        return req
    if env.gpus:
        g = env.gpus[0]
        if req == "bf16" and not g.capabilities["bf16"]:
            alt = "fp16" if g.capabilities["fp16"] else "fp32"
            return log.add("precision", req, alt, f"bf16 requested: {g.name} (SM {g.cc[0]}.{g.cc[1]}) has no bf16 "
                                                  f"tensor cores → {alt}" + (" with GradScaler" if alt == "fp16" else ""),
                           fallback=True)
        return log.add("precision", req, req, f"{req} autocast on {g.name}")
    note = ""
    if req != env.best_precision:
        note = f" (runs, but {env.best_precision} is faster here: {env.best_precision_reason})"
    return log.add("precision", req, req, f"{req} autocast on CPU{note}")


def _low_precision(r: Recipe, env: EnvReport, log: _Log, compile_mode: str, own_checkpointing: bool
                   ) -> tuple[str | None, str | None, str, str]:
    """(backend, scaling, precision that runs, compile mode) for a low-precision recipe (`recipes.lowp`).
    `own_checkpointing`: the model recomputes its blocks itself (Hugging Face gradient checkpointing),
    which conflicts with TE's FP8 as the recipe's would."""
    recompute = TE_AC_CONFLICT if r.activation_checkpointing != "none" else \
        f"the model's own gradient checkpointing is on: {TE_AC_CONFLICT}" if own_checkpointing else None
    backend, scaling, precision = resolve_format(r.fp8_scaling, r.fp8_backend, env, log,
                                                 compiled=compile_mode != "off", recompute=recompute)
    if backend == TE and find_format(scaling).te_eager_only and compile_mode != "off":
        if te_has_current_scaling(env.engine(TE).version):
            log.add("fp8_scaling", scaling, "tensorwise", "TE DelayedScaling fails under torch.compile → "
                    "current (tensorwise) scaling", fallback=True)
            scaling = "tensorwise"
        else:
            compile_mode = log.add("compile", r.compile, "off", "TE DelayedScaling fails under torch.compile "
                                   "and this TE has no current scaling (TE < 2.2) → eager", fallback=True)
    return backend, scaling, precision, compile_mode


def _compile(r: Recipe, env: EnvReport, log: _Log) -> str:
    if r.compile == "off":
        return log.add("compile", "off", "off", "eager")
    st = env.engine("torch.compile")
    if st.ok and r.compile == "max-autotune":
        # "max-autotune" turns on CUDA graphs, which in a training loop replay over buffers that the
        # optimizer and any tensor kept across steps (teacher logits) overwrite; inductor's own
        # training-safe variant keeps the autotuned kernels without the graphs.
        return log.add("compile", r.compile, "max-autotune-no-cudagraphs",
                       "torch.compile(mode='max-autotune-no-cudagraphs'): max-autotune's CUDA graphs are "
                       "unsafe in training (buffers reused across steps)")
    if st.ok:
        return log.add("compile", r.compile, r.compile, f"torch.compile(mode={r.compile!r})")
    return log.add("compile", r.compile, "off", f"compile requested: {st.reason} → eager", fallback=True)


def _loss(r: Recipe, env: EnvReport, log: _Log) -> str:
    if r.loss != "fused-linear-cross-entropy":
        return log.add("loss", r.loss, r.loss, "torch cross-entropy")
    lg = env.engine("liger_kernel")
    if lg.ok:
        return log.add("loss", r.loss, r.loss, "Liger fused linear cross-entropy: logits never materialised")
    why = lg.reason if lg.status != "missing" else "liger-kernel is not installed"
    return log.add("loss", r.loss, "cross-entropy", f"fused linear cross-entropy requested: {why} → "
                   "torch cross-entropy", fallback=True)


def _optimizer(r: Recipe, env: EnvReport, log: _Log) -> str:
    req = r.optimizer
    apex, fused = env.engine("apex"), env.engine("fused_adamw")
    if req == "apex":
        if apex.ok:
            return log.add("optimizer", req, "apex", "Apex FusedAdam (amp_C multi-tensor kernel)")
        alt = "torch-fused" if fused.ok else "foreach"
        why = apex.reason if apex.status != "missing" else "apex is not installed"
        return log.add("optimizer", req, alt, f"apex FusedAdam requested: {why} → "
                       + ("torch fused AdamW" if alt == "torch-fused" else "torch foreach AdamW"), fallback=True)
    if req == "torch-fused":
        if fused.ok:
            return log.add("optimizer", req, req, "torch.optim.AdamW(fused=True)")
        return log.add("optimizer", req, "foreach", f"fused AdamW requested: {fused.reason} → foreach AdamW",
                       fallback=True)
    if req in ("foreach", "for-loop"):
        return log.add("optimizer", req, req, f"torch AdamW, {req} implementation")
    if fused.ok:
        return log.add("optimizer", req, "torch-fused", "torch fused AdamW: one kernel over all parameters "
                       "(Apex FusedAdam's 10-15% edge predates fused=True)")
    if apex.ok:
        return log.add("optimizer", req, "apex", f"Apex FusedAdam (torch fused AdamW: {fused.reason})")
    return log.add("optimizer", req, "foreach", f"torch foreach AdamW (fused: {fused.reason})")


def _norm(r: Recipe, env: EnvReport, log: _Log, fp8_backend: str | None, compile_mode: str) -> str:
    req = r.norm
    names = {"transformer_engine": "transformer_engine", "apex": "apex", "liger": "liger_kernel"}
    if req == "torch":
        return log.add("norm", req, "torch", "torch LayerNorm/RMSNorm")
    if req in names:
        st = env.engine(names[req])
        if st.ok:
            return log.add("norm", req, req, f"fused {req} norms")
        why = st.reason if st.status != "missing" else f"{names[req]} is not installed"
        # Apex's FusedLayerNorm silently runs F.layer_norm on CPU: say what really runs.
        return log.add("norm", req, "torch", f"{req} norms requested: {why} → torch norms", fallback=True)
    if not env.gpus:
        return log.add("norm", req, "torch", "on CPU the fused norm kernels (TE, Apex, Liger) do not run; "
                       "torch's own norms")
    if compile_mode != "off":
        return log.add("norm", req, "torch", "under torch.compile inductor fuses torch's norms; hand-written "
                       "kernels can break the graph")
    if fp8_backend == "transformer_engine":
        return log.add("norm", req, "transformer_engine", "Transformer Engine norms alongside TE FP8 linears")
    for cand in ("liger", "apex"):
        if env.engine(names[cand]).ok:
            return log.add("norm", req, cand, f"{cand} fused norm kernel")
    return log.add("norm", req, "torch", "no fused norm engine works here (Liger/Apex); torch norms")


def resolve(recipe: str | Recipe, env: EnvReport, *, strict: bool = False,
            model_checkpointing: bool = False) -> ResolvedRecipe:
    """Decide, for every field of `recipe`, what runs on the machine `env` describes.
    `model_checkpointing`: the model's own (Hugging Face) gradient checkpointing is on; Transformer
    Engine's FP8 is then not chosen, as with the recipe's activation checkpointing (TE_AC_CONFLICT)."""
    r = get_recipe(recipe)
    log = _Log(strict)
    from overdrive.recipes.names import ecosystem_note

    if isinstance(recipe, str) and ecosystem_note(recipe):  # said under Overdrive's name, so the user sees what ran
        log.add("recipe", recipe, r.name, ecosystem_note(recipe))
    compile_mode = _compile(r, env, log)
    fp8_backend = fp8_scaling = None
    if find_format(r.fp8_scaling) and r.precision == find_format(r.fp8_scaling).bits:
        fp8_backend, fp8_scaling, precision, compile_mode = _low_precision(r, env, log, compile_mode,
                                                                           model_checkpointing)
    else:
        precision = _precision(r, env, log)
    if fp8_backend:
        # FP8/FP4 covers the linears; the rest runs under bf16 autocast where bf16 is fast.
        base = "bf16" if (env.gpus and env.gpus[0].capabilities["bf16"]) or env.best_precision == "bf16" else "fp32"
        if fp8_backend == "emulated":
            base = "fp32"  # emulation studies FP8 numerics in isolation: the rest stays fp32
    else:
        base = precision
    autocast = {"bf16": "bfloat16", "fp16": "float16"}.get(base)
    loss = _loss(r, env, log)
    opt = _optimizer(r, env, log)
    norm = _norm(r, env, log, fp8_backend, compile_mode)
    ac = r.activation_checkpointing
    log.add("activation_checkpointing", ac, ac, {"none": "no recomputation",
                                                  "selective": f"every {r.checkpoint_every}th block recomputed",
                                                  "full": "every block recomputed in backward"}[ac])
    return ResolvedRecipe(
        recipe=r, device=env.device, precision=precision, autocast_dtype=autocast, grad_scaler=(base == "fp16"),
        fp8_backend=fp8_backend, fp8_scaling=fp8_scaling, optimizer=opt, norm=norm, loss=loss,
        compile=compile_mode, activation_checkpointing=ac, checkpoint_every=r.checkpoint_every,
        fp8_min_dim=r.fp8_min_dim, fp8_convert_head=r.fp8_convert_head, decisions=tuple(log.items),
    )
