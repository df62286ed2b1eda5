"""The user's training step, as `tune` receives it: a model factory, a batch function, a loss.

Each candidate recipe runs in a fresh process, so what the user gives must travel there: a
`"file.py:fn"` reference (loaded again in the worker) or a picklable module-level function.
Everything the user's code can get wrong is caught here, on the first call, as a `UserError`
whose one line names the problem and the fix.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import pickle
import sys
from collections.abc import Callable
from dataclasses import dataclass

from overdrive.errors import UserError
from overdrive.io import load_json_bounded

__all__ = ["Workload", "FileFn", "load_file_fn", "compute_loss", "check_batch", "to_device", "hf_workload"]


def load_file_fn(ref: str, what: str) -> Callable:
    """`"path/to/file.py:name"` -> the function (the file is imported by its path, as a module of its own).

    The file's folder goes at the END of sys.path, after the standard library and site-packages: the
    file can still import its neighbours (`import helpers`), but a neighbour named like a library
    (an `onnx.py` beside `ranker.py`) never shadows that library inside Overdrive."""
    path, sep, name = str(ref).rpartition(":")
    if not sep or not path.endswith(".py") or not name.isidentifier():
        raise UserError(f"{what} {ref!r} is not FILE.py:FUNCTION (e.g. models.py:make_model)")
    path = os.path.abspath(path)
    if not os.path.isfile(path):
        raise UserError(f"{what} file {path} not found: check the path in {ref!r}")
    mod_name = "overdrive_user_" + hashlib.sha256(path.encode()).hexdigest()[:12]
    mod = sys.modules.get(mod_name)
    if mod is None:
        folder = os.path.dirname(path)
        if folder not in sys.path:
            sys.path.append(folder)  # neighbours importable, never ahead of the libraries
        spec = importlib.util.spec_from_file_location(mod_name, path)
        mod = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(mod)
        except (Exception, SystemExit) as e:  # a script's sys.exit() at import is a failure to import, said so
            raise UserError(f"{what} file {path} fails to import: {type(e).__name__}: {_first_line(e)}") from None
        sys.modules[mod_name] = mod
    fn = getattr(mod, name, None)
    if not callable(fn):
        have = sorted(k for k, v in vars(mod).items() if callable(v) and not k.startswith("_"))[:8]
        raise UserError(f"{what} {ref!r}: {os.path.basename(path)} has no function {name!r} "
                        f"(it has {', '.join(have) or 'none'})")
    return fn


class FileFn:
    """A picklable reference to `file.py:fn`, loaded on first call in whichever process calls it."""

    def __init__(self, ref: str, what: str) -> None:
        self.ref, self.what = ref, what
        self._fn = None

    def __call__(self, *args):
        if self._fn is None:
            self._fn = load_file_fn(self.ref, self.what)
        return self._fn(*args)

    def __getstate__(self) -> dict:
        return {"ref": self.ref, "what": self.what, "_fn": None}

    def __repr__(self) -> str:
        return self.ref


def _first_line(e: BaseException) -> str:
    s = str(e).strip()
    return (s.splitlines()[0] if s else "")[:200]


@dataclass(frozen=True, kw_only=True)
class Workload:
    """What one training step is: `loss_fn(model, batch_fn(step))` on a fresh `model_fn()`."""

    model_fn: Callable
    """Returns a fresh nn.Module, the same initial weights on every call (the worker seeds torch first)."""
    batch_fn: Callable
    """`batch_fn(step)` -> a tensor, a tuple/list or a dict of tensors (moved to the device for you)."""
    loss_fn: Callable | None = None
    """`loss_fn(model, batch)` -> scalar loss; None: the model's output if a scalar, else its `.loss`."""
    label: str = "model"

    def check_picklable(self) -> None:
        for what, fn in (("model_fn", self.model_fn), ("batch_fn", self.batch_fn), ("loss_fn", self.loss_fn)):
            if fn is None:
                continue
            try:
                pickle.dumps(fn)
            except Exception:
                raise UserError(f"{what} {getattr(fn, '__qualname__', fn)!r} cannot travel to a worker process "
                                "(each candidate runs in a fresh one): define it at module level, or pass "
                                "'file.py:function'") from None


