"""Models from a config, and weights in and out of them: the plain state_dict export (for inference)
and its weights_only loader (no code runs from the file)."""

from __future__ import annotations

import os
from collections.abc import Callable

import torch

from overdrive.data import VOCAB_SIZE, load_tokens
from overdrive.models import GPT, gpt_config
from overdrive.checkpoint import (CheckpointError, latest_checkpoint, load_model_weights, load_tensors, save_tensors,
                                  verify_checkpoint)
from overdrive.train.config import TrainConfig

__all__ = ["build_model", "export_weights", "load_exported", "vocab_of"]


def build_model(cfg: TrainConfig, vocab: int, size: str | None = None) -> GPT:
    m = cfg.model
    over = {k: getattr(m, k) for k in ("n_layer", "n_head", "n_embd", "norm", "tie_embeddings", "dropout")
            if getattr(m, k) is not None and size is None}
    return GPT(gpt_config(size or m.size, vocab_size=vocab, block_size=cfg.train.seq_len, **over))


def vocab_of(cfg: TrainConfig) -> int:
    """The vocabulary the data implies, without reading a byte-level source (builtin or text)."""
    d = cfg.data
    fmt = d.format if d.format != "auto" else ("uint16" if d.train.endswith(".bin") else "text")
    if d.train == "builtin" or fmt == "text":
        if d.vocab_size is not None and d.vocab_size < VOCAB_SIZE:
            load_tokens(d.train, fmt=d.format, vocab_size=d.vocab_size, builtin_n=1)  # raises the one-line error
        return d.vocab_size or VOCAB_SIZE
    return load_tokens(d.train, fmt=d.format, vocab_size=d.vocab_size)[1]


def _export_source(run_dir_or_ckpt: str, say: Callable[[str], None]) -> str:
    if os.path.exists(os.path.join(run_dir_or_ckpt, ".metadata")):  # a checkpoint folder itself
        bad = verify_checkpoint(run_dir_or_ckpt)
        if bad:
            raise CheckpointError(f"{run_dir_or_ckpt} is damaged: {bad}")
        return run_dir_or_ckpt
    newest = latest_checkpoint(run_dir_or_ckpt)
    if not newest:
        raise CheckpointError(f"no complete checkpoint under {run_dir_or_ckpt}: train first")
    bad = verify_checkpoint(newest)
    if bad:
        good = latest_checkpoint(run_dir_or_ckpt, verify=True)
        if not good:
            raise CheckpointError(f"{newest} is damaged ({bad}) and no older checkpoint is intact")
        say(f"{newest} is damaged ({bad}); exporting the newest intact one, {good}")
        return good
    return newest


def export_weights(run_dir_or_ckpt: str, cfg: TrainConfig, out_path: str,
                   say: Callable[[str], None] = print) -> str:
    """One plain state_dict (for inference) from the newest intact checkpoint of a run; the file is
    reloaded from where it was written before the export is called done."""
    ck = _export_source(run_dir_or_ckpt, say)
    model = build_model(cfg, vocab_of(cfg))
    load_model_weights(ck, model)
    save_tensors(out_path, model.state_dict())
    load_exported(out_path, build_model(cfg, vocab_of(cfg)))
    return out_path


def load_exported(path: str, model: torch.nn.Module) -> torch.nn.Module:
    """Load an exported state_dict with weights_only=True (no code runs from the file)."""
    if not os.path.isfile(path):
        raise CheckpointError(f"{path} not found: export one with `overdrive train CONFIG --export PATH`")
    try:
        sd = load_tensors(path)
        model.load_state_dict(sd)
    except Exception as e:
        raise CheckpointError(f"cannot load {path} into {type(model).__name__}: {str(e).splitlines()[0][:200]}") \
            from None
    return model
