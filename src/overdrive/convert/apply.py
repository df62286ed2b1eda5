"""The one recipe applier: `accelerate()` and `overdrive train` both put a ResolvedRecipe on a model here.

Order (torchtitan's): norms (or Liger's model patches) -> FP8 linears -> activation checkpointing ->
compile -> FSDP2 `fully_shard` per repeated block, then the root. Every change the applier makes
to what `resolve` decided (compile off under FSDP, the AdamW that really runs, FP8 all-gather) is
appended to the ResolvedRecipe as a Decision, so `report()` and `recipe.json` say what ran.

    applied = apply_recipe(model, resolved, fsdp=True, world=2)
    with applied.autocast():          # torch autocast and/or Transformer Engine's FP8 autocast
        loss = applied.model(x).loss
    ...; optimizer.step(); applied.after_optimizer_step()
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from torch import nn

from overdrive.convert.checkpointing import (apply_activation_checkpointing, find_block_groups, hf_checkpointing_on,
                                             prepare_hf_model)
from overdrive.convert.fp8 import convert_fp8, te_autocast, te_fp8_recipe, torchao_recomputes_weights
from overdrive.convert.liger import apply_liger_model_patches
from overdrive.convert.norms import convert_norms
from overdrive.convert.swap import LayerDecision
from overdrive.recipes import Decision, ResolvedRecipe
from overdrive.formats import get_format
from overdrive.recipes.resolve import TE_AC_CONFLICT

__all__ = ["apply_recipe", "Applied", "optimizer_under_fsdp", "prepare_teacher", "wrap_forward_in"]


@dataclass
class Applied:
    """What the applier did to a model, and the contexts/hooks the training loop needs."""

    model: nn.Module
    resolved: ResolvedRecipe
    """The resolved recipe with the applier's own decisions appended (what really runs)."""
    conversions: dict[str, list[LayerDecision]] = field(default_factory=dict)
    checkpointed: list[str] = field(default_factory=list)
    sharded: list[str] = field(default_factory=list)
    """fqns given to `fully_shard` (blocks, then "" for the root); empty without FSDP."""
    fsdp: bool = False
    world: int = 1
    fp8_all_gather: bool = False
    """torchao FP8 weights all-gathered in float8 under FSDP2 (scales precomputed after each step)."""
    _te_recipe: object = None

    @property
    def optimizer(self) -> str:
        return self.resolved.optimizer

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        """The torch.autocast dtype the forward needs. Under FSDP2 its MixedPrecisionPolicy casts the
        parameters; for bf16 that is all (torchtitan's setup), but fp16 keeps autocast on top: without
        it softmax, norms and the loss would run in fp16 itself (autocast runs them in fp32)."""
        if not self.resolved.autocast_dtype or (self.fsdp and self.resolved.autocast_dtype != "float16"):
            return None
        return getattr(torch, self.resolved.autocast_dtype)

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        """The forward's context: torch autocast (bf16/fp16) and, for TE FP8, TE's FP8 autocast."""
        with contextlib.ExitStack() as stack:
            dt = self.autocast_dtype
            if dt is not None:
                stack.enter_context(torch.autocast(torch.device(self.resolved.device).type, dtype=dt))
            if self._te_recipe is not None:
                stack.enter_context(te_autocast(self._te_recipe))
            yield

    def grad_scaler(self) -> torch.amp.GradScaler | None:
        """fp16's loss scaler. Under FSDP2 on 2+ ranks, ShardedGradScaler: torch.amp.GradScaler never
        all-reduces found_inf, so ranks would disagree on skipping a step and on the scale."""
        if not self.resolved.grad_scaler:
            return None
        dev = torch.device(self.resolved.device).type
        if self.fsdp and self.world > 1:
            from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

            return ShardedGradScaler(dev)
        return torch.amp.GradScaler(dev)

    def after_optimizer_step(self) -> None:
        """torchtitan's post-optimizer hook: with FP8 all-gather, compute every FP8 weight's scale in one
        all-reduce (instead of one per weight inside the next forward)."""
        if self.fp8_all_gather:
            from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

            precompute_float8_dynamic_scale_for_fsdp(self.model)


