"""What makes a folder one of our checkpoints: `manifest.json` (size and SHA-256 of every file,
written last, atomically) and, while a save is under way, the `.overdrive-partial` marker.

The manifest catches truncation and bit flips inside tensor data, which DCP would load silently,
and it is the ownership mark: a folder is replaced or deleted only when it holds our manifest (or
our partial marker), never because it happens to sit where a checkpoint would go. It says nothing
about trust (anyone can rewrite it): that is safe.py's job.
"""

from __future__ import annotations

import hashlib
import json
import os

from overdrive.io import load_json_bounded, write_atomic

__all__ = ["MANIFEST", "PARTIAL", "hash_files", "write_manifest", "read_manifest", "verify_manifest", "is_ours",
           "mark_partial"]

MANIFEST = "manifest.json"
PARTIAL = ".overdrive-partial"  # in a folder being written; the folder is ours to delete
_FORMAT = "overdrive.checkpoint/1"


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def _files(folder: str) -> list[str]:
    return sorted(n for n in os.listdir(folder) if n not in (MANIFEST, PARTIAL) and not n.startswith(".tmp-"))


def hash_files(folder: str, *, rank: int = 0, world: int = 1) -> dict[str, dict]:
    """{name: {bytes, sha256}} for this rank's share of the folder's files (every world-th file):
    ranks hash in parallel and rank 0 gathers the parts."""
    return {n: {"bytes": os.path.getsize(os.path.join(folder, n)), "sha256": _sha256(os.path.join(folder, n))}
            for n in _files(folder)[rank::world]}


def write_manifest(folder: str, files: dict[str, dict], **info) -> None:
    write_atomic(os.path.join(folder, MANIFEST), json.dumps({"format": _FORMAT, **info, "files": files}, indent=1))


def read_manifest(folder: str) -> dict | None:
    try:
        m = load_json_bounded(os.path.join(folder, MANIFEST), what="a checkpoint manifest")
        return m if isinstance(m, dict) and m.get("format") == _FORMAT and isinstance(m.get("files"), dict) else None
    except (OSError, ValueError, RecursionError):
        return None


def mark_partial(folder: str) -> None:
    """Create `folder` holding the partial marker (the first thing a save writes)."""
    os.makedirs(folder)
    with open(os.path.join(folder, PARTIAL), "w") as f:
        f.write("an overdrive checkpoint being written; safe to delete\n")


def is_ours(folder: str) -> bool:
    """A folder we wrote: it holds our manifest or our partial marker (a real folder, not a link)."""
    if os.path.islink(folder) or not os.path.isdir(folder):
        return False
    return read_manifest(folder) is not None or os.path.isfile(os.path.join(folder, PARTIAL))


def verify_manifest(folder: str, *, rank: int = 0, world: int = 1) -> str | None:
    """None if this rank's share of the files matches the manifest, else what is wrong (one phrase)."""
    m = read_manifest(folder)
    if m is None:
        return "no valid manifest.json (an interrupted or foreign save)"
    names = sorted(m["files"])
    for n in names[rank::world]:
        p, want = os.path.join(folder, n), m["files"][n]
        if not isinstance(want, dict) or os.path.basename(n) != n or n in (".", "..") or \
                type(want.get("bytes")) is not int or not isinstance(want.get("sha256"), str):
            return f"manifest entry {n!r} is malformed (bytes an integer, sha256 a string)"
        if not os.path.isfile(p):
            return f"{n} is missing"
        if os.path.getsize(p) != want.get("bytes"):
            return f"{n} has {os.path.getsize(p)} bytes, the manifest says {want.get('bytes')} (truncated?)"
        if _sha256(p) != want.get("sha256"):
            return f"{n} fails its SHA-256 check (corrupted on disk?)"
    return None
