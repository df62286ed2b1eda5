"""Model shapes for planning: presets (Llama-3 family, a GPT-style 64B, our reference GPTs),
custom dims, or a Hugging Face config.json."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from overdrive.io import load_json_bounded

__all__ = ["ModelSpec", "MODEL_PRESETS", "get_model", "model_from_hf_config", "mpt", "MPT_SIZES", "MAX_DIM",
           "read_json_file", "ENCODER_DECODER_TYPES", "ENCODER_TYPES"]


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    name: str
    n_layer: int
    hidden: int
    n_head: int
    n_kv_head: int
    ffn: int
    """MLP inner size (per projection)."""
    vocab: int
    tied: bool = False
    gated_mlp: bool = True
    """SwiGLU (gate, up, down: 3 matrices) as in Llama; False = GELU MLP (2 matrices) as in GPT."""
    learned_pos: int = 0
    """Rows of a learned position table (GPT-2 style); 0 for RoPE."""
    bias: bool = False
    """Linear and LayerNorm biases (GPT-2 style); Llama has none."""
    attn_head_dim: int = 0
    """Width of one attention head when it is not hidden / heads (Qwen3, Gemma: config's head_dim); 0 = hidden / heads."""
    qk_norm: bool = False
    """RMSNorm on q and k per head (OLMo 2, Qwen3, Gemma 3): two more norms per block, their inputs saved."""
    embed_norm: bool = False
    """A LayerNorm right after the word embedding (BLOOM's word_embeddings_layernorm): `overdrive plan` turns on
    --embed-norm for it."""
    squared_relu: bool = False
    """A 2-matrix MLP with a squared-ReLU activation (Nemotron); needs gated_mlp False. Same shapes and saved
    tensors as GELU's, a cheaper elementwise op."""

    def __post_init__(self):
        # Refuse shapes no model has before they turn into zero divisions, NaN or float overflow downstream.
        for name in ("n_layer", "hidden", "n_head", "n_kv_head", "ffn", "vocab"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"model {name} must be a positive integer, got {v!r}")
            if v > MAX_DIM:
                raise ValueError(f"model {name} {v} is too large (at most {MAX_DIM:,}): check the model's shape")
        lp = self.learned_pos
        if isinstance(lp, bool) or not isinstance(lp, int) or lp < 0 or lp > MAX_DIM:
            raise ValueError(f"model learned_pos must be a number of positions in 0-{MAX_DIM:,}, got {lp!r}")
        d = self.attn_head_dim
        if isinstance(d, bool) or not isinstance(d, int) or d < 0 or d > MAX_DIM:
            raise ValueError(f"model attn_head_dim must be a head width in 0-{MAX_DIM:,} (0: hidden/heads), got {d!r}")
        if self.squared_relu and self.gated_mlp:
            raise ValueError("model squared_relu is a 2-matrix MLP: set gated_mlp False (a SwiGLU MLP has no ReLU)")
        if (not d and self.hidden % self.n_head) or self.n_head % self.n_kv_head:
            raise ValueError(f"model hidden {self.hidden} must divide by heads {self.n_head} (or give the head "
                             f"width), and heads {self.n_head} by kv heads {self.n_kv_head}: fix the model's shape")

    @property
    def head_dim(self) -> int:
        return self.attn_head_dim or self.hidden // self.n_head

    @property
    def q_dim(self) -> int:
        """Width of the queries and of the attention output (heads x head width; hidden for most models)."""
        return self.n_head * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_head * self.head_dim

    def layer_params(self) -> int:
        """Per block: Q and O (h·q each, q = heads·head width, h for most models), K and V (h·kv each),
        the MLP, two norm gains."""
        h, q = self.hidden, self.q_dim
        attn = 2 * h * q + 2 * h * self.kv_dim
        mlp = (3 if self.gated_mlp else 2) * h * self.ffn
        n = attn + mlp + 2 * h + (2 * self.head_dim if self.qk_norm else 0)   # q and k norm gains, per head width
        if self.bias:  # qkv + out, MLP inner(s) + out, two norm biases
            n += (q + 2 * self.kv_dim + h) + self.ffn * (2 if self.gated_mlp else 1) + h + 2 * h
        return n

    def n_params(self) -> int:
        """Total parameters (Llama-3-8B: 8.03B)."""
        emb = self.vocab * self.hidden
        head = 0 if self.tied else self.vocab * self.hidden
        final_norm = self.hidden * (2 if self.bias else 1)
        return self.n_layer * self.layer_params() + final_norm + emb + head + self.learned_pos * self.hidden

    def n_params_matmul(self) -> int:
        """Parameters that do a matmul per token: all but the input embedding tables (the head does,
        tied or not) — the N of 6N FLOPs per token."""
        final_norm = self.hidden * (2 if self.bias else 1)
        return self.n_layer * self.layer_params() + final_norm + self.vocab * self.hidden

    def flops_per_token(self, seq: int) -> int:
        """6N + 12·L·H·Q·T (see overdrive.bench.flops)."""
        return 6 * self.n_params_matmul() + 12 * self.n_layer * self.n_head * self.head_dim * seq


MAX_DIM = 1 << 24
"""Largest layer count, width, head count or vocabulary accepted (16.7M: far beyond any model, small enough
that every byte and FLOP count stays a finite float)."""
MAX_CONFIG_BYTES = 16 << 20
"""A Hugging Face config.json is a few KB; a bigger file is not one (and /dev/zero would never end)."""


def _llama(name, L, h, heads, kv, ffn, tied, vocab=128256):
    return ModelSpec(name=name, n_layer=L, hidden=h, n_head=heads, n_kv_head=kv, ffn=ffn, vocab=vocab, tied=tied)


MODEL_PRESETS: dict[str, ModelSpec] = {
    # Llama 3.x shapes as published in their config.json files.
    "llama3-1b": _llama("llama3-1b", 16, 2048, 32, 8, 8192, True),
    "llama3-3b": _llama("llama3-3b", 28, 3072, 24, 8, 8192, True),
    "llama3-8b": _llama("llama3-8b", 32, 4096, 32, 8, 14336, False),
    "llama3-70b": _llama("llama3-70b", 80, 8192, 64, 8, 28672, False),
    "llama3-405b": _llama("llama3-405b", 126, 16384, 128, 8, 53248, False),
    # Llama 2 (torchtitan's A100 runs): 32K vocabulary, MHA at 13B, GQA at 70B.
    "llama2-13b": _llama("llama2-13b", 40, 5120, 40, 40, 13824, False, vocab=32000),
    "llama2-70b": _llama("llama2-70b", 80, 8192, 64, 8, 28672, False, vocab=32000),
    # A GPT-style 64B: 80 blocks of d=8192 with a 4x GELU MLP (12·d² per block), MHA, 50K vocab.
    "gpt-64b": ModelSpec(name="gpt-64b", n_layer=80, hidden=8192, n_head=64, n_kv_head=64, ffn=32768, vocab=50304,
                         tied=True, gated_mlp=False),
}



def _gpt3(name, L, h, heads):
    """NeMo's GPT-3 family (nemo/collections/llm/gpt/model/base.py GPTConfig5B/20B/175B): a 4x GELU MLP with
    biases, MHA, learned absolute positions over 2,048 tokens, tied embeddings, GPT-2's 50,257 tokens padded to
    a multiple of 128."""
    return ModelSpec(name=name, n_layer=L, hidden=h, n_head=heads, n_kv_head=heads, ffn=4 * h, vocab=50304,
                     tied=True, gated_mlp=False, learned_pos=2048, bias=True)


def _nemotron(name, L, h, heads, kv, ffn):
    """NeMo's Nemotron (nemo/collections/llm/gpt/model/nemotron.py): squared-ReLU MLP, no linear biases, RoPE,
    untied 256K vocabulary."""
    return ModelSpec(name=name, n_layer=L, hidden=h, n_head=heads, n_kv_head=kv, ffn=ffn, vocab=256000, tied=False,
                     gated_mlp=False, squared_relu=True)


MODEL_PRESETS.update({
    "llama2-7b": _llama("llama2-7b", 32, 4096, 32, 32, 11008, False, vocab=32000),
    "gpt3-5b": _gpt3("gpt3-5b", 24, 4096, 32),
    "gpt3-20b": _gpt3("gpt3-20b", 44, 6144, 48),
    "gpt3-175b": _gpt3("gpt3-175b", 96, 12288, 96),
    "nemotron3-8b": _nemotron("nemotron3-8b", 32, 4096, 32, 32, 16384),
    "nemotron3-22b": _nemotron("nemotron3-22b", 40, 6144, 48, 48, 24576),
    "nemotron4-340b": _nemotron("nemotron4-340b", 96, 18432, 96, 8, 73728),
})


# MosaicML MPT as llm-foundry benchmarks it (scripts/train/benchmarking): GELU MLP 4x, biases, tied
# embeddings, a learned position table as long as the sequence; (layers, d_model, heads).
MPT_SIZES = {"mpt-760m": (24, 1536, 12), "mpt-1b": (24, 2048, 16), "mpt-3b": (32, 2560, 20), "mpt-7b": (32, 4096, 32),
             "mpt-13b": (40, 5120, 40), "mpt-30b": (48, 7168, 56), "mpt-70b": (80, 8192, 64)}


def mpt(name: str, seq: int) -> ModelSpec:
    """An MPT of llm-foundry's benchmark table (its NumParams column: mpt-7b at seq 2048 = 6,658,859,008)."""
    L, h, heads = MPT_SIZES[name]
    return ModelSpec(name=name, n_layer=L, hidden=h, n_head=heads, n_kv_head=heads, ffn=4 * h, vocab=50368, tied=True,
                     gated_mlp=False, learned_pos=seq, bias=True)


def _from_reference_gpt(name: str) -> ModelSpec:
    from overdrive.models import gpt_config

    c = gpt_config(name)
    return ModelSpec(name=name, n_layer=c.n_layer, hidden=c.n_embd, n_head=c.n_head, n_kv_head=c.n_head,
                     ffn=c.mlp_ratio * c.n_embd, vocab=c.vocab_size, tied=c.tie_embeddings, gated_mlp=False,
                     learned_pos=c.block_size, bias=c.bias)


def get_model(name: str) -> ModelSpec:
    """A preset, a reference GPT size, or a path to a Hugging Face config.json."""
    if name in MODEL_PRESETS:
        return MODEL_PRESETS[name]
    if name in MPT_SIZES:
        return mpt(name, 2048)
    from overdrive.models import GPT_SIZES

    if name in GPT_SIZES:
        return _from_reference_gpt(name)
    if name.endswith(".json") or os.path.exists(name):   # a config file, or a folder holding config.json
        return model_from_hf_config(name)
    known = ", ".join(list(MODEL_PRESETS) + list(GPT_SIZES))
    raise ValueError(f"unknown model '{name}': known models are {known}, or a path to a Hugging Face config.json")


def _hf_name(path: str, c: dict) -> str:
    """A readable name: the checkpoint's own `_name_or_path`, else the file's stem when it is not the
    generic "config", else the architecture and size (a folder like path/to/ says nothing)."""
    own = str(c.get("_name_or_path") or "").rstrip("/")
    if own:
        return own.split("/")[-1]
    stem = os.path.splitext(os.path.basename(path))[0]
    if stem.lower() != "config":
        return stem
    L, h = c.get("num_hidden_layers", c.get("n_layer")), c.get("hidden_size", c.get("n_embd"))
    return f"{c.get('model_type', 'hf')}-{L}L-{h}d"


GELU_MLP_TYPES = ("gpt2", "gpt_neox", "opt", "gptj", "falcon", "phi", "bloom", "gpt_bigcode", "starcoder2")
"""Hugging Face model types whose MLP is two matrices with a GELU (not SwiGLU's three)."""
EMBED_NORM_TYPES = ("bloom",)
"""transformers model types with a LayerNorm on the word embeddings (BloomModel.word_embeddings_layernorm)."""
QK_NORM_TYPES = ("qwen3", "olmo2", "gemma3", "gemma3_text", "chameleon")
"""Hugging Face model types that normalize q and k per head (their modeling code; the config has no flag)."""
_MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts", "num_experts_per_tok")


def read_json_file(path: str, what: str, *, limit: int = MAX_CONFIG_BYTES):
    """json.load of a regular file of at most `limit` bytes (`io.load_json_bounded`); ValueError (one line,
    with the fix) otherwise."""
    return load_json_bounded(path, what=what, tail=f": pass {what}", limit=limit)


def _dim(path: str, key: str, v) -> int:
    """A config's integer field: ints, or floats with no fraction (some exporters write 32.0); nothing else."""
    if isinstance(v, float) and math.isfinite(v) and v.is_integer():
        if v > MAX_DIM:
            raise ValueError(f"{path}: {key} {v:g} is too large (at most {MAX_DIM:,}): fix the config.json")
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"{path}: {key} must be a positive integer, got {v!r}: fix the config.json")
    return v