def optimizer_under_fsdp(impl: str, device: str) -> tuple[str, str | None]:
    """The AdamW implementation to run on FSDP2's DTensor parameters, and why it changed (None: kept).

    On CUDA torch's fused and foreach AdamW step DTensors; Apex FusedAdam does not know them. On CPU
    (gloo) the for-loop is the one that works for every torch we support."""
    if device == "cuda":
        if impl == "apex":
            return "torch-fused", "FSDP2 parameters are DTensors, which Apex FusedAdam cannot step → torch fused AdamW"
        return impl, None
    if impl == "for-loop":
        return impl, None
    return "for-loop", f"FSDP2 on CPU (gloo): DTensor parameters stepped by the for-loop AdamW, not {impl}"


def wrap_forward_in(model: nn.Module, ctx: Callable[[], contextlib.AbstractContextManager]) -> None:
    """Run `model.forward` under `ctx()` on every call (as HF Accelerate's prepare() does), on the
    instance so state_dict keys and the class stay the user's."""
    if getattr(model, "_overdrive_autocast", False):
        return
    orig = model.forward

    @functools.wraps(orig)
    def forward(*args, **kwargs):
        with ctx():
            return orig(*args, **kwargs)

    model.forward = forward
    model._overdrive_autocast = True


def _keep_state_dict_plain(model: nn.Module) -> None:
    """TE modules add `_extra_state` (FP8 scaling metadata) keys: hide them from state_dict() and
    accept state dicts without them, so checkpoints stay interchangeable with the original model."""

    def drop(module, state_dict, prefix, local_metadata):
        for k in [k for k in state_dict if k.endswith("._extra_state") or k == "_extra_state"]:
            del state_dict[k]

    def fill(module, state_dict, prefix, *args):
        for name, sub in module.named_modules():
            if hasattr(sub, "get_extra_state") and type(sub).__module__.startswith("transformer_engine"):
                key = f"{prefix}{name + '.' if name else ''}_extra_state"
                state_dict.setdefault(key, sub.get_extra_state())

    model.register_state_dict_post_hook(drop)
    model.register_load_state_dict_pre_hook(fill)


def _shard(model: nn.Module, autocast_dtype: str | None) -> list[str]:
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    # Compute in the recipe's dtype, reduce gradients in fp32 (bf16 sums lose bits over many ranks).
    mp = MixedPrecisionPolicy(param_dtype=getattr(torch, autocast_dtype), reduce_dtype=torch.float32) \
        if autocast_dtype else MixedPrecisionPolicy()
    done = []
    for fqn, blocks in find_block_groups(model):
        for i, b in enumerate(blocks):
            fully_shard(b, mp_policy=mp)
            done.append(f"{fqn}.{i}" if fqn else str(i))
    fully_shard(model, mp_policy=mp)
    return done + [""]


def prepare_teacher(teacher: nn.Module, applied: Applied) -> str:
    """A frozen distillation teacher beside the student `applied` was made for; returns what was done.

    Under FSDP2 the student's autocast is off (its MixedPrecisionPolicy casts the parameters), so a
    teacher left as it was would hold a full fp32 copy on every rank and run an fp32 forward each
    micro-step. It is sharded like the student instead (each repeated block, then the root), with the
    same parameter dtype: 1/world of it per rank, its forward in the recipe's compute dtype. Without
    FSDP it runs under the student's autocast context, as the loop calls it."""
    teacher.eval()
    for p in teacher.parameters():
        p.requires_grad_(False)
    if not applied.fsdp:
        return "teacher replicated, its forward under the student's autocast"
    dt = applied.resolved.autocast_dtype
    n = len(_shard(teacher, dt))
    return f"teacher sharded by FSDP2 like the student ({n} fully_shard calls), parameters in {dt or 'float32'}"


class _Notes(list):
    """The applier's own Decisions, appended to the resolved recipe's."""

    def __call__(self, fld: str, requested: str, chosen: str, reason: str, fallback: bool = False) -> None:
        self.append(Decision(field=fld, requested=requested, chosen=chosen, reason=reason, fallback=fallback))


