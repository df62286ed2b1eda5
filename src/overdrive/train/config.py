"""Trainer configuration: TOML sections → frozen dataclasses, strictly checked.

An unknown key or a wrong type is a `ConfigError` whose one-line message names the key and what
is allowed (the CLI exits with code 2). `--set section.key=value` overrides a value.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import types
import typing
from dataclasses import dataclass, field, fields

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = ["ConfigError", "TrainConfig", "load_config", "ModelCfg", "DataCfg", "OptimCfg", "LoopCfg", "TeacherCfg"]


class ConfigError(ValueError):
    """A bad config: the message names the key and what is allowed."""


@dataclass(frozen=True, kw_only=True)
class ModelCfg:
    size: str = "tiny"
    """Reference GPT size (overdrive.models.GPT_SIZES); the fields below override its dims."""
    n_layer: int | None = None
    n_head: int | None = None
    n_embd: int | None = None
    norm: str | None = None
    """"layernorm" or "rmsnorm"."""
    tie_embeddings: bool | None = None
    dropout: float | None = None
    """Attention dropout probability (default 0); a resumed run draws the masks the uninterrupted one would."""


@dataclass(frozen=True, kw_only=True)
class DataCfg:
    train: str = "builtin"
    """"builtin" (the deterministic token stream), a text file (bytes as tokens), or a .bin memmap."""
    format: str = "auto"
    """auto (by extension) | text | uint16 | uint32 (pre-tokenized .bin)."""
    val_fraction: float = 0.1
    """The tail of the token stream held out for evaluation."""
    builtin_tokens: int = 1 << 19
    vocab_size: int | None = None
    """The vocabulary (default: 256 for text and builtin, max token + 1 for .bin); must exceed every token id."""


@dataclass(frozen=True, kw_only=True)
class OptimCfg:
    lr: float = 1e-3
    min_lr: float = 1e-4
    warmup_steps: int = 10
    """Linear warm-up, then cosine decay to min_lr at the last step."""
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    """Clip the global gradient norm to this; 0 disables clipping (the norm is still checked for NaN/inf)."""


@dataclass(frozen=True, kw_only=True)
class LoopCfg:
    steps: int = 100
    seq_len: int = 64
    global_batch: int = 16
    """Sequences per optimizer step, over all ranks."""
    micro_batch: int = 8
    """Sequences per forward/backward on one rank; gradient accumulation makes up the rest."""
    grad_accum_steps: int | None = None
    """Micro-steps per optimizer step (also spelled gradient_accumulation_steps, as in Accelerate and
    TrainingArguments); when set, the micro-batch is global_batch / (ranks x this) instead of micro_batch."""
    seed: int = 0
    recipe: str = "auto"
    """Recipe preset (fp32, amp-bf16, amp-fp16, fp8, ...)."""
    activation_checkpointing: str = "none"
    """none | selective (every `checkpoint_every_k`-th block) | full."""
    checkpoint_every_k: int = 2
    eval_every: int = 50
    """Steps between evaluations on the held-out split (0: none)."""
    eval_batches: int = 4
    log_every: int = 10
    out_dir: str = "runs/train"
    checkpoint_every: int = 50
    """Steps between sharded checkpoints (0: only at the end)."""
    keep_last: int = 2
    fsdp: str = "auto"
    """auto (FSDP2 when WORLD_SIZE > 1) | on (also on one rank under torchrun) | off."""
    dist_timeout_s: float = 600.0
    """Under torchrun: how long a collective waits for a rank before the job stops and names it."""


@dataclass(frozen=True, kw_only=True)
class TeacherCfg:
    checkpoint: str = ""
    """An exported state_dict (.pt) of a teacher GPT; empty = train one first (train_steps)."""
    size: str = "cpu-teacher"
    train_steps: int = 0
    """If > 0 and no checkpoint: train the teacher for this many steps first (same data)."""
    alpha: float = 0.5
    """loss = alpha·CE + (1−alpha)·T²·KL(teacher/T ‖ student/T)."""
    temperature: float = 2.0


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    model: ModelCfg = field(default_factory=ModelCfg)
    data: DataCfg = field(default_factory=DataCfg)
    optimizer: OptimCfg = field(default_factory=OptimCfg)
    train: LoopCfg = field(default_factory=LoopCfg)
    teacher: TeacherCfg | None = None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


_SECTIONS = {"model": ModelCfg, "data": DataCfg, "optimizer": OptimCfg, "train": LoopCfg, "teacher": TeacherCfg}


MAX_EVAL_BATCHES = 4096
"""Batches per evaluation at most (each is a forward at micro_batch x seq_len)."""

def _type_ok(value, tp) -> bool:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return any(_type_ok(value, a) for a in typing.get_args(tp))
    if tp is type(None):
        return value is None
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, tp)


def _type_name(tp) -> str:
    args = [a for a in typing.get_args(tp) if a is not type(None)] or [tp]
    return " or ".join({int: "an integer", float: "a number", str: "a string", bool: "true/false"}.get(a, str(a))
                       for a in args)


def micro_batch_from_accum(t: LoopCfg, world: int) -> LoopCfg:
    """[train] with grad_accum_steps: the micro-batch is global_batch / (ranks x grad_accum_steps)."""
    per_rank = t.global_batch // world
    if per_rank % t.grad_accum_steps:
        raise ValueError(f"train.global_batch / world = {per_rank} is not a multiple of train.grad_accum_steps="
                         f"{t.grad_accum_steps}: pick an accumulation that divides it")
    return dataclasses.replace(t, micro_batch=per_rank // t.grad_accum_steps)


# Other stacks' spellings of a key -> Overdrive's (the config is reported under Overdrive's name).
_KEY_ALIASES = {"train": {"gradient_accumulation_steps": "grad_accum_steps"}}


def _build(section: str, cls, raw: dict):
    if not isinstance(raw, dict):
        raise ConfigError(f"[{section}] must be a table of keys, got {type(raw).__name__}")
    for alias, ours in _KEY_ALIASES.get(section, {}).items():
        if alias in raw:
            if ours in raw:
                raise ConfigError(f"'{section}.{alias}' and '{section}.{ours}' are the same setting: keep one")
            raw = {(ours if k == alias else k): v for k, v in raw.items()}
    if section == "train" and "grad_accum_steps" in raw and "micro_batch" in raw:
        raise ConfigError("'train.grad_accum_steps' and 'train.micro_batch' both set the micro-batch (global_batch / "
                          "(ranks x grad_accum_steps)): keep one")
    hints = typing.get_type_hints(cls)
    allowed = [f.name for f in fields(cls)]
    for k, v in raw.items():
        if k not in hints:
            raise ConfigError(f"unknown key '{section}.{k}': allowed keys in [{section}] are {', '.join(allowed)}")
        if not _type_ok(v, hints[k]):
            raise ConfigError(f"'{section}.{k}' must be {_type_name(hints[k])}, got {v!r}")
    return cls(**{k: (float(v) if hints[k] is float else v) for k, v in raw.items()})


def _parse_value(text: str):
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text  # a bare word is a string: --set train.recipe=amp-bf16


def load_config(path: str | None, overrides: list[str] = ()) -> TrainConfig:
    raw: dict = {}
    if path:
        try:
            with open(path, "rb") as f:
                raw = tomllib.load(f)
        except FileNotFoundError:
            raise ConfigError(f"config file {path} not found") from None
        except IsADirectoryError:
            raise ConfigError(f"config path {path} is a folder: pass a TOML file (e.g. examples/tiny.toml)") from None
        except UnicodeDecodeError:
            raise ConfigError(f"{path} is not a text TOML file") from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{path} is not valid TOML: {e}") from None
    for ov in overrides:
        key, sep, val = ov.partition("=")
        if not sep or "." not in key:
            raise ConfigError(f"--set {ov!r}: use section.key=value, e.g. --set train.steps=200")
        sec, k = key.split(".", 1)
        if not isinstance(raw.setdefault(sec, {}), dict):  # `train = 3` in the file, then --set train.steps=...
            raise ConfigError(f"--set {ov!r}: [{sec}] in {path} is {raw[sec]!r}, not a table of keys: write it as "
                              f"a [{sec}] section (e.g. [{sec}] then {k} = ...)")
        raw[sec][k] = _parse_value(val)
    unknown = set(raw) - set(_SECTIONS)
    if unknown:
        raise ConfigError(f"unknown section [{sorted(unknown)[0]}]: sections are {', '.join(_SECTIONS)}")
    parts = {sec: _build(sec, cls, raw[sec]) for sec, cls in _SECTIONS.items() if sec in raw}
    cfg = TrainConfig(**parts)
    _check(cfg)
    return cfg


# Sizes past which a config is refused before anything is built: a 100,000-layer model took 258 s and
# 3.2 GB of Python objects (even on the meta device) before the memory check refused it. The deepest
# published dense models have ~126 layers and the widest ~16K; these bounds leave room for experiments.
MAX_LAYERS, MAX_WIDTH, MAX_SEQ, MAX_VOCAB = 1024, 1 << 16, 1 << 20, 1 << 24
MAX_PARAMS = 10 ** 12
"""1e12 parameters need 16 TB for fp32 weights, gradients and AdamW's moments: beyond any run of this trainer."""
MAX_GLOBAL_BATCH, MAX_BUILTIN_TOKENS = 1 << 20, 1 << 27


