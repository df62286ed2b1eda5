"""Does a model answer each request the same whatever else is in its batch? A dynamic batcher
(Triton's, ours) stacks unrelated requests into one batch, so a model that mixes rows (a mean over
the batch, batch norm in train mode, `torch.cumsum(y, 0)`, `y - y[:1]`) would change its answers.

Every row of every example batch (two batch sizes, so a request is seen at the first position and at
later ones) is compared with that request run alone. A model whose answer to the same request alone
changes from one call to the next keeps state between calls: that is said as such, not blamed on the
batch.
"""

from __future__ import annotations

import torch
from torch import nn

from overdrive.serve.errors import ExportError, first_line

__all__ = ["check_batch_independent"]


def _tuple(x) -> tuple | None:
    return (x,) if isinstance(x, torch.Tensor) else tuple(x) if isinstance(x, (tuple, list)) else None


def _tol(t: torch.Tensor) -> float:
    return 1e-2 if t.dtype in (torch.bfloat16, torch.float16) else 1e-5


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    tol = _tol(a)
    return a.shape == b.shape and bool(torch.allclose(a.float(), b.float(), rtol=10 * tol, atol=tol, equal_nan=False))


def check_batch_independent(model: nn.Module, batches: list[tuple], *, what: str, on: str) -> tuple:
    """Raise ExportError (one line) unless every row of each batch in `batches` (tuples of tensors, batch
    first; at least two sizes) equals that request alone. Returns the outputs of the first batch."""

    def call(xs, where):
        try:
            with torch.no_grad():
                return model(*xs)
        except Exception as e:  # noqa: BLE001 — the user's model: one line, not a traceback
            raise ExportError(f"{what} fails on {on} ({where}): {first_line(e)}") from None

    first = None
    for k, x in enumerate(batches):
        b = x[0].shape[0]
        outs = _tuple(call(x, f"batch {b}"))
        if not outs or not all(isinstance(t, torch.Tensor) and t.dim() >= 1 and t.shape[0] == b for t in outs):
            raise ExportError(f"{what} must return a tensor (or a tuple of tensors) with the batch first to be served "
                              "with dynamic batching")
        if not all(torch.isfinite(o.float()).all() for o in outs):
            raise ExportError(f"{what} returns non-finite values on {on}({b}): nothing to serve or compare")
        if k == 0:
            first = outs
            once, again = (_tuple(call(tuple(t[:1] for t in x), "a request alone")) for _ in range(2))
            if len(once) != len(again) or not all(_close(a, c) for a, c in zip(once, again)):
                raise ExportError(f"{what} answers the same request differently on two calls in a row (it keeps state "
                                  "between calls, or draws random numbers in eval mode): a served model must give one "
                                  "answer per request")
        for i in range(b):
            alone = _tuple(call(tuple(t[i:i + 1] for t in x), f"row {i} alone"))
            for o, r in zip(outs, alone or ()):
                if not _close(o[i:i + 1], r):
                    err = float((o[i:i + 1].float() - r.float()).abs().max()) if o[i:i + 1].shape == r.shape \
                        else float("nan")
                    raise ExportError(
                        f"{what} answers a request differently alone than beside others (row {i} of a batch of {b}: "
                        + (f"max abs difference {err:.3g}" if err == err else
                           f"shape {tuple(r.shape)} alone, {tuple(o[i:i + 1].shape)} in the batch")
                        + "): a dynamic batcher would change its answers (e.g. a mean or cumulative sum over the "
                        "batch, batch norm in train mode)")
    return first