def _place(model: nn.Module, resolved: ResolvedRecipe, fsdp: bool, decide: _Notes) -> None:
    if resolved.fp8_backend == "transformer_engine" and hf_checkpointing_on(model):  # before any change
        raise ValueError(f"{type(model).__name__} has its own (Hugging Face) gradient checkpointing on, and "
                         f"{TE_AC_CONFLICT}: call model.gradient_checkpointing_disable(), or resolve with "
                         "model_checkpointing=True (accelerate() does) so torchao runs the FP8")
    if fsdp and resolved.norm == "torch" and resolved.fp8_backend != "transformer_engine":
        # fully_shard moves only the states it manages to the mesh's device, one call at a time
        # (torch/distributed/fsdp/_fully_shard/_fsdp_init.py `_move_states_to_device`): left where they
        # are, each rank holds its shards plus one full block at a time, not the whole fp32 model (a 7B
        # model is 28 GB before sharding). The swaps below follow the weights' device.
        decide("placement", "device", "moved by fully_shard", f"FSDP2 moves each block to {resolved.device} as it "
               "shards it: one full block at a time on the device, never the whole model")
    else:
        # Liger/Apex norm kernels are checked on the device, and TE modules are built there: the whole
        # model goes first (under FSDP2 that is a full copy per rank until it is sharded).
        model.to(torch.device(resolved.device))


def _norms(model: nn.Module, resolved: ResolvedRecipe, decide: _Notes) -> dict[str, list[LayerDecision]]:
    conversions: dict[str, list[LayerDecision]] = {}
    if resolved.norm == "liger":
        patched = apply_liger_model_patches(model, fused_linear_cross_entropy=resolved.loss ==
                                            "fused-linear-cross-entropy")
        decide("liger_patches", "liger", patched.summary, patched.reason)
        if patched.applied:
            conversions["liger"] = patched.decisions
    if resolved.norm != "torch" and "liger" not in conversions:
        conversions["norm"] = convert_norms(model, resolved.norm)
    return conversions


def _low_precision(model: nn.Module, resolved: ResolvedRecipe, fsdp: bool, module_filter_fn, decide: _Notes,
                   changes: dict) -> tuple[list[LayerDecision], bool]:
    """The format's linears; (their decisions, whether FSDP2 all-gathers them in float8)."""
    fmt = get_format(resolved.fp8_scaling)
    # torchao's float8 all-gather needs per-tensor scales (`Format.fsdp_float8_all_gather`); others gather bf16.
    on_torchao = resolved.fp8_backend in ("torchao", "emulated")
    all_gather = fsdp and on_torchao and fmt.fsdp_float8_all_gather
    decs = convert_fp8(model, backend=resolved.fp8_backend, scaling=resolved.fp8_scaling,
                       min_dim=resolved.fp8_min_dim, convert_head=resolved.fp8_convert_head,
                       module_filter_fn=module_filter_fn, enable_fsdp_float8_all_gather=all_gather)
    if fsdp and on_torchao:
        decide("fp8_all_gather", "fsdp", "float8" if all_gather else "bf16",
               "FP8 weights all-gathered in float8, scales precomputed in one all-reduce after each "
               "optimizer step (torchtitan's order)" + (
                   "; each weight's float8 transpose recomputed in the backward (torchao < 0.12: "
                   "force_recompute_fp8_weight_in_bwd, else compile keeps a float8 copy of every gathered "
                   "weight)" if torchao_recomputes_weights() else "") if all_gather else
               f"{resolved.fp8_scaling} scaling has no float8 all-gather in torchao: weights all-gathered "
               "in high precision")
    if not any(d.converted for d in decs):
        # Nothing runs in FP8: say what does (the base precision), so labels and the MFU peak follow.
        base = {"bfloat16": "bf16", "float16": "fp16"}.get(resolved.autocast_dtype or "", "fp32")
        decide("fp8_layers", "fp8", "none converted", "no linear layer was converted to FP8 (see the per-layer "
               f"reasons): this recipe had no FP8 effect on this model, which runs in {base}", fallback=True)
        changes.update(precision=base, fp8_backend=None, fp8_scaling=None)
        all_gather = False
    return decs, all_gather


