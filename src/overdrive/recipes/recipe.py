"""`Recipe`: what a user asks for, its presets and its name (a preset plus knobs, `recipe_name`). Frozen;
`resolve` decides what runs; `names` parses the names users type."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields
from typing import Literal

from overdrive.formats import FORMATS, find_format

__all__ = ["Recipe", "PRESETS", "FIELD_CHOICES", "ALIASES", "KNOBS", "presets", "recipe_name"]

Precision = Literal["auto", "fp32", "fp16", "bf16", "fp8", "fp4"]
FP8Scaling = str  # a format of `overdrive.formats.FORMATS`: its fp8_scaling value or its name
FP8Backend = Literal["auto", "transformer_engine", "torchao", "emulated"]
Optimizer = Literal["auto", "apex", "torch-fused", "foreach", "for-loop"]
Norm = Literal["auto", "transformer_engine", "apex", "liger", "torch"]
Loss = Literal["cross-entropy", "fused-linear-cross-entropy"]
Compile = Literal["off", "default", "max-autotune", "max-autotune-no-cudagraphs"]
Checkpointing = Literal["none", "selective", "full"]

FIELD_CHOICES: dict[str, tuple[str, ...]] = {
    "precision": ("auto", "fp32", "fp16", "bf16", "fp8", "fp4"),
    "fp8_scaling": tuple(f.scaling for f in FORMATS.values()),
    "fp8_backend": ("auto", "transformer_engine", "torchao", "emulated"),
    "optimizer": ("auto", "apex", "torch-fused", "foreach", "for-loop"),
    "norm": ("auto", "transformer_engine", "apex", "liger", "torch"),
    "loss": ("cross-entropy", "fused-linear-cross-entropy"),
    "compile": ("off", "default", "max-autotune", "max-autotune-no-cudagraphs"),
    "activation_checkpointing": ("none", "selective", "full"),
}


@dataclass(frozen=True, kw_only=True)
class Recipe:
    name: str = "custom"
    """Its name in the registry's grammar (`recipes.names`): a preset, or preset+knobs. Left "custom", it is
    written from the fields (closest preset + knobs), so every name printed parses back to this recipe."""
    precision: Precision = "auto"
    """fp32; fp16 (autocast + GradScaler); bf16 (autocast); fp8 (linears in FP8, the rest in bf16 on GPU);
    fp4 (linears in NVFP4, needs fp8_scaling=nvfp4); auto = the best precision the environment
    reports (never fp8/fp4: their gain depends on shapes and compile, so measure with `overdrive bench`)."""
    fp8_scaling: FP8Scaling = "tensorwise"
    """The low-precision format (`overdrive.formats.FORMATS`) by its scaling, or its name: tensorwise = per-tensor current scaling; delayed (Transformer
    Engine only); rowwise (torchao); mxfp8 (E4M3 with one E8M0 scale per 32 elements; SM 10.x or
    emulated); nvfp4 (E2M1 with one E4M3 scale per 16 elements and a per-tensor fp32 scale; fp4 only)."""
    fp8_backend: FP8Backend = "auto"
    """Which engine runs FP8: Transformer Engine, torchao, or torchao's emulation (numerics only)."""
    optimizer: Optimizer = "auto"
    """AdamW implementation: Apex FusedAdam, torch fused, torch foreach, or the plain for-loop."""
    norm: Norm = "auto"
    """LayerNorm/RMSNorm implementation."""
    loss: Loss = "cross-entropy"
    """Fused linear cross-entropy (Liger) never materialises the logits; needs a GPU."""
    compile: Compile = "off"
    """torch.compile mode."""
    activation_checkpointing: Checkpointing = "none"
    """none; selective (every `checkpoint_every`-th block); full (every block)."""
    checkpoint_every: int = 2
    """For selective checkpointing: checkpoint blocks 0, k, 2k, ..."""
    fp8_min_dim: int = 1024
    """Linears whose in or out features are below this stay in high precision on real FP8 hardware:
    below ~1K the quantisation overhead outweighs the faster GEMM (torchao/TE measurements)."""
    fp8_convert_head: bool = False
    """Convert the output head to FP8 too (off by default: it is the most sensitive layer)."""
    fp8_shapes: str = ""
    """A measured per-layer FP8 filter (what `overdrive tune` writes): only Linears whose
    "in_features x out_features" shape is listed go to FP8, e.g. "4096x11008,11008x4096"; empty =
    the size rule (`fp8_min_dim`). The head rule still applies."""

    def __post_init__(self) -> None:
        self._one_vocabulary()
        for f in fields(self):
            allowed = FIELD_CHOICES.get(f.name) if f.name != "fp8_scaling" else _scalings()
            v = getattr(self, f.name)
            if allowed and v not in allowed:
                raise ValueError(f"recipe field {f.name}={v!r} is not one of {', '.join(allowed)}")
        fmt = find_format(self.fp8_scaling)
        if self.precision != fmt.bits and (self.precision in _bits() or fmt.bits != find_format("tensorwise").bits):
            raise ValueError(f"precision={self.precision!r} with fp8_scaling={self.fp8_scaling!r}: {fmt.name} is "
                             f"precision={fmt.bits!r} (the {fmt.preset!r} preset)")
        for name, typ in (("checkpoint_every", int), ("fp8_min_dim", int), ("fp8_convert_head", bool), ("name", str),
                          ("fp8_shapes", str)):
            v = getattr(self, name)
            if not isinstance(v, typ) or (typ is int and isinstance(v, bool)):  # a hand-edited cache: "big"
                raise ValueError(f"recipe field {name}={v!r} is not {'an' if typ is int else 'a'} {typ.__name__}")
        if self.fp8_min_dim < 0:
            raise ValueError(f"fp8_min_dim must be >= 0, got {self.fp8_min_dim}")
        if self.checkpoint_every < 1:
            raise ValueError(f"checkpoint_every must be >= 1, got {self.checkpoint_every}")
        if self.name == "custom":
            object.__setattr__(self, "name", recipe_name(self))

    def _one_vocabulary(self) -> None:
        """A format's name said as the precision or the scaling (fp8-rowwise, mxfp8) sets both fields."""
        fmt = find_format(self.precision) if self.precision not in _bits() else None
        if fmt is not None:
            if self.fp8_scaling not in ("tensorwise", fmt.scaling) and find_format(self.fp8_scaling) is not fmt:
                raise ValueError(f"precision={self.precision!r} names the format {fmt.name}, but fp8_scaling="
                                 f"{self.fp8_scaling!r} another: give one")
            object.__setattr__(self, "precision", fmt.bits)
            object.__setattr__(self, "fp8_scaling", fmt.scaling)
        fmt = find_format(self.fp8_scaling)
        if fmt is not None and self.fp8_scaling != fmt.scaling:
            object.__setattr__(self, "fp8_scaling", fmt.scaling)

    def replace(self, **changes) -> "Recipe":
        """A copy with some fields changed; unless given, the name says what changed ("amp-bf16+compile")."""
        if "name" in changes or not changes:
            return dataclasses.replace(self, **changes)
        new = dataclasses.replace(self, **changes)
        return dataclasses.replace(new, name=recipe_name(new))

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def save(self, path: str) -> str:
        """Write this recipe as JSON (what `overdrive tune --out` writes as recipe.json)."""
        import json

        from overdrive.io import write_atomic

        write_atomic(path, json.dumps({"recipe": self.to_dict()}, indent=2) + "\n")
        return path

    @classmethod
    def load(cls, path: str) -> "Recipe":
        """Read a recipe.json (a bare field dict, or one under "recipe" as tune and `save` write it)."""
        from overdrive.errors import UserError
        from overdrive.io import load_json_bounded

        try:
            d = load_json_bounded(path, what="a recipe")
        except FileNotFoundError:
            raise UserError(f"recipe file {path} not found: pass the recipe.json that `overdrive tune --out DIR` "
                            "wrote") from None
        except (OSError, ValueError) as e:
            raise UserError(f"recipe file {path} is not readable JSON ({e}): re-run `overdrive tune --out DIR`") \
                from None
        d = d.get("recipe", d) if isinstance(d, dict) else d
        if not isinstance(d, dict):
            raise UserError(f"recipe file {path} holds no recipe object: re-run `overdrive tune --out DIR`")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise UserError(f"recipe file {path} has unknown field(s) {', '.join(unknown)}: it was written by "
                            "another Overdrive version; re-run `overdrive tune`")
        try:
            return cls(**d)
        except (TypeError, ValueError) as e:
            raise UserError(f"recipe file {path}: {e}") from None


