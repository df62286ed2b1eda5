"""One checkpoint folder, written atomically and read back verified: the only place that calls
DCP's save and load.

A save writes into DIR.tmp (marked partial first), every rank its shards and its own extra file
(`extra_rankN.pt`: the step, RNG, scaler, ...). Once every rank has finished, the ranks hash the files
in parallel, rank 0 writes the manifest (last, atomically) and renames the folder into place. A crash
(even SIGKILL) mid-save leaves a marked .tmp folder that is ignored and cleaned later, and the previous
checkpoint stays loadable. A write that fails (a full disk) removes its .tmp and is one line.

A load verifies the manifest (sizes + SHA-256: a bit flip is caught), reads `.metadata` through the
allow-list reader (a tampered one never runs code) and the extra file weights_only.
"""

from __future__ import annotations

import os
import shutil
import warnings
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from overdrive.checkpoint.manifest import PARTIAL, is_ours, mark_partial, verify_manifest, write_manifest, hash_files
from overdrive.checkpoint.safe import SafeReader, UnsafeCheckpoint, load_tensors

__all__ = ["CheckpointError", "save_folder", "load_folder", "verify_folder", "recover_folder", "remove_ours", "gather",
           "barrier"]

REQUIRED = (".metadata", "extra_rank0.pt", "manifest.json")


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used or written; the message says which and what to do."""


def barrier(world: int) -> None:
    if world > 1:
        dist.barrier()


def gather(obj, world: int) -> list:
    if world == 1:
        return [obj]
    out = [None] * world
    dist.all_gather_object(out, obj)
    return out


class _quiet:  # DCP warns "torch.distributed is disabled ... single process": it is, on purpose
    def __enter__(self):
        self._w = warnings.catch_warnings()
        self._w.__enter__()
        warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")

    def __exit__(self, *exc):
        self._w.__exit__(*exc)


def _why(e: BaseException) -> str:
    # DCP's CheckpointException derives from BaseException and carries each rank's failure.
    if isinstance(e, CheckpointException) and getattr(e, "failures", None):
        e = next(iter(e.failures.values()))
        e = getattr(e, "exception", e)
        if isinstance(e, tuple) and e and isinstance(e[0], BaseException):  # (exception, traceback) in torch 2.x
            e = e[0]
    if isinstance(e, OSError) and e.strerror:
        return f"{e.strerror}" + (f" ({e.filename})" if e.filename else "")
    text = str(e).strip().splitlines()
    if "unexpected pos" in str(e):  # torch's zip writer, its file cut short under it
        return "a file could not be written whole (disk full, or a file-size limit)"
    return f"{type(e).__name__}: {(text[0] if text else '')[:200]}"


def remove_ours(path: str) -> bool:
    """Delete `path` if it is a folder we wrote (manifest or partial marker); False if absent."""
    if not os.path.lexists(path):
        return False
    if not is_ours(path):
        kind = "a file" if os.path.isfile(path) else "a link" if os.path.islink(path) else "a folder"
        raise CheckpointError(f"{path} is {kind} overdrive did not write (no manifest.json or {PARTIAL}): refusing "
                              "to replace it; move it away or pick another path")
    _delete_ours(path)
    return True


def _delete_ours(path: str) -> None:
    """Delete a folder of ours so that a kill at any point leaves it still ours: the partial marker goes
    in first and out last (a bare rmtree killed after the manifest went left a folder every later save
    refused as foreign)."""
    marker = os.path.join(path, PARTIAL)
    if not os.path.exists(marker):
        with open(marker, "w") as f:
            f.write("an overdrive checkpoint being deleted; safe to delete\n")
    for n in os.listdir(path):
        p = os.path.join(path, n)
        if n != PARTIAL:
            shutil.rmtree(p) if os.path.isdir(p) and not os.path.islink(p) else os.unlink(p)
    os.unlink(marker)
    os.rmdir(path)


def _empty_dir(path: str) -> bool:
    return os.path.isdir(path) and not os.path.islink(path) and not os.listdir(path)


def _one_error(err: str | None, world: int) -> str | None:
    errs = [e for e in gather(err, world) if e]
    return errs[0] if errs else None


def _complete(path: str) -> bool:
    """A folder of ours holding a whole, verified save (no partial marker left)."""
    return os.path.isdir(path) and not os.path.islink(path) and is_ours(path) \
        and not os.path.exists(os.path.join(path, PARTIAL)) and verify_folder(path) is None


def recover_folder(final: str, *, rank: int = 0, world: int = 1) -> str | None:
    """Put back a save a crash left between its two renames (`final` -> `final.old`, `final.tmp` -> `final`):
    `final` is then missing while `.tmp` (the new save, complete) or `.old` (the previous one) is whole.
    The newer whole one becomes `final` again, so the next save's clean-up of `.tmp`/`.old` never deletes
    the only good copy. Returns what was restored (".tmp" or ".old"), or None. Collective when world > 1."""
    done = None
    if rank == 0 and not os.path.lexists(final):
        for suffix in (".tmp", ".old"):
            if _complete(final + suffix):
                try:
                    os.rename(final + suffix, final)
                    done = suffix
                except OSError:
                    pass
                break
    return gather(done, world)[0]


def _make_way(final: str, also_ours: Callable[[str], bool] | None) -> str | None:
    """Rank 0, before a save: clear our stale .tmp and .old, check `final` may be replaced, and mark the
    new .tmp partial. Returns the error to share with every rank, or None."""
    tmp, old = final + ".tmp", final + ".old"
    try:
        remove_ours(tmp)  # a stale partial save of ours (an earlier crash)
        remove_ours(old)
        if _empty_dir(final):
            os.rmdir(final)  # an empty folder holds nothing to lose
        elif os.path.lexists(final) and not is_ours(final) and not (also_ours and also_ours(final)):
            remove_ours(final)  # raises: not ours, never replaced
        os.makedirs(os.path.dirname(final) or ".", exist_ok=True)
        mark_partial(tmp)
    except CheckpointError as e:
        return str(e)
    except OSError as e:
        return f"cannot write checkpoint {final}: {_why(e)}: free space or pick another folder"
    return None


def save_folder(final: str, states: dict, extra: dict, *, rank: int, world: int, info: dict,
                on_written: Callable[[str], None] | None = None, also_ours: Callable[[str], bool] | None = None) -> str:
    """Write `states` (DCP: sharded per rank) and this rank's `extra` into `final`, atomically.
    `final` may already exist only if it is ours (it is then replaced; `also_ours(final)` may vouch for
    a folder an earlier version wrote without a manifest); `info` goes into the manifest.
    `on_written(tmp)` runs once this rank's files are written, before the rename (tests kill a save there)."""
    tmp, old = final + ".tmp", final + ".old"
    recover_folder(final, rank=rank, world=world)
    err = _make_way(final, also_ours) if rank == 0 else None
    err = _one_error(err, world)
    if err:
        raise CheckpointError(err)
    try:
        with _quiet():
            dcp.save(states, checkpoint_id=tmp, no_dist=world == 1)
        torch.save(extra, os.path.join(tmp, f"extra_rank{rank}.pt"))
        err = None
    except (OSError, CheckpointException) as e:
        err = (f"cannot write checkpoint {final}: {_why(e)}: free space (or pick another folder) and resume; "
               "the previous checkpoint is intact")
    if on_written and err is None:
        on_written(tmp)
    err = _one_error(err, world)
    if err:
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)  # never leave a half-written folder filling the disk
        barrier(world)
        raise CheckpointError(err)
    parts = gather(hash_files(tmp, rank=rank, world=world), world)
    err = None
    if rank == 0:
        try:
            write_manifest(tmp, {k: v for p in parts for k, v in p.items()}, world=world, **info)
            os.remove(os.path.join(tmp, PARTIAL))
            if os.path.lexists(final):
                os.rename(final, old)
            os.rename(tmp, final)
            try:
                remove_ours(old)
            except (OSError, CheckpointError):
                pass  # a leftover .old of ours is removed by the next save
        except OSError as e:
            shutil.rmtree(tmp, ignore_errors=True)
            err = f"cannot write checkpoint {final}: {_why(e)}: free space (or pick another folder) and resume"
    err = _one_error(err, world)
    if err:
        raise CheckpointError(err)
    return final


