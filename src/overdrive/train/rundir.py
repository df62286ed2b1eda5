"""A run folder belongs to one run, and one trainer at a time.

- Each run has an id (in config.json and in every checkpoint's manifest). Starting a run in a folder
  that holds another run's files needs `resume` (continue that run) or `overwrite` (delete its files);
  otherwise the new run goes to a fresh folder next to it (`runs/tiny-2`) and says so. Following the
  README's examples one after the other therefore never mixes checkpoints, `latest` or metrics.
- A lock (`run.lock`, an flock held for the life of the run, holding the holder's pid and host) makes
  a second trainer on the same folder fail at once with a message naming the holder. The kernel drops
  an flock when its process dies, so a lock left by a killed trainer is taken over, and that is said.
"""

from __future__ import annotations

import datetime as _dt
import fcntl
import json
import os
import secrets
import shutil
import socket
from collections.abc import Callable
from dataclasses import dataclass, field

import torch.distributed as dist

from overdrive.io import check_writable, load_json_bounded

__all__ = ["RunDirError", "RunLock", "RunDir", "claim_run_dir", "claim_for_ranks", "LOCK_FILE"]

LOCK_FILE = "run.lock"
# The files a run writes into its folder; --overwrite deletes these (and, inside checkpoints/, tb/ and
# teacher/, only what carries our mark) and nothing else.
_RUN_FILES = ("metrics.jsonl", "config.json", "recipe.json", "conversions.json")


class RunDirError(ValueError):
    """The run folder cannot be used as asked; the message says why and what to do."""


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


class RunLock:
    """An exclusive, non-blocking flock on FOLDER/run.lock; the file names the holder while held."""

    def __init__(self, folder: str, *, name: str = LOCK_FILE, what: str | None = None, transient: bool = False,
                 holder: str = "another trainer",
                 fix: str = "wait for it to finish or set another train.out_dir") -> None:
        """`name`: the lock file in `folder`; `what` (default: the folder), `holder` and `fix` word the refusal.
        transient: the file is removed on release (acc.save locks PARENT/.NAME.lock beside each folder it
        writes, and leaves no litter); a taker then checks it locked the file still at that path."""
        self.folder, self.path, self.fd = folder, os.path.join(folder, name), None
        self.what, self.holder, self.fix, self.transient = what or folder, holder, fix, transient

    def acquire(self, say: Callable[[str], None]) -> RunLock:
        for _ in range(100):  # a transient lock file unlinked between our open and our flock: open it again
            self._acquire(say)
            if not self.transient or _same_file(self.fd, self.path):
                return self
            os.close(self.fd)
            self.fd = None
        raise RunDirError(f"{self.what}: its lock file {self.path} keeps being replaced: {self.fix}")

    def _acquire(self, say: Callable[[str], None]) -> RunLock:
        os.makedirs(self.folder, exist_ok=True)
        try:  # O_NOFOLLOW: a run.lock planted as a link must not truncate the file it points to
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o666)
        except OSError as e:
            raise RunDirError(f"cannot lock {self.path} ({e.strerror}): if it is a link, remove it") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            h = _holder(fd)
            os.close(fd)
            raise RunDirError(f"{self.what} is in use by {self.holder} (pid {h.get('pid', '?')} on "
                              f"{h.get('host', '?')}, since {h.get('started', '?')}): {self.fix}") from None
        h = _holder(fd)
        if h and not isinstance(h.get("pid"), int):  # text overdrive never wrote: another tool's or the user's file
            os.close(fd)
            raise RunDirError(f"{self.path} is a file overdrive did not write (not a lock of ours): move it, or "
                              f"pick another name for {self.what}")
        if h:  # the file still names a holder, yet the lock was free: that process died holding it
            say(f"took over the lock of {self.what} left by pid {h.get('pid', '?')} on {h.get('host', '?')} "
                "(that process is gone)")
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": _now()}).encode(), 0)
        self.fd = fd
        return self

    def release(self) -> None:
        # Truncate, never unlink: unlinking would let a waiter lock a deleted inode while a third
        # process creates a new file, and both would think they hold the lock.
        # A transient file is unlinked while still locked: a waiter that opened it before finds, once it
        # holds the flock, that the path is gone or another file (`_same_file`) and opens again.
        if self.fd is not None:
            os.ftruncate(self.fd, 0)
            if self.transient and _same_file(self.fd, self.path):
                os.unlink(self.path)
            os.close(self.fd)  # closing drops the flock
            self.fd = None


