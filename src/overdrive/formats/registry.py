"""`Format`: one frozen record per low-precision format, and `FORMATS`, the registry everyone iterates.

What a format is, in one place: its bits (which peak MFU is measured against), the engines that run it in
preference order (each with its version gate, shape rules and converter), which layers stay in high
precision, the loss the quality judge allows, the FSDP all-gather, the planner's bytes and its words.
`recipes.resolve`, `convert`, `plan`, `report.doctor`, the labels and the quality judge read these
records; none of them names a format. A new variant is one `Format` here (or `FORMATS[name] = ...`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from overdrive.formats.shape_rules import SHAPE_RULES, EngineRules

__all__ = ["CastBytes", "Engine", "Format", "FORMATS", "get_format", "find_format", "format_of", "version_tuple",
           "HIGH_PRECISION_TOLERANCE", "loss_tolerance", "kinds", "TE", "TORCHAO", "EMULATED", "engine_rules",
           "tokens_multiple", "dims_multiple", "planned_format", "planned_presets"]

TE, TORCHAO, EMULATED = "transformer_engine", "torchao", "emulated"


def version_tuple(v: str | None) -> tuple[int, ...]:
    """"2.8.0+cu12" -> (2, 8, 0); unknown -> ()."""
    out = []
    for part in (v or "").split("+")[0].split("."):
        digits = "".join(ch for ch in part if ch.isdigit())
        if not digits:
            break
        out.append(int(digits))
    return tuple(out)


@dataclass(frozen=True)
class CastBytes:
    """HBM bytes per element that quantising a GEMM operand moves in one micro-batch, beyond the GEMMs' own reads
    (the planner's cast time), each role as (forward, backward) bytes: a recompute repeats the forward part. Read
    from each engine's source:

    - current (dynamic) tensorwise scaling, torchao's float8 (torchao/testing/training/roofline_utils.py
      `get_tensor_memory_traffic_ovhd_s`, its model of its own compiled kernels, "tensorwise"): an amax pass reads
      the bf16 tensor (2), then one kernel reads it again and writes both FP8 layouts (2 + 1 + 1): 6 per input, in
      the forward, and per gradient, in the backward; a weight 2 + 3 forward and 3 more to recast its transposed
      layout in the backward. Transformer Engine's Float8CurrentScaling has the same amax-then-cast shape;
    - row-wise scaling (the same file, "rowwise"): an input or gradient 5 (FP8 row-major and a bf16 transposed copy)
      + 3 (that copy cast); a weight 3 forward, 4 + 3 backward;
    - delayed scaling (Transformer Engine 1.x, `recipe.DelayedScaling`): the scale is the last micro-batch's, so the
      amax is taken inside the casting kernel. A norm feeding a `LayerNormLinear` writes its output in FP8 itself
      (`layernorm_fwd_fp8`), and the backward transposes it (`fp8_transpose`, 1 + 1); any other input and each
      gradient go through one fused cast+transpose (`fp8_cast_transpose_fused`, 2 + 1 + 1); a weight the same 4,
      cached for the rest of the step when the trainer passes `is_first_microbatch` (Megatron-Core does). With
      sequence parallelism or frozen weights Transformer Engine 1.x casts (3) and transposes later (2) instead: not
      planned, a byte more per element there;
    - MXFP8 (the same file, "mxfp8_cublas"): two casts per operand, one per layout, each reading bf16 and writing
      FP8 with an E8M0 scale per 32 elements;
    - a format that sets only `Format.plan_bytes` (NVFP4): the first count the planner had, 2 x `plan_bytes` per
      input and weight element in each of the three passes (a third of it forward), `plan_bytes` per gradient
      element in each (`Format.cast_bytes`).

    The stack decides how often (throughput.py `_cast_bytes`): Megatron casts each norm output once for the GEMMs it
    feeds and its weights once a step; the PyTorch stack casts each linear's input and its weights every
    micro-batch."""

    norm_input: tuple[float, float]
    """An input a norm writes (Transformer Engine's LayerNormLinear: QKV, FC1), once per distinct tensor."""
    input: tuple[float, float]
    """Any other GEMM input, and every input on a stack whose linears each cast their own."""
    grad: tuple[float, float]
    """The gradient entering each GEMM's backward, both layouts."""
    weight: tuple[float, float]
    """A weight element each time it is cast."""


@dataclass(frozen=True, kw_only=True)
class Engine:
    """One engine that runs a format: its backend, what it calls, since which release, its shape rules."""

    backend: str
    """"transformer_engine" | "torchao" | "emulated" (numerics only, never a speedup)."""
    converter: str
    """The module swap in `convert` that builds its linears (a key of `convert.fp8.CONVERTERS`)."""
    rules: EngineRules
    """The GEMM shape rules it enforces (`formats.shape_rules`, each cited): tokens padded, dims filtered."""
    api: str = ""
    """What it is configured with: Transformer Engine's recipe class, torchao's recipe name, the probe key."""
    since: tuple[int, ...] = ()
    """First Transformer Engine release with `api` (TE's API docs and release notes); () = no gate."""
    older: str | None = None
    """Format that runs instead on a Transformer Engine older than `since` (None: the engine cannot run it)."""
    unsupported: str = ""
    """Said when the engine is asked for this format and has no such scaling; it is then passed over."""
    instead: str | None = None
    """Format this engine runs in place of this one (logged as a fallback), with `instead_why`."""
    instead_why: str = ""

    def predates(self, version: str | None) -> bool:
        """The installed release predates this engine's recipe (an unknown version is assumed new enough)."""
        v = version_tuple(version)
        return bool(v and self.since and v < self.since)


@dataclass(frozen=True, kw_only=True)
class Format:
    name: str
    """Its one name, the same in recipes, plan and reports: "fp8-rowwise", "mxfp8", ..."""
    preset: str
    """The recipe preset and planner precision that train in it ("fp8" is per-tensor current scaling)."""
    aliases: tuple[str, ...] = ()
    """Other spellings users type (accepted everywhere the name is)."""
    bits: Literal["fp8", "fp4"]
    """The precision that runs (ResolvedRecipe.precision) and whose peak MFU is measured against."""
    scaling: str
    """Its `Recipe.fp8_scaling` value."""
    kind: str
    """The GPU capability it needs and its shape-rule family: per-tensor FP8 variants share "fp8"."""
    label: str
    """How reports write the format: "FP8", "MXFP8", "NVFP4"."""
    engines: tuple[Engine, ...]
    """In preference order for backend "auto"; the emulated engine last."""
    compile_engines: tuple[str, ...] = ()
    """The preference under torch.compile, when it differs (te.Linear breaks the graph; torchao is traced)."""
    min_cc: tuple[int, int] = (8, 9)
    """Lowest compute capability whose tensor cores run it."""
    cc_major: int | None = None
    """Only this SM major runs it (MXFP8: the data-center Blackwell parts, SM 10.x)."""
    probed: bool = False
    """The engines' probes report this format by name (is_<kind>_available, <kind>_ok, <kind>_smoke_ok)."""
    fallback: str | None = None
    """Format that runs instead where FP8 hardware lacks this one (rather than emulating it there)."""
    keep_leaves: tuple[str, ...] = ()
    """Linears with these names stay in bf16, with `keep_why`."""
    keep_why: str = ""
    keep_last_fraction: float = 0.0
    """Share of the last blocks kept in bf16."""
    loss_tolerance: float
    """Tail-mean loss difference to the fp32 baseline beyond which the quality judge calls it unsafe."""
    fsdp_float8_all_gather: bool = False
    """Under FSDP2 torchao all-gathers its weights in float8 (per-tensor scales only)."""
    tp_float8_gather: bool = False
    """Under tensor parallelism torchtitan casts each attention and FFN input once, on its sequence shard, and
    all-gathers it in float8 (`PrepareFloat8ModuleInput`, torchtitan bedb16a5: per-tensor scales only); the planner
    counts those two casts per block instead of one per linear."""
    plan_bytes: float | None = None
    """The planner's HBM bytes per quantised GEMM operand element (scales included); None: not planned."""
    plan_rel: str | None = None
    """Calibration key scaling its GEMM efficiency in the planner (row-wise scales cost more), if any."""
    plan_cast: CastBytes | None = None
    """The planner's cast traffic per element (`CastBytes`); unset, `cast_bytes` counts it from `plan_bytes`."""
    plan_default: bool = True
    """Searched by `overdrive plan` when --precision is not given (else planned only when asked for)."""
    stored_bytes: float = 1.0
    """Bytes one quantised element is kept in, its scales included (the planner's count of a cached weight): FP8 1,
    MXFP8 1 + an E8M0 scale per 32, NVFP4 half a byte + an E4M3 scale per 16."""
    tensor_scale: bool = False
    """One scale for the whole tensor, so its transpose can share it (on GPUs whose FP8 GEMMs take every layout, SM
    10.x, no columnwise copy is kept); per-row or per-block scales lie along one dimension and need their own."""
    emulation: str = ""
    """What its emulated engine computes (said in the decision log)."""
    torchtitan_mx: str | None = None
    """torchtitan's [quantize.linear.mx] recipe_name for it (`overdrive emit`), if it is an MX format there."""
    accelerate_te_flag: str | None = None
    """The flag of Accelerate's TE fp8_config that selects it (else DelayedScaling is what Accelerate runs)."""
    description: str = ""

    def cast_bytes(self) -> CastBytes | None:
        """The planner's cast traffic per element: `plan_cast`, else the first count it had, 3 passes x 2 bytes x
        `plan_bytes` per input and weight element and 3 x `plan_bytes` per gradient element; None when not
        planned."""
        if self.plan_cast is not None or self.plan_bytes is None:
            return self.plan_cast
        x = (2 * self.plan_bytes, 4 * self.plan_bytes)
        return CastBytes(norm_input=x, input=x, grad=(0.0, 3 * self.plan_bytes), weight=x)

    @property
    def te_eager_only(self) -> bool:
        """Transformer Engine runs it with `recipe.DelayedScaling`, which fails under torch.compile: compiled, the
        recipe resolves to current scaling instead (recipes/resolve.py), so it is planned eager."""
        te = self.engine(TE)
        return te is not None and te.api == "DelayedScaling"

    def engine(self, backend: str) -> Engine | None:
        return next((e for e in self.engines if e.backend == backend), None)

    def order(self, requested: str, *, compiled: bool = False) -> list[Engine]:
        """The real engines to try, for a backend request ("auto", an engine name, or "emulated": none)."""
        real = [e for e in self.engines if e.backend != EMULATED]
        if requested == EMULATED:
            return []
        if requested == "auto" and compiled and self.compile_engines:
            rank = {b: i for i, b in enumerate(self.compile_engines)}
            return sorted(real, key=lambda e: rank.get(e.backend, len(rank)))
        return sorted(real, key=lambda e: e.backend != requested)

    def runs_on(self, cc: tuple[int, int]) -> bool:
        """Whether a GPU of compute capability `cc` has tensor cores for it."""
        return tuple(cc) >= self.min_cc and (self.cc_major is None or cc[0] == self.cc_major)

    def words(self) -> str:
        return self.name if self.name == self.preset else f"{self.name} ({self.preset})"


def _r(key: str) -> EngineRules:
    return SHAPE_RULES[key]


_AO_FP8 = dict(backend=TORCHAO, converter="torchao-float8", rules=_r("torchao/fp8"))
_EMU_FP8 = Engine(backend=EMULATED, converter="torchao-float8", rules=_r("emulated/fp8"), api="emulate_ok")
_FP8_GPU = "FP8 tensor cores (SM >= 8.9)"
_MX_CAST = (2 + 1 + 1 / 32, 2 + 1 + 1 / 32)
"""MXFP8's cast per input or weight element: one layout in the forward, the other in the backward (each read 2,
write 1 and an E8M0 scale per 32)."""

_ALL = (
    Format(name="fp8-tensorwise", preset="fp8", aliases=("float8",), bits="fp8", scaling="tensorwise", kind="fp8",
           label="FP8",
           engines=(Engine(backend=TE, converter="te", rules=_r("transformer_engine/fp8"), api="Float8CurrentScaling",
                           since=(2, 2), older="fp8-delayed"),
                    Engine(**_AO_FP8, api="tensorwise"), _EMU_FP8),
           compile_engines=(TORCHAO, TE), loss_tolerance=0.05, fsdp_float8_all_gather=True, tp_float8_gather=True,
           plan_bytes=1.0,
           plan_cast=CastBytes(norm_input=(6, 0), input=(6, 0), grad=(0, 6), weight=(5, 3)), tensor_scale=True,
           emulation="torchao emulation",
           description="FP8 linears, per-tensor scaling (TE or torchao; emulated without FP8 hardware)"),
    Format(name="fp8-rowwise", preset="fp8-rowwise", aliases=("rowwise",), bits="fp8", scaling="rowwise", kind="fp8",
           label="FP8",
           engines=(Engine(backend=TE, converter="te", rules=_r("transformer_engine/fp8"),
                           unsupported="Transformer Engine has no rowwise scaling (torchao does)"),
                    Engine(**_AO_FP8, api="rowwise"), _EMU_FP8),
           compile_engines=(TORCHAO, TE), loss_tolerance=0.05, plan_bytes=1.0, plan_rel="rowwise_rel",
           plan_cast=CastBytes(norm_input=(5, 3), input=(5, 3), grad=(0, 8), weight=(3, 7)),
           emulation="torchao emulation", description="FP8 linears, row-wise scaling (torchao)"),
    Format(name="fp8-delayed", preset="fp8-delayed", aliases=("fp8-delayed-scaling",), bits="fp8", scaling="delayed",
           kind="fp8", label="FP8",
           engines=(Engine(backend=TE, converter="te", rules=_r("transformer_engine/fp8"), api="DelayedScaling",
                           since=(1, 0)),
                    Engine(**_AO_FP8, api="tensorwise", instead="fp8-tensorwise",
                           instead_why="delayed scaling is Transformer Engine only (torchao removed it) → tensorwise "
                                       "(current) scaling in torchao"),
                    Engine(backend=EMULATED, converter="torchao-float8", rules=_r("emulated/fp8"), api="emulate_ok",
                           instead="fp8-tensorwise")),
           compile_engines=(TORCHAO, TE), loss_tolerance=0.05, emulation="torchao emulation", tensor_scale=True,
           plan_bytes=1.0, plan_cast=CastBytes(norm_input=(0, 2), input=(4, 0), grad=(0, 4), weight=(4, 0)),
           plan_default=False,
           description="FP8 linears, delayed scaling (Transformer Engine)"),
    # MXFP8: E4M3 values, one E8M0 scale per 32 along the reduction dim (OCP MX 1.0). TE 2.0's API lists
    # MXFP8BlockScaling. torchtitan's MXFP8 runs keep the attention K/V projections in bf16: small in GQA
    # models and sensitive. +0.01 nats at 16B in torchao's DeepSeek-V3 run: FP8's tolerance.
    Format(name="mxfp8", preset="mxfp8", aliases=("mx", "mxfp8-block"), bits="fp8", scaling="mxfp8", kind="mxfp8",
           label="MXFP8",
           engines=(Engine(backend=TE, converter="te", rules=_r("transformer_engine/mxfp8"), api="MXFP8BlockScaling",
                           since=(2, 0)),
                    Engine(backend=TORCHAO, converter="torchao-mxfp8", rules=_r("torchao/mxfp8"), api="MXFP8_RCEIL"),
                    Engine(backend=EMULATED, converter="torchao-mxfp8", rules=_r("emulated/mxfp8"),
                           api="mxfp8_emulate_ok")),
           min_cc=(10, 0), cc_major=10, probed=True, fallback="fp8-tensorwise",
           keep_leaves=("wk", "wv", "k_proj", "v_proj"),
           keep_why="attention K/V projection stays in bf16 (torchtitan's MXFP8 runs skip wk/wv: small in GQA models "
                    "and sensitive)",
           loss_tolerance=0.05, plan_bytes=1.15, stored_bytes=1 + 1 / 32,
           plan_cast=CastBytes(norm_input=_MX_CAST, input=_MX_CAST, grad=(0, 2 * _MX_CAST[0]), weight=_MX_CAST),
           emulation="torchao's MXFP8_EMULATED_RCEIL recipe",
           torchtitan_mx="mxfp8_cublas", accelerate_te_flag="use_mxfp8_block_scaling",
           description="MXFP8 linears (TE or torchao on SM 10.x; emulated without FP8 hardware: quality only)"),
    # NVFP4: E2M1 values, one E4M3 scale per 16 and an fp32 scale per tensor; TE 2.7's recipe.Format has no E2M1,
    # 2.8 adds NVFP4BlockScaling. NVIDIA's NVFP4 pretraining recipe keeps ~16% of the linears, the final ones, in
    # bf16. Allowed twice FP8's loss gap: +0.05 nats at 16B in torchao's DeepSeek-V3 run against +0.01 for MXFP8.
    Format(name="nvfp4", preset="nvfp4", aliases=("fp4",), bits="fp4", scaling="nvfp4", kind="nvfp4", label="NVFP4",
           engines=(Engine(backend=TE, converter="te", rules=_r("transformer_engine/nvfp4"), api="NVFP4BlockScaling",
                           since=(2, 8)),
                    Engine(backend=TORCHAO, converter="torchao-nvfp4", rules=_r("torchao/nvfp4"),
                           api="NVFP4TrainingConfig"),
                    Engine(backend=EMULATED, converter="nvfp4-emulated", rules=_r("emulated/nvfp4"))),
           min_cc=(10, 0), probed=True, fallback="fp8-tensorwise", keep_last_fraction=0.16, loss_tolerance=0.10,
           plan_bytes=1.3, stored_bytes=0.5 + 1 / 16,
           emulation="E2M1 values, 16-element blocks, E4M3 block scales, round-to-nearest (no Hadamard transform or "
                     "stochastic rounding)",
           description="NVFP4 linears, last blocks in bf16 (TE or torchao on SM 10.x; emulated elsewhere: quality only)"),
)

FORMATS: dict[str, Format] = {f.name: f for f in _ALL}
"""Every low-precision format, by name, in the order reports list them. Add one here (a test may
`monkeypatch.setitem(FORMATS, name, Format(...))`): everyone reads this dict when asked."""

HIGH_PRECISION_TOLERANCE = {"fp32": 0.01, "bf16": 0.03, "fp16": 0.03}
"""The quality judge's allowance for the high precisions: fp32 variants differ only by summation order;
bf16 and fp16 keep 8 and 11 mantissa bits."""


def find_format(name: str | None) -> Format | None:
    """The format a name, preset, alias or `fp8_scaling` value means (case-insensitive), else None."""
    if not name:
        return None
    key = str(name).strip().lower()
    for f in FORMATS.values():
        if key in (f.name, f.preset, f.scaling, *f.aliases):
            return f
    return None


def get_format(name: str) -> Format:
    """`find_format`, or ValueError naming the formats."""
    f = find_format(name)
    if f is None:
        raise ValueError(f"unknown low-precision format {name!r}: formats are {', '.join(FORMATS)} "
                         "(overdrive.formats.FORMATS)")
    return f


def format_of(precision: str | None, fp8_scaling: str | None) -> Format | None:
    """The format a (resolved) recipe runs, None for the high precisions."""
    if precision not in {f.bits for f in FORMATS.values()}:
        return None
    return find_format(fp8_scaling) or find_format(precision)


def kinds() -> list[str]:
    """The distinct capability kinds ("fp8", "mxfp8", "nvfp4"), in registry order."""
    return list(dict.fromkeys(f.kind for f in FORMATS.values()))


def loss_tolerance(name: str) -> float:
    """The quality judge's tolerance for a precision ("bf16"), a format's name, preset or scaling, or a
    bits value ("fp8", "fp4": the loosest format of those bits). ValueError for anything else: an
    unknown precision never silently gets some other format's allowance."""
    if name in HIGH_PRECISION_TOLERANCE:
        return HIGH_PRECISION_TOLERANCE[name]
    f = find_format(name)
    if f is not None and name != f.bits:
        return f.loss_tolerance
    same_bits = [g.loss_tolerance for g in FORMATS.values() if g.bits == name]
    if same_bits:
        return min(same_bits)
    raise ValueError(f"no loss tolerance for precision {name!r}: give one of "
                     f"{', '.join([*HIGH_PRECISION_TOLERANCE, *FORMATS])} (overdrive.formats)")


def engine_rules(fmt: str, backend: str) -> EngineRules:
    """The shape rules of `fmt` (any name `find_format` knows) on `backend`."""
    f = find_format(fmt)
    eng = f.engine(backend) if f else None
    if eng is None:
        raise ValueError(f"no shape rules for {fmt} on {backend!r}: add its Engine to overdrive.formats.FORMATS")
    return eng.rules


def tokens_multiple(fmt: str, backend: str) -> int:
    """What the token count M is padded to before the engine sees it."""
    return engine_rules(fmt, backend).multiple("M")


def dims_multiple(fmt: str, backend: str) -> int:
    """What in_features and out_features must be divisible by (layers that are not stay in high precision)."""
    r = engine_rules(fmt, backend)
    return math.lcm(r.multiple("K"), r.multiple("N"))


def planned_format(precision: str) -> Format | None:
    """The format a planner precision names (its name or preset, modelled: `plan_bytes`); None otherwise."""
    f = next((f for f in FORMATS.values() if precision in (f.name, f.preset)), None)
    return f if f is not None and f.plan_bytes is not None else None


def planned_presets(default_only: bool = False) -> tuple[str, ...]:
    """The planner's low-precision precisions: each modelled format's preset, in registry order (`default_only`:
    those it searches when --precision is not given)."""
    return tuple(f.preset for f in FORMATS.values()
                 if f.plan_bytes is not None and (f.plan_default or not default_only))