def _check_sizes(cfg: TrainConfig) -> None:
    """Bound the model and the batch from the dims alone (arithmetic, no module built)."""
    from overdrive.models import GPT_SIZES

    m, t, d = cfg.model, cfg.train, cfg.data
    for key, v, top in (("model.n_layer", m.n_layer, MAX_LAYERS), ("model.n_embd", m.n_embd, MAX_WIDTH),
                        ("train.seq_len", t.seq_len, MAX_SEQ), ("data.vocab_size", d.vocab_size, MAX_VOCAB),
                        ("train.global_batch", t.global_batch, MAX_GLOBAL_BATCH),
                        ("data.builtin_tokens", d.builtin_tokens, MAX_BUILTIN_TOKENS)):
        if v is not None and v > top:
            raise ConfigError(f"'{key}' = {v:,} is beyond what this trainer takes (at most {top:,}): pick a "
                              "smaller value")
    base = GPT_SIZES[m.size]
    n_layer, n_embd = m.n_layer or base.n_layer, m.n_embd or base.n_embd
    vocab = d.vocab_size or 256
    tied = base.tie_embeddings if m.tie_embeddings is None else m.tie_embeddings
    # (GPTConfig.n_params without biases and norms: 12·d² per block, the token and position tables, the head)
    params = n_layer * 12 * n_embd * n_embd + (vocab + t.seq_len) * n_embd + (0 if tied else vocab * n_embd)
    if params > MAX_PARAMS:
        raise ConfigError(f"the model has about {params / 1e9:,.0f}B parameters (n_layer {n_layer}, n_embd {n_embd}, "
                          f"vocab {vocab}, seq_len {t.seq_len}): beyond {MAX_PARAMS / 1e9:,.0f}B (16 TB of weights, "
                          "gradients and AdamW state) this trainer refuses; lower model.n_layer or model.n_embd")


