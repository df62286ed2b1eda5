"""Results folders are ours or refused, and one writer at a time.

`claim_results_dir(out)` before any work: the folder must be new, empty, or marked as written by
Overdrive (the marker file, or a results.json of ours from before the marker existed); an flock on
OUT/.overdrive.lock, held for the life of the run, makes a second run writing to the same folder fail
in one line (exit 2) instead of both exiting 0 with the first run's results silently replaced.
"""

from __future__ import annotations

import fcntl
import os
import socket

from overdrive.errors import UserError
from overdrive.io import load_json_bounded

__all__ = ["MARKER", "LOCK", "ResultsLock", "claim_results_dir", "is_ours"]

MARKER = ".overdrive-results"
LOCK = ".overdrive.lock"
_QUIET = {MARKER, LOCK}


def is_ours(folder: str) -> bool:
    """The folder holds our marker, or a results.json whose schema tag is one of ours."""
    if os.path.isfile(os.path.join(folder, MARKER)):
        return True
    try:
        doc = load_json_bounded(os.path.join(folder, "results.json"), what="results")
        return isinstance(doc, dict) and str(doc.get("schema", "")).startswith("overdrive.")
    except (OSError, ValueError, RecursionError):
        return False


class ResultsLock:
    def __init__(self, folder: str, fd: int, *, created: bool = False, fresh: bool = False) -> None:
        self.folder, self.fd = folder, fd
        self.created, self.fresh = created, fresh
        """The claim made the folder / the folder held nothing at all before the claim."""

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing drops the flock; the file stays (unlinking races a waiter)
            self.fd = None

    def abandon(self) -> None:
        """Release after a run that wrote nothing: a folder that held nothing before the claim gets its
        marker and lock removed again (and is removed itself if the claim made it), so a failed command
        leaves no trace; a folder that held anything before is left as it is."""
        self.release()
        if not self.fresh:
            return
        try:
            if set(os.listdir(self.folder)) <= _QUIET:
                for name in _QUIET:
                    if os.path.lexists(os.path.join(self.folder, name)):
                        os.unlink(os.path.join(self.folder, name))
                if self.created:
                    os.rmdir(self.folder)
        except OSError:
            pass  # someone else's file appeared, or the folder went: nothing of ours to tidy

    def __enter__(self) -> ResultsLock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def claim_results_dir(out: str, *, flag: str = "--out", what: str = "overdrive") -> ResultsLock:
    """Create or check `out`, take its lock and leave the marker; UserError (one line) otherwise."""
    if os.path.exists(out) and not os.path.isdir(out):
        raise UserError(f"{flag} {out} is a file: pass a folder (it is created if missing)")
    created = not os.path.lexists(out)
    try:
        os.makedirs(out, exist_ok=True)
        fresh = not os.listdir(out)
        existing = [f for f in os.listdir(out) if f not in _QUIET]
    except OSError as e:
        raise UserError(f"{flag} {out} is not writable ({e.strerror or type(e).__name__}): pass a path you can "
                        "write to") from None
    if existing and not is_ours(out):
        raise UserError(f"{flag} {out} holds files Overdrive did not write ({', '.join(sorted(existing)[:3])}"
                        f"{', ...' if len(existing) > 3 else ''}): pass a new or empty folder")
    try:
        # O_NOFOLLOW: a lock file planted as a link to another file must not truncate that file.
        fd = os.open(os.path.join(out, LOCK), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as e:
        raise UserError(f"{flag} {out} is not writable ({e.strerror or type(e).__name__}): pass a path you can "
                        "write to") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 200, 0).decode(errors="replace").strip()
        os.close(fd)
        raise UserError(f"{flag} {out} is in use by another overdrive run ({holder or 'unknown holder'}): wait for "
                        "it to finish or pass another folder") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{what} pid {os.getpid()} on {socket.gethostname()}".encode(), 0)
    marker = os.path.join(out, MARKER)
    if not os.path.exists(marker):
        from overdrive.io import write_atomic

        write_atomic(marker, "This folder holds results written by Overdrive.\n")
    return ResultsLock(out, fd, created=created, fresh=fresh)
