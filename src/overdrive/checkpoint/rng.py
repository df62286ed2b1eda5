"""Every random number generator a training step can draw from, as plain tensors and ints (so the
extra file loads weights_only): torch CPU, every CUDA device, numpy's global generator, Python's
`random`. Saved per rank: each rank's dropout masks differ and must continue where they were."""

from __future__ import annotations

import random

import numpy as np
import torch

__all__ = ["rng_state", "set_rng_state"]


def rng_state() -> dict:
    np_state = np.random.get_state()  # ('MT19937', key uint32[624], pos, has_gauss, cached_gaussian)
    return {"torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized()
            else [],
            "numpy": {"key": torch.from_numpy(np_state[1].astype(np.int64)), "pos": int(np_state[2]),
                      "has_gauss": int(np_state[3]), "gauss": float(np_state[4])},
            "python": random.getstate()}


def set_rng_state(state: dict) -> list[str]:
    """Restore what rng_state() captured; returns what could not be restored (e.g. CUDA states saved
    on another number of GPUs), for the caller to say."""
    missing = []
    torch.set_rng_state(state["torch"])
    cuda = list(state.get("cuda") or [])
    if cuda:
        if torch.cuda.is_available() and torch.cuda.device_count() == len(cuda):
            torch.cuda.set_rng_state_all(cuda)
        else:
            missing.append(f"CUDA RNG ({len(cuda)} devices saved)")
    n = state.get("numpy")
    if n is not None:
        np.random.set_state(("MT19937", n["key"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    py = state.get("python")
    if py is not None:
        random.setstate((py[0], tuple(py[1]), py[2]))
    return missing