def _check(cfg: TrainConfig) -> None:
    t, o = cfg.train, cfg.optimizer
    for sec in _SECTIONS:
        part = getattr(cfg, sec)
        for f in fields(part) if part is not None else ():
            v = getattr(part, f.name)
            if isinstance(v, float) and not math.isfinite(v):  # TOML allows nan and inf
                raise ConfigError(f"'{sec}.{f.name}' must be a finite number, got {v}")
    choices = {"train.activation_checkpointing": (t.activation_checkpointing, ("none", "selective", "full")),
               "data.format": (cfg.data.format, ("auto", "text", "uint16", "uint32")),
               "train.fsdp": (t.fsdp, ("auto", "on", "off"))}
    for key, (v, allowed) in choices.items():
        if v not in allowed:
            raise ConfigError(f"'{key}' = {v!r}: allowed values are {', '.join(allowed)}")
    for key, v in (("train.steps", t.steps), ("train.seq_len", t.seq_len), ("train.global_batch", t.global_batch),
                   ("train.micro_batch", t.micro_batch), ("train.log_every", t.log_every),
                   ("train.keep_last", t.keep_last), ("train.checkpoint_every_k", t.checkpoint_every_k),
                   ("train.grad_accum_steps", 1 if t.grad_accum_steps is None else t.grad_accum_steps)):
        if v < 1:
            raise ConfigError(f"'{key}' must be >= 1, got {v}")
    for key, v in (("train.eval_every", t.eval_every), ("train.checkpoint_every", t.checkpoint_every),
                   ("optimizer.warmup_steps", o.warmup_steps), ("optimizer.weight_decay", o.weight_decay),
                   ("optimizer.grad_clip", o.grad_clip)):
        if v < 0:  # grad_clip=-1 would flip every gradient; checkpoint_every=-1 would save every step
            raise ConfigError(f"'{key}' must be >= 0, got {v}")
    if t.eval_batches < 1:
        raise ConfigError(f"'train.eval_batches' must be >= 1, got {t.eval_batches} (to skip evaluation set "
                          "train.eval_every = 0)")
    if t.eval_batches > MAX_EVAL_BATCHES:  # 1e8 ran 14 minutes inside one step, deaf to SIGTERM
        raise ConfigError(f"'train.eval_batches' must be at most {MAX_EVAL_BATCHES:,}, got {t.eval_batches:,}: an "
                          "evaluation is a sample of the validation split, not a pass over it")
    if not t.out_dir.strip():
        raise ConfigError("'train.out_dir' is empty: set a folder, e.g. train.out_dir = \"runs/tiny\"")
    if not t.dist_timeout_s > 0:
        raise ConfigError(f"'train.dist_timeout_s' must be > 0 seconds, got {t.dist_timeout_s}")
    for key, v in (("optimizer.beta1", o.beta1), ("optimizer.beta2", o.beta2)):
        if not 0 <= v < 1:
            raise ConfigError(f"'{key}' must be in [0, 1), got {v}")
    if cfg.data.builtin_tokens < 1:
        raise ConfigError(f"'data.builtin_tokens' must be >= 1, got {cfg.data.builtin_tokens}")
    if cfg.data.vocab_size is not None and cfg.data.vocab_size < 1:
        raise ConfigError(f"'data.vocab_size' must be >= 1, got {cfg.data.vocab_size}")
    if not 0 < cfg.data.val_fraction < 0.5:
        raise ConfigError(f"'data.val_fraction' must be in (0, 0.5), got {cfg.data.val_fraction}")
    if o.lr <= 0 or o.min_lr < 0 or o.min_lr > o.lr:
        raise ConfigError(f"optimizer: need 0 <= min_lr <= lr and lr > 0, got lr={o.lr}, min_lr={o.min_lr}")
    from overdrive.models import GPT_SIZES
    from overdrive.recipes import parse_recipe_name

    if cfg.model.size not in GPT_SIZES:
        raise ConfigError(f"'model.size' = {cfg.model.size!r}: sizes are {', '.join(GPT_SIZES)}")
    try:
        parse_recipe_name(t.recipe)
    except ValueError as e:
        raise ConfigError(f"'train.recipe' = {t.recipe!r}: {e}") from None
    _check_model(cfg)