ENCODER_DECODER_TYPES = ("t5", "mt5", "umt5", "longt5", "switch_transformers", "bart", "mbart", "pegasus",
                         "pegasus_x", "marian", "led", "m2m_100", "nllb_moe", "blenderbot", "blenderbot-small",
                         "prophetnet", "fsmt", "plbart", "whisper", "speech_to_text", "encoder-decoder")
"""Hugging Face model types with an encoder and a decoder (cross-attention); configs that do not say
`is_encoder_decoder` (T5 writes it, some exporters drop it) are caught by their type."""
ENCODER_TYPES = ("bert", "roberta", "xlm-roberta", "deberta", "deberta-v2", "electra", "distilbert", "albert",
                 "modernbert", "vit", "deit", "beit", "swin", "swinv2", "dinov2", "convnext", "clip", "siglip",
                 "clip_vision_model", "siglip_vision_model", "wav2vec2", "hubert")
"""Encoder-only types (bidirectional attention, no LM head over a vocabulary, or no tokens at all for ViT):
planned as a causal LM they would get a head and a causal attention they do not have."""


def _read_hf_config(path: str) -> tuple[str, dict]:
    """(the config.json's path, its object) from the file or the folder holding it; refuses what is not a
    decoder-only config before its keys are read."""
    if not os.path.exists(path):
        raise ValueError(f"{path} does not exist: pass a Hugging Face config.json or the folder holding it")
    if os.path.isdir(path):
        inner = os.path.join(path, "config.json")
        if not os.path.isfile(inner):
            raise ValueError(f"{path} is a folder without a config.json: pass a folder a config.save_pretrained() "
                             "wrote, or the config .json file itself")
        path = inner
    c = read_json_file(path, "a Hugging Face config.json")
    if not isinstance(c, dict):
        raise ValueError(f"{path} is not a Hugging Face config (a JSON object expected)")
    mtype = str(c.get("model_type", ""))
    # before the key checks: T5 names its dims d_model/num_layers, and "missing keys" would hide the real reason
    if c.get("is_encoder_decoder") is True or mtype in ENCODER_DECODER_TYPES:
        raise ValueError(f"{path}: {mtype or 'this model'} is an encoder-decoder model, which is not supported: "
                         "the planner models decoder-only (causal LM) Transformers; plan its decoder as a custom "
                         "model (--layers, --hidden, --heads) for an estimate")
    if mtype in ENCODER_TYPES:
        raise ValueError(f"{path}: {mtype} is an encoder-only model, which is not supported: the planner models "
                         "decoder-only (causal LM) Transformers; plan a custom model (--layers, --hidden, --heads) "
                         "for an estimate of a same-shaped decoder")
    return path, c