def _same_file(fd: int, path: str) -> bool:
    try:
        a, b = os.fstat(fd), os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _holder(fd: int) -> dict:
    try:
        raw = os.pread(fd, 4096, 0)
        h = json.loads(raw) if raw.strip() else {}
        return h if isinstance(h, dict) else {"pid": "?", "host": "?"}
    except (OSError, ValueError, RecursionError):
        return {"pid": "?", "host": "?"}


@dataclass
class RunDir:
    path: str
    run_id: str
    lock: RunLock
    notes: list[str] = field(default_factory=list)


_CONFIG_SECTIONS = ("model", "data", "train")
"""What every config.json a run writes holds beside its run_id (TrainConfig.to_dict): another tool's
config.json with a "run_id" of its own is the user's file, never a run of ours to resume into or delete."""


def _run_id_of(folder: str) -> str | None:
    try:
        doc = load_json_bounded(os.path.join(folder, "config.json"), what="a run config")
        rid = doc.get("run_id")
        ours = all(isinstance(doc.get(k), dict) for k in _CONFIG_SECTIONS)
        return rid if isinstance(rid, str) and rid and ours else None
    except (OSError, ValueError, AttributeError, RecursionError):
        return None


def _contents(folder: str) -> list[str]:
    return [n for n in os.listdir(folder) if n != LOCK_FILE] if os.path.isdir(folder) else []


def _delete_run(folder: str) -> list[str]:
    """Delete the run in `folder` (whose config.json names a run id): its own files, the checkpoints
    carrying our manifest, tensorboard event files and a teacher run of ours. Returns what was kept."""
    from overdrive.checkpoint.runs import ckpt_root, clean_partial_saves
    from overdrive.checkpoint.manifest import is_ours

    kept = []
    for n in _RUN_FILES:
        p = os.path.join(folder, n)
        if os.path.isfile(p) and not os.path.islink(p):
            os.remove(p)
    root = ckpt_root(folder)
    if os.path.isdir(root) and not os.path.islink(root):
        clean_partial_saves(folder)
        kept += _delete_entries(folder, "checkpoints", lambda n, p: (n.startswith("step_") and is_ours(p)) or (
            n == "latest" and os.path.isfile(p) and not os.path.islink(p)))
    tb = os.path.join(folder, "tb")
    if os.path.isdir(tb) and not os.path.islink(tb):
        kept += _delete_entries(folder, "tb", lambda n, p: n.startswith("events.out.tfevents.") and os.path.isfile(p))
    teacher = os.path.join(folder, "teacher")
    if os.path.isdir(teacher) and not os.path.islink(teacher):
        if _run_id_of(teacher) is not None:
            kept += [os.path.join("teacher", k) for k in _delete_run(teacher)]
            lock = os.path.join(teacher, LOCK_FILE)
            if os.path.isfile(lock):
                os.remove(lock)
            _rmdir_if_empty(teacher)
        else:
            kept.append("teacher")
    kept += [n for n in _contents(folder) if n not in ("checkpoints", "tb", "teacher") and n not in _RUN_FILES]
    return sorted(set(kept))


def _delete_entries(folder: str, sub: str, ours) -> list[str]:
    """Delete the entries of folder/sub that `ours(name, path)` vouches for (a folder of ours whole, a file
    of ours); return the rest as kept (relative to `folder`), and drop sub if it is left empty."""
    root, kept = os.path.join(folder, sub), []
    for n in os.listdir(root):
        p = os.path.join(root, n)
        if ours(n, p):
            shutil.rmtree(p) if os.path.isdir(p) and not os.path.islink(p) else os.remove(p)
        else:
            kept.append(os.path.join(sub, n))
    _rmdir_if_empty(root)
    return kept