def to_device(batch, device):
    if hasattr(batch, "to") and callable(batch.to):
        return batch.to(device)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(v, device) for v in batch)
    return batch


def check_batch(batch, label: str = "batch function") -> None:
    import torch

    if isinstance(batch, torch.Tensor):
        return
    if isinstance(batch, (tuple, list, dict)) and len(batch):
        vals = batch.values() if isinstance(batch, dict) else batch
        if any(isinstance(v, torch.Tensor) for v in vals):
            return
    raise UserError(f"the {label} returned {type(batch).__name__}"
                    f"{' with no tensors' if isinstance(batch, (tuple, list, dict)) else ''}: it must return a "
                    "tensor, a tuple/list or a dict of tensors for step i (batch_fn(i))")


def compute_loss(model, batch, loss_fn: Callable | None):
    """The scalar loss of one step, by the user's loss function or from the model's own output."""
    import torch

    if loss_fn is not None:
        out = loss_fn(model, batch)
        where = "the loss function"
    else:
        call = "model(**batch)" if isinstance(batch, dict) else "model(*batch)" if isinstance(batch, (tuple, list)) \
            else "model(batch)"
        try:
            out = model(**batch) if isinstance(batch, dict) else model(*batch) if isinstance(batch, (tuple, list)) \
                else model(batch)
        except TypeError as e:  # the batch does not fit the model's forward signature
            raise UserError(f"{call} fails ({_first_line(e)}): pass --loss-fn FILE.py:FN (loss_fn(model, batch) -> "
                            "scalar loss)") from None
        where = "the model"
        if not isinstance(out, torch.Tensor):
            loss = getattr(out, "loss", None)
            if loss is None and isinstance(out, dict):
                loss = out.get("loss")
            out = loss if loss is not None else out
    if not isinstance(out, torch.Tensor) or out.numel() != 1 or not out.is_floating_point():
        shape = f"a tensor of shape {tuple(out.shape)}" if isinstance(out, torch.Tensor) else type(out).__name__
        raise UserError(f"{where} returned {shape}, not a scalar loss: "
                        + ("return loss (one float tensor)" if loss_fn is not None
                           else "pass --loss-fn FILE.py:FN (loss_fn(model, batch) -> scalar)"))
    return out.reshape(())


# -- Hugging Face models from a config (no download) ---------------------------------------

def _hf_config(path: str):
    try:
        import transformers
    except ImportError:
        raise UserError("--model CONFIG needs transformers: pip install transformers (the overdrive[hf] extra)") from None
    p = os.path.join(path, "config.json") if os.path.isdir(path) else path
    if not os.path.isfile(p):
        raise UserError(f"--model {path}: no such config (pass a folder with config.json, or a config .json file)")
    try:
        d = load_json_bounded(p, what="a transformers config")
        model_type = d.pop("model_type")
        return transformers.AutoConfig.for_model(model_type, **d)
    except KeyError:
        raise UserError(f"--model {p} has no model_type: write the config with config.save_pretrained()") from None
    except (ValueError, TypeError) as e:
        raise UserError(f"--model {p} is not a transformers config: {_first_line(e)}") from None


def _hf_model(path: str):
    import transformers

    return transformers.AutoModelForCausalLM.from_config(_hf_config(path))


def _hf_batch(vocab: int, batch: int, seq: int, step: int):
    import torch

    g = torch.Generator().manual_seed(1234 + step)
    ids = torch.randint(0, vocab, (batch, seq), generator=g)
    return {"input_ids": ids, "labels": ids}


def hf_workload(path: str, *, batch_fn: Callable | None = None, loss_fn: Callable | None = None,
                batch: int = 4, seq: int = 64) -> Workload:
    """A causal LM built from a transformers config, trained on random token batches."""
    cfg = _hf_config(path)
    vocab = getattr(cfg, "vocab_size", None)
    if not vocab:
        raise UserError(f"--model {path}: the config has no vocab_size (tune builds causal LMs)")
    max_pos = getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None) or seq
    bf = batch_fn or functools.partial(_hf_batch, int(vocab), batch, min(seq, int(max_pos)))
    return Workload(model_fn=functools.partial(_hf_model, os.path.abspath(path)), batch_fn=bf, loss_fn=loss_fn,
                    label=f"{type(cfg).__name__.replace('Config', '')} from {os.path.basename(path)}")