def model_from_hf_config(path: str) -> ModelSpec:
    """A ModelSpec from a Hugging Face config: the config.json file, or a folder holding one (as tune --hf)."""
    path, c = _read_hf_config(path)

    def g(*keys, default=None):
        """(key found, value): the first of `keys` present, else the default under the first key's name."""
        return next(((k, c[k]) for k in keys if k in c), (keys[0], default))

    (kl, L), (kh, h), (kn, heads) = g("num_hidden_layers", "n_layer"), g("hidden_size", "n_embd", "d_model"), \
        g("num_attention_heads", "n_head")
    if L is None or h is None or heads is None:
        raise ValueError(f"{path}: needs num_hidden_layers, hidden_size and num_attention_heads (or GPT-2's "
                         "n_layer, n_embd, n_head)")
    L, h, heads = _dim(path, kl, L), _dim(path, kh, h), _dim(path, kn, heads)
    # What the planner does not model must not be planned as if it were a dense model of this width.
    experts = next(((k, c[k]) for k in _MOE_KEYS if c.get(k) not in (None, 0, 1)), None)
    if experts:
        raise ValueError(f"{path}: a mixture-of-experts model ({experts[0]} {experts[1]!r}): the planner models dense "
                         "Transformers only")
    # Qwen3 and Gemma give each head a width of its own (queries heads x head_dim wide, not hidden_size).
    head_dim = 0 if c.get("head_dim") is None else _dim(path, "head_dim", c["head_dim"])
    head_dim = 0 if head_dim * heads == h else head_dim
    model_type = c.get("model_type", "llama")
    relu2 = c.get("hidden_act") == "relu2"   # Nemotron's squared ReLU: two matrices, no gate
    gated = model_type not in GELU_MLP_TYPES and not relu2
    kf, ffn = g("intermediate_size", "n_inner", "ffn_dim")
    ffn = 4 * h if ffn is None else _dim(path, kf, ffn)   # GPT-2 writes n_inner: null for 4·h
    # null or absent: multi-head attention, as transformers reads it; Falcon and StarCoder name it otherwise
    kk, kv = g("num_key_value_heads", "num_kv_heads")
    kv = 1 if kv is None and c.get("multi_query") is True else kv
    kv = heads if kv is None else _dim(path, kk, kv)
    vocab = _dim(path, *g("vocab_size", default=32000))
    tied = c.get("tie_word_embeddings")
    tied = (not gated) if tied is None else tied
    if not isinstance(tied, bool):
        raise ValueError(f"{path}: tie_word_embeddings must be true or false, got {tied!r}: fix the config.json")
    pos = _dim(path, "n_positions", c["n_positions"]) if not gated and "n_positions" in c else 0
    qk_norm = model_type in QK_NORM_TYPES or any(c.get(k) is True for k in ("qk_layernorm", "use_qk_norm", "qk_norm"))
    try:
        return ModelSpec(name=_hf_name(path, c), n_layer=L, hidden=h, n_head=heads, n_kv_head=kv, ffn=ffn,
                         vocab=vocab, tied=tied, gated_mlp=gated, learned_pos=pos, attn_head_dim=head_dim,
                         squared_relu=relu2, qk_norm=qk_norm, embed_norm=model_type in EMBED_NORM_TYPES)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