def _scalings() -> tuple[str, ...]:
    return tuple(f.scaling for f in FORMATS.values())


def _bits() -> set[str]:
    return {f.bits for f in FORMATS.values()}


def format_preset(fmt) -> Recipe:
    """The preset recipe that trains in `fmt` (a `formats.Format`)."""
    return Recipe(name=fmt.preset, precision=fmt.bits, fp8_scaling=fmt.scaling)


PRESETS: dict[str, Recipe] = {
    "auto": Recipe(name="auto"),
    # Plain PyTorch, what every speedup is measured against: fp32, eager, for-loop AdamW, torch norms.
    "baseline": Recipe(name="baseline", precision="fp32", optimizer="for-loop", norm="torch"),
    "fp32": Recipe(name="fp32", precision="fp32"),
    "fp32-fused": Recipe(name="fp32-fused", precision="fp32", optimizer="torch-fused"),
    "amp-fp16": Recipe(name="amp-fp16", precision="fp16"),
    "amp-bf16": Recipe(name="amp-bf16", precision="bf16"),
    # One preset per low-precision format (`overdrive.formats`): fp8 (per-tensor), fp8-rowwise, ...
    **{f.preset: format_preset(f) for f in FORMATS.values()},
}


# What people type -> the preset it means. "no"/"none" follow HF Accelerate's mixed_precision="no".
ALIASES: dict[str, str] = {
    "bf16": "amp-bf16", "bfloat16": "amp-bf16", "amp": "amp-bf16",
    "fp16": "amp-fp16", "float16": "amp-fp16", "half": "amp-fp16",
    "no": "fp32", "none": "fp32", "float32": "fp32",
    "plain": "baseline", "eager": "baseline",
    # A low-precision format's name and spellings (`overdrive.formats`): fp8-tensorwise and float8 mean fp8.
    **{a: f.preset for f in FORMATS.values() for a in (f.name, *f.aliases) if a != f.preset},
}