def _same_keys(path: str, md, state: dict, prefix: str) -> None:
    present = {f"{prefix}.{k}" for k in state}  # a non-tensor entry (TE's _extra_state) may flatten deeper:
    nested = tuple(f"{prefix}.{k}." for k, v in state.items() if not isinstance(v, torch.Tensor))
    more = sorted(k for k in md.state_dict_metadata
                  if k.startswith(prefix + ".") and k not in present and not k.startswith(nested))
    if more:
        names = ", ".join(m[len(prefix) + 1:] for m in more[:3]) + (", ..." if len(more) > 3 else "")
        raise CheckpointError(f"cannot load {path}: it holds {len(more)} {prefix} tensor(s) this one lacks ({names}): "
                              "it was saved from another (larger) model; load it into the model it was saved from")


def verify_folder(path: str, *, rank: int = 0, world: int = 1) -> str | None:
    """None if the folder is a complete, intact checkpoint, else the first problem (collective when world > 1)."""
    if not os.path.isdir(path):
        err = "not a folder" if os.path.lexists(path) else "missing"
    elif not all(os.path.isfile(os.path.join(path, f)) for f in REQUIRED):
        err = "incomplete (.metadata, extra_rank0.pt or manifest.json missing)"
    else:
        err = verify_manifest(path, rank=rank, world=world)
    return _one_error(err, world)


def load_folder(path: str, states: dict, *, rank: int, world: int,
                check_extra: Callable[[dict], None] | None = None, exact: str | None = None) -> dict:
    """Verify, then fill `states` in place (resharded to this world size); returns this rank's extra
    (rank 0's when the folder was saved on fewer ranks). Any failure is a one-line CheckpointError.
    `check_extra(extra)` runs before the tensors are read into `states` (which may be the model's own
    parameters): an extra file it refuses changes nothing. `exact="model"`: the folder may hold no
    tensor under states["model"] that the model lacks (DCP alone fills a smaller model from a larger
    one's matching keys, silently)."""
    recover_folder(path, rank=rank, world=world)
    bad = verify_folder(path, rank=rank, world=world)
    if bad:
        raise CheckpointError(f"{path} is damaged: {bad}")
    try:
        md = SafeReader(path).read_metadata()  # the trust check first, in our words, before DCP sees the folder
        if exact is not None:
            _same_keys(path, md, states.get(exact) or {}, exact)
        mine = os.path.join(path, f"extra_rank{rank}.pt")
        extra = load_tensors(mine if os.path.exists(mine) else os.path.join(path, "extra_rank0.pt"))
        if not isinstance(extra, dict):
            raise CheckpointError(f"cannot load {path}: extra_rank{rank}.pt holds a {type(extra).__name__}, not a dict")
        if check_extra is not None:
            check_extra(extra)
        with _quiet():
            dcp.load(states, storage_reader=SafeReader(path), no_dist=world == 1)
    except UnsafeCheckpoint as e:
        raise CheckpointError(f"{path}: {e}") from None
    except CheckpointError:
        raise
    except (Exception, CheckpointException) as e:
        raise CheckpointError(f"cannot load {path}: {_why(e)} (was it written for another model, or with an "
                              "optimizer when this run has none?)") from None
    return extra
