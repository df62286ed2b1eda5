"""The trust boundary: nothing read from a checkpoint folder or a weights file runs code.

- `SafeReader`: DCP's FileSystemReader reads `.metadata` with plain `pickle.load`, so a crafted file
  runs arbitrary code on load. Ours unpickles it with an allow-list of exactly the classes DCP's
  metadata is made of (found by reading real `.metadata` files: the dataclasses of
  torch.distributed.checkpoint.metadata, `_StorageInfo`, torch.Size, dtypes, layouts, paths);
  anything else is refused before it is called. DCP reads tensor shards with
  `torch.load(weights_only=True)` already.
- `load_tensors`: every other file we read (extra_rankN.pt, exported state_dicts) goes through
  `torch.load(weights_only=True)` here, and nowhere else in the package.
"""

from __future__ import annotations

import io
import pickle

import torch
from torch.distributed.checkpoint import FileSystemReader

__all__ = ["SafeReader", "UnsafeCheckpoint", "load_tensors", "save_tensors"]

_DCP = "torch.distributed.checkpoint."
_ALLOWED = {
    (_DCP + "metadata", n) for n in ("Metadata", "MetadataIndex", "ChunkStorageMetadata", "TensorProperties",
                                     "TensorStorageMetadata", "BytesStorageMetadata", "StorageMeta",
                                     "_MEM_FORMAT_ENCODING")
} | {(_DCP + "filesystem", "_StorageInfo"), ("torch", "Size"), ("torch.serialization", "_get_layout"),
     ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"), ("pathlib", "WindowsPath"),
     ("pathlib", "PureWindowsPath"), ("collections", "OrderedDict")}


class UnsafeCheckpoint(RuntimeError):
    """A checkpoint file asked to load something a checkpoint never contains."""


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) in _ALLOWED or (module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)):
            return super().find_class(module, name)
        raise UnsafeCheckpoint(f".metadata asks to load {module}.{name}, which DCP metadata never contains: refused "
                               "(the folder may have been tampered with; do not use it)")

    def persistent_load(self, pid):  # DCP never writes persistent ids
        raise UnsafeCheckpoint(".metadata holds a persistent id, which DCP metadata never contains: refused")


class SafeReader(FileSystemReader):
    """FileSystemReader whose `.metadata` goes through the allow-list above, never plain pickle."""

    def read_metadata(self, *args, **kwargs):
        from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

        with open(self._get_metadata_path(kwargs.get("rank")), "rb") as f:
            raw = f.read()
        try:
            md = _MetadataUnpickler(io.BytesIO(raw)).load()
        except UnsafeCheckpoint:
            raise
        except Exception as e:  # not a pickle at all: one line, like the rest
            raise UnsafeCheckpoint(f".metadata is not DCP metadata ({type(e).__name__}): refused") from None
        if not isinstance(md, Metadata):
            raise UnsafeCheckpoint(f".metadata holds a {type(md).__name__}, not DCP Metadata: refused")
        if getattr(md, "storage_meta", None) is None:
            md.storage_meta = StorageMeta()
        md.storage_meta.load_id = self.load_id
        return md


def load_tensors(path: str, *, map_location: str | torch.device = "cpu"):
    """A torch-saved object of tensors and plain Python values; weights_only, so no code runs from it."""
    return torch.load(path, map_location=map_location, weights_only=True)


def save_tensors(path: str, obj) -> None:
    """torch.save, atomically (a crash leaves the old file or the new one, never half of one)."""
    from overdrive.io import write_atomic

    buf = io.BytesIO()
    torch.save(obj, buf)
    write_atomic(path, buf.getvalue())