def _check_model(cfg: TrainConfig) -> None:
    """The [model] and [teacher] sections: known sizes, positive dims that divide into heads, bounded."""
    from overdrive.models import GPT_SIZES

    m = cfg.model
    for key in ("n_layer", "n_head", "n_embd"):
        v = getattr(m, key)
        if v is not None and v < 1:
            raise ConfigError(f"'model.{key}' must be >= 1, got {v}")
    heads = m.n_head or GPT_SIZES[m.size].n_head
    width = m.n_embd or GPT_SIZES[m.size].n_embd
    if width % heads:
        raise ConfigError(f"'model.n_embd' = {width} does not divide into {heads} heads: pick a multiple of the "
                          "head count")
    _check_sizes(cfg)
    if m.dropout is not None and not 0 <= m.dropout < 1:
        raise ConfigError(f"'model.dropout' must be in [0, 1), got {m.dropout}")
    if m.norm is not None and m.norm not in ("layernorm", "rmsnorm"):
        raise ConfigError(f"'model.norm' = {m.norm!r}: allowed values are layernorm, rmsnorm")
    tc = cfg.teacher
    if tc:
        if tc.size not in GPT_SIZES:
            raise ConfigError(f"'teacher.size' = {tc.size!r}: sizes are {', '.join(GPT_SIZES)}")
        if not 0 <= tc.alpha <= 1:
            raise ConfigError(f"'teacher.alpha' must be in [0, 1], got {tc.alpha}")
        if not tc.temperature > 0:
            raise ConfigError(f"'teacher.temperature' must be > 0, got {tc.temperature}")
        if tc.train_steps < 0:
            raise ConfigError(f"'teacher.train_steps' must be >= 0, got {tc.train_steps}")