def presets() -> dict[str, Recipe]:
    """PRESETS, and the preset of any format registered since (`overdrive.formats.FORMATS`)."""
    return {**PRESETS, **{f.preset: format_preset(f) for f in FORMATS.values() if f.preset not in PRESETS}}


def _preset_key(text: str) -> str:
    """The preset a head word means: a preset, an alias, or a format's name, preset or spelling."""
    head = text.lower()
    if head in ALIASES:
        return ALIASES[head]
    f = next((f for f in FORMATS.values() if head in (f.name, *f.aliases)), None)
    return f.preset if f else head


# Named knobs: each sets a few fields. Order matters only for printing (recipe_name uses it).
KNOBS: dict[str, dict] = {
    "compile": {"compile": "default"},
    # Not "max-autotune" itself in training: it turns on CUDA graphs (resolve maps it to the
    # no-cudagraphs mode); the knob keeps the user's word.
    "max-autotune": {"compile": "max-autotune"},
    "ckpt": {"activation_checkpointing": "full"},
    "ckpt-selective": {"activation_checkpointing": "selective"},
    "fused-ce": {"loss": "fused-linear-cross-entropy"},
    "fused-adamw": {"optimizer": "torch-fused"},
    "foreach": {"optimizer": "foreach"},
    "for-loop": {"optimizer": "for-loop"},
    "apex-adam": {"optimizer": "apex"},
    "torch-norm": {"norm": "torch"},
    "liger-norm": {"norm": "liger"},
    "apex-norm": {"norm": "apex"},
    "te-norm": {"norm": "transformer_engine"},
    "te": {"fp8_backend": "transformer_engine"},
    "torchao": {"fp8_backend": "torchao"},
    "emulated": {"fp8_backend": "emulated"},
    "fp8-head": {"fp8_convert_head": True},
}


_FIELDS = {f.name: f for f in fields(Recipe)}


def _diff(a: Recipe, b: Recipe) -> dict:
    return {f: getattr(b, f) for f in _FIELDS if f != "name" and getattr(a, f) != getattr(b, f)}


def recipe_name(recipe: Recipe, *, base: str | None = None) -> str:
    """The name of `recipe` in the grammar: `base` (or the closest preset) plus knobs for the rest."""
    known = presets()
    if base is None:
        head = _preset_key(recipe.name.split("+")[0])
        base = head if head in known else min(known, key=lambda p: len(_diff(known[p], recipe)))
    diff = _diff(known[base], recipe)
    out = [base]
    for knob, sets in KNOBS.items():  # a knob is used when it says exactly what differs
        if sets and all(diff.get(f, object()) == v for f, v in sets.items()):
            out.append(knob)
            for f in sets:
                diff.pop(f)
    out += [f"{f}={str(v).lower() if isinstance(v, bool) else v}" for f, v in diff.items()]
    return "+".join(out)