def _compile(model: nn.Module, resolved: ResolvedRecipe, fsdp: bool, decide: _Notes, changes: dict) -> None:
    # Regional compilation (torchtitan's order; Accelerate's `compile_regions`): each repeated block
    # compiled in place, so one graph serves all N of them (dynamo reuses it across identical blocks),
    # where a whole-model graph unrolls every block: N times the tracing and codegen of a cold compile
    # (cpu-teacher: 40 s against 68 s, the step no slower). In place (nn.Module.compile) so state_dict
    # keys carry no "_orig_mod." prefix. Under FSDP2 the blocks are compiled before fully_shard, whose
    # hooks stay outside the graphs (`skip_fsdp_hooks`).
    mode = None if resolved.compile == "default" else resolved.compile
    blocks = [b for _, bl in find_block_groups(model) for b in bl]
    for b in blocks:
        b.compile(mode=mode)
    if blocks:
        decide("compile", resolved.compile, f"{resolved.compile} per block",
               (f"FSDP2: each of the {len(blocks)} repeated blocks compiled before fully_shard (torchtitan's order)"
                if fsdp else f"each of the {len(blocks)} repeated blocks compiled in place: one graph serves "
                "them all (a whole-model graph compiles each block again)") + "; the rest stays eager")
    elif fsdp:
        changes["compile"] = "off"
        decide("compile", resolved.compile, "off", "FSDP2: no repeated blocks to compile one by one, and "
               "the root is sharded eagerly", fallback=True)
    else:
        model.compile(mode=mode)


def _fsdp(model: nn.Module, resolved: ResolvedRecipe, world: int, decide: _Notes, changes: dict) -> list[str]:
    impl, why = optimizer_under_fsdp(resolved.optimizer, resolved.device)
    if why:
        changes["optimizer"] = impl
        decide("optimizer", resolved.optimizer, impl, why, fallback=True)
    sharded = _shard(model, resolved.autocast_dtype)
    decide("fsdp", "fsdp", f"fully_shard x{len(sharded)}", f"FSDP2 on {world} rank(s): each repeated block, "
           "then the root" + (f"; parameters in {resolved.autocast_dtype}, gradients reduced in float32"
                              if resolved.autocast_dtype else "")
           + ("; fp16 autocast kept on top (softmax, norms and loss in fp32)"
              if resolved.autocast_dtype == "float16" else ""))
    if resolved.grad_scaler and world > 1:
        decide("grad_scaler", "GradScaler", "ShardedGradScaler", "fp16 under FSDP2: found_inf all-reduced "
               "across ranks so every rank skips the same steps")
    return sharded


def apply_recipe(model: nn.Module, resolved: ResolvedRecipe, *,
                 module_filter_fn: Callable[[nn.Module, str], bool] | None = None,
                 fsdp: bool = False, world: int = 1) -> Applied:
    """Convert `model` in place per `resolved`; returns what was done and the loop's contexts."""
    decide, changes = _Notes(), {}
    _place(model, resolved, fsdp, decide)
    conversions = _norms(model, resolved, decide)
    fp8_all_gather = False
    if resolved.fp8_backend:
        conversions["fp8"], fp8_all_gather = _low_precision(model, resolved, fsdp, module_filter_fn, decide, changes)
    if any(type(m).__module__.startswith("transformer_engine") for m in model.modules()):
        _keep_state_dict_plain(model)
    checkpointed: list[str] = []
    if resolved.activation_checkpointing != "none":
        for note in prepare_hf_model(model):
            decide("activation_checkpointing", resolved.activation_checkpointing, note[0], note[1])
        checkpointed = apply_activation_checkpointing(model, resolved.activation_checkpointing,
                                                      resolved.checkpoint_every)
    if resolved.compile != "off":
        _compile(model, resolved, fsdp, decide, changes)
    sharded = _fsdp(model, resolved, world, decide, changes) if fsdp else []
    res = dataclasses.replace(resolved, decisions=resolved.decisions + tuple(decide), **changes)
    te_recipe = te_fp8_recipe(res.fp8_scaling) if res.fp8_backend == "transformer_engine" else None
    return Applied(model=model, resolved=res, conversions=conversions, checkpointed=checkpointed,
                   sharded=sharded, fsdp=fsdp, world=world, fp8_all_gather=fp8_all_gather, _te_recipe=te_recipe)
