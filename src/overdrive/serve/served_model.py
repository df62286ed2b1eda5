"""A model as a server runs it (`ServedModel`), and the built-in ones: the click model (DLRM, one
click probability per request) and the reference GPT (next-token logits of the last position), with
their weights loaded from a state_dict file checked to fit."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from overdrive.serve.errors import ExportError

__all__ = ["ServedModel", "GPTServing", "ClickServing", "CLICK_SPEC", "CLICK_DYNAMIC", "click_inputs",
           "builtin_model", "load_weights"]


@dataclass
class ServedModel:
    """A model as a server runs it: the module, example inputs per batch, its I/O as config.pbtxt names
    them, the variable axes, and what identifies it (a bench's results and an export must be of one model)."""

    module: nn.Module
    inputs: Callable[..., tuple]
    """inputs(batch) -> a tuple of host tensors, batch first (a user's model: inputs(batch, 1) is the variant
    with other sizes of its dynamic axes that export checks with)."""
    spec: dict
    dynamic: dict
    description: str
    identity: dict


class GPTServing(nn.Module):
    """Next-token logits of the last position: input_ids (B, T) int64 -> logits (B, V)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids)[0][:, -1]


class ClickServing(nn.Module):
    """DLRMServing with a (B, 1) output, as Triton expects of a batched model with one value per example."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        from overdrive.recsys import DLRMServing

        self.model = DLRMServing(model)

    def forward(self, dense: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        return self.model(dense, ids).unsqueeze(1)


def _gpt_sizes_that_fit(sd: dict) -> list[str]:
    """The named GPT sizes whose parameter shapes are those of `sd` (built on the meta device: no memory)."""
    from overdrive.models import GPT, GPT_SIZES

    shapes = {k: tuple(v.shape) for k, v in sd.items() if hasattr(v, "shape")}
    out = []
    for name, cfg in GPT_SIZES.items():
        with torch.device("meta"):
            ref = {k: tuple(v.shape) for k, v in GPT(cfg).state_dict().items()}
        if ref == shapes:
            out.append(name)
    return out


def load_weights(model: nn.Module, weights: str, what: str, fits=None) -> None:
    """Load a state_dict file, or say in one line why it does not fit (never a 30-line traceback)."""
    if not os.path.isfile(weights):
        raise ExportError(f"--weights {weights} is not a file: pass a state_dict .pt (e.g. from `overdrive train "
                          "CONFIG --export model.pt`)")
    try:
        from overdrive.checkpoint import load_tensors

        sd = load_tensors(weights)  # weights_only: no code runs from the file
    except Exception as e:  # not a torch file, or not a plain state_dict
        raise ExportError(f"--weights {weights} does not fit: it is not a plain state_dict ({type(e).__name__}); write one with "
                          f"`overdrive train CONFIG --export {weights}`") from None
    if not isinstance(sd, dict):
        raise ExportError(f"--weights {weights} does not fit: it holds a {type(sd).__name__}, not a state_dict; write one with "
                          f"`overdrive train CONFIG --export {weights}`")
    try:
        model.load_state_dict(sd)
    except (RuntimeError, TypeError, AttributeError, KeyError):
        sizes = fits(sd) if fits and isinstance(sd, dict) else []
        hint = f": it holds a {' / '.join(sizes)} GPT, pass --size {sizes[0]}" if sizes else \
            ": pass the --model/--size it was trained as"
        raise ExportError(f"--weights {weights} does not fit {what}{hint}") from None


CLICK_SPEC = {"inputs": [("dense", [13], "TYPE_FP32"), ("ids", [26, -1], "TYPE_INT64")],
              "outputs": [("prob", [1], "TYPE_FP32")]}
"""The click model's inputs and outputs as config.pbtxt names them (-1: the bag length is dynamic)."""
CLICK_DYNAMIC = {"dense": {0: "batch"}, "ids": {0: "batch", 2: "bag"}}


def click_inputs(batch: int, bag: int, *, seed: int = 1, spec=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(dense (B, 13) fp32, ids (B, 26, bag) int64 padded with -1): what the click model is served."""
    from overdrive.recsys import CriteoSpec, padded_ids, synthetic_clicks

    b = synthetic_clicks(batch, spec or CriteoSpec(), seed=seed)
    return b.dense, padded_ids(b, bag)


def builtin_model(kind: str, size: str, weights: str | None, bag_len: int):
    """(serving module, inputs_fn(batch, variant), spec, dynamic dims) of a built-in model."""
    if kind == "recsys":
        from overdrive.recsys import DLRM

        model = DLRM()
        if weights:
            load_weights(model, weights, "the click model")
        # variant 1: another bag length than the example, to prove that dimension is dynamic too.
        fn = lambda b, v=0: click_inputs(b, bag_len + 3 * v, seed=1 + 6 * v)  # noqa: E731
        return ClickServing(model).eval(), fn, CLICK_SPEC, CLICK_DYNAMIC
    if kind == "gpt":
        from overdrive.models import GPT, gpt_config

        cfg = gpt_config(size)
        model = GPT(cfg)
        if weights:
            load_weights(model, weights, f"a {size!r} GPT", fits=_gpt_sizes_that_fit)
        gen = torch.Generator().manual_seed(0)
        fn = lambda b, v=0: (torch.randint(0, cfg.vocab_size, (b, 16 - 5 * v), generator=gen),)  # noqa: E731
        spec = {"inputs": [("input_ids", [-1], "TYPE_INT64")], "outputs": [("logits", [cfg.vocab_size], "TYPE_FP32")]}
        return GPTServing(model).eval(), fn, spec, {"input_ids": {0: "batch", 1: "seq"}}
    raise ExportError(f"unknown model kind {kind!r}: use recsys or gpt, or FILE.py:FACTORY for your own model")

