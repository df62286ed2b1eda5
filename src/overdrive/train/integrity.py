"""The trust boundary of a checkpoint folder: nothing in it runs code, and nothing damaged loads.

Two independent guards, because checkpoint folders are handed around:
- `SafeReader`: DCP's FileSystemReader reads `.metadata` with plain `pickle.load`, so a crafted file
  runs arbitrary code on load. Ours unpickles it with an allow-list of exactly the classes DCP's
  metadata is made of (found by reading real `.metadata` files: the dataclasses of
  torch.distributed.checkpoint.metadata, `_StorageInfo`, torch.Size, dtypes, layouts, paths);
  anything else is refused before it is called. Tensor shards are already read with
  `torch.load(weights_only=True)` by DCP, and our `extra_rank*.pt` the same way.
- A manifest (`manifest.json`: size and SHA-256 of every file, written last, atomically) catches
  truncation and bit flips inside tensor data, which DCP would load silently. It says nothing
  about trust (anyone can rewrite it): that is the unpickler's job.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle

import torch
from torch.distributed.checkpoint import FileSystemReader

from overdrive.io import write_atomic

__all__ = ["SafeReader", "UnsafeCheckpoint", "write_manifest", "verify_manifest", "hash_files", "MANIFEST"]

MANIFEST = "manifest.json"
_FORMAT = "overdrive.checkpoint/1"

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
            md = _MetadataUnpickler(io.BytesIO(f.read())).load()
        if not isinstance(md, Metadata):
            raise UnsafeCheckpoint(f".metadata holds a {type(md).__name__}, not DCP Metadata: refused")
        if getattr(md, "storage_meta", None) is None:
            md.storage_meta = StorageMeta()
        md.storage_meta.load_id = self.load_id
        return md


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def _files(folder: str) -> list[str]:
    return sorted(n for n in os.listdir(folder) if n != MANIFEST and not n.startswith(".tmp-"))


def hash_files(folder: str, *, rank: int = 0, world: int = 1) -> dict[str, dict]:
    """{name: {bytes, sha256}} for this rank's share of the folder's files (every world-th file):
    ranks hash in parallel and rank 0 gathers the parts."""
    return {n: {"bytes": os.path.getsize(os.path.join(folder, n)), "sha256": _sha256(os.path.join(folder, n))}
            for n in _files(folder)[rank::world]}


def write_manifest(folder: str, files: dict[str, dict], **info) -> None:
    write_atomic(os.path.join(folder, MANIFEST), json.dumps({"format": _FORMAT, **info, "files": files}, indent=1))


def read_manifest(folder: str) -> dict | None:
    try:
        with open(os.path.join(folder, MANIFEST)) as f:
            m = json.load(f)
        return m if isinstance(m, dict) and m.get("format") == _FORMAT and isinstance(m.get("files"), dict) else None
    except (OSError, ValueError, RecursionError):
        return None


def verify_manifest(folder: str, *, rank: int = 0, world: int = 1) -> str | None:
    """None if this rank's share of the files matches the manifest, else what is wrong (one phrase)."""
    m = read_manifest(folder)
    if m is None:
        return "no valid manifest.json (an interrupted or foreign save)"
    names = sorted(m["files"])
    for n in names[rank::world]:
        p, want = os.path.join(folder, n), m["files"][n]
        if not isinstance(want, dict) or os.path.basename(n) != n:
            return f"manifest entry {n!r} is malformed"
        if not os.path.isfile(p):
            return f"{n} is missing"
        if os.path.getsize(p) != want.get("bytes"):
            return f"{n} has {os.path.getsize(p)} bytes, the manifest says {want.get('bytes')} (truncated?)"
        if _sha256(p) != want.get("sha256"):
            return f"{n} fails its SHA-256 check (corrupted on disk?)"
    return None