def _rmdir_if_empty(path: str) -> None:
    try:
        os.rmdir(path)
    except OSError:
        pass


def new_run_id() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(3)


def claim_run_dir(out_dir: str, *, resume: bool, overwrite: bool, say: Callable[[str], None]) -> RunDir:
    """Lock the folder this run will write to and decide its run id (rank 0 only)."""
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise RunDirError(f"train.out_dir {out_dir} is a file: set train.out_dir to a folder")
    if resume and overwrite:
        raise RunDirError("--resume and --overwrite contradict each other: pick one")
    stuff = _contents(out_dir)
    if stuff and _run_id_of(out_dir) is None:  # the user's own files and no run: never lock, write or delete there
        listed = f"{len(stuff)} other entries ({', '.join(sorted(stuff)[:3])}{', ...' if len(stuff) > 3 else ''})"
        if resume:
            raise RunDirError(f"--resume: {out_dir} holds no overdrive run to continue (no config.json with a run id) "
                              f"but {listed}: pass the train.out_dir of the run to resume, or drop --resume")
        if overwrite:  # refused before the lock: no run.lock left among the user's files
            raise RunDirError(f"--overwrite: {out_dir} holds no overdrive run (no config.json with a run id) but "
                              f"{listed}: it deletes only a run's own files; pick another train.out_dir or move "
                              "those files away")
        return _sibling(out_dir, None, say)
    lock = RunLock(out_dir).acquire(say)
    try:
        old, stuff = _run_id_of(out_dir), _contents(out_dir)
        if resume or not stuff:
            return RunDir(out_dir, old or new_run_id(), lock)
        if overwrite:
            if old is None:
                raise RunDirError(f"--overwrite: {out_dir} holds no overdrive run (no config.json with a run id) but "
                                  f"{len(stuff)} other entries ({', '.join(sorted(stuff)[:3])}"
                                  f"{', ...' if len(stuff) > 3 else ''}): it deletes only a run's own files; pick "
                                  "another train.out_dir or move those files away")
            kept = _delete_run(out_dir)
            say(f"--overwrite: deleted run {old} from {out_dir}"
                + (f" (kept what it did not write: {', '.join(kept[:4])}{' ...' if len(kept) > 4 else ''})"
                   if kept else ""))
            return RunDir(out_dir, new_run_id(), lock)
    except BaseException:
        lock.release()
        raise
    lock.release()
    return _sibling(out_dir, old, say)


def _sibling(out_dir: str, old: str | None, say: Callable[[str], None]) -> RunDir:
    n = 2
    while _contents(f"{out_dir}-{n}"):
        n += 1
    fresh = f"{out_dir}-{n}"
    say(f"{out_dir} holds another run ({old or 'unnamed'}): this run writes to {fresh} (pass --resume to continue "
        "that run, or --overwrite to replace it)" if old else
        f"{out_dir} holds files of no overdrive run: this run writes to {fresh} (they are left as they are)")
    return RunDir(fresh, new_run_id(), RunLock(fresh).acquire(say))


def claim_for_ranks(out_dir: str, rank: int, world: int, *, resume: bool, overwrite: bool,
                    say: Callable[[str], None]) -> tuple[str, str, RunDir | None]:
    """Rank 0 claims the folder (checked writable first); every rank learns where the run goes, or the
    same one-line error."""
    folder, payload = None, [None]
    if rank == 0:
        try:
            check_writable(out_dir, flag="train.out_dir")
            folder = claim_run_dir(out_dir, resume=resume, overwrite=overwrite, say=say)
            try:
                from overdrive.checkpoint import check_checkpoint_root

                check_checkpoint_root(folder.path)  # a `latest` we could not write: said now, on every rank
            except Exception:
                folder.lock.release()
                folder = None
                raise
            payload = [(folder.path, folder.run_id, None)]
        except Exception as e:  # RunDirError, UserError (not writable), OSError: one line on every rank
            payload = [(None, None, str(e))]
    if world > 1:
        dist.broadcast_object_list(payload, src=0)
    path, run_id, err = payload[0]
    if err:
        raise RunDirError(err)
    return path, run_id, folder
