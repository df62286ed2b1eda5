"""Files written so that a crash leaves the old version or the new one, never half of one; output
paths checked before the work that fills them; JSON read from untrusted files without tracebacks."""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile

from overdrive.errors import UserError

__all__ = ["write_atomic", "check_writable", "read_json", "refuse_links", "stage_folder", "discard_stage", "publish"]


def _umask() -> int:
    mask = os.umask(0)  # the only portable way to read it: set and restore at once
    os.umask(mask)
    return mask


def write_atomic(path: str, data: str | bytes) -> None:
    """Write to a temporary file in the same folder, fsync, then rename over `path`: a crash
    leaves either the old file or the new one, never half of one. The file gets the mode a plain
    open() would give it (0666 less the umask), not mkstemp's private 0600."""
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-", suffix=os.path.basename(path))
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def check_writable(path: str, *, flag: str, kind: str = "folder", fix: str = "pass a path you can write to",
                   create: bool = True) -> None:
    """Refuse, before any work, an output that could not be written at the end.

    kind="folder": `path` is (or will be created as) a folder that receives files;
    kind="file": `path` is a file to (over)write. Creates missing folders (create=False: probes the nearest
    existing one instead, so a run refused later leaves nothing behind), writes and deletes a probe
    file, and raises UserError naming the flag and `fix`.
    """
    p = os.path.abspath(path)
    if kind == "file":
        if os.path.isdir(p):
            raise UserError(f"{flag} {path} is a folder: pass a file path")
        folder = os.path.dirname(p)
    else:
        if os.path.exists(p) and not os.path.isdir(p):
            raise UserError(f"{flag} {path} is a file: pass a folder (it is created if missing)")
        folder = p
    if not create:
        while not os.path.exists(folder):
            folder = os.path.dirname(folder)
    try:
        if create:
            os.makedirs(folder, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".overdrive-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise UserError(f"{flag} {path} is not writable ({e.strerror or type(e).__name__}): {fix}") from None


MAX_JSON_BYTES = 256 << 20
"""The largest JSON file any reader here accepts (a results file with every round is a few MB)."""


def load_json_bounded(path: str, *, what: str, tail: str = "", limit: int = MAX_JSON_BYTES):
    """json.load of a regular file of at most `limit` bytes. Every way it can be wrong (missing, a
    folder, a FIFO or device, too large, not UTF-8, not JSON, nested deeper than Python recurses,
    unreadable) is one ValueError/FileNotFoundError line ending in `tail`."""
    try:
        st = os.stat(path)
        if stat.S_ISDIR(st.st_mode):
            raise ValueError(f"{path} is a folder, not {what}{tail}")
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{path} is not a regular file{tail}")
        if st.st_size > limit:
            raise ValueError(f"{path} is too large ({st.st_size:,} bytes) to be {what}{tail}")
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise FileNotFoundError(f"{path} not found{tail}") from None
    except UnicodeDecodeError:
        raise ValueError(f"{path} is not a text JSON file{tail}") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON ({e.msg} at line {e.lineno}){tail}") from None
    except RecursionError:
        raise ValueError(f"{path} is nested too deeply to be {what}{tail}") from None
    except OSError as e:  # unreadable (permissions, a vanished mount): one line, never a traceback
        raise ValueError(f"{path} cannot be read ({e.strerror or type(e).__name__}){tail}") from None


def read_json(path: str, *, schema: dict | None = None, what: str = "JSON file", fix: str = "") -> object:
    """A JSON document from a file (`load_json_bounded`), checked against a JSON schema when one is given.

    Every way the file can be wrong (missing, not JSON, nested deeper than Python recurses, not
    matching the schema) is a ValueError/FileNotFoundError with one line naming the problem.
    """
    tail = f": {fix}" if fix else ""
    doc = load_json_bounded(path, what=f"a {what}", tail=tail)
    if schema is not None:
        check_schema(doc, schema, where=path, what=what, a_what=f"a {what}", tail=tail)
    return doc


def check_schema(doc, schema: dict, *, where: str, what: str, a_what: str, tail: str = "") -> None:
    """ValueError (one line: where, the field, what is wrong) unless `doc` matches the JSON `schema`."""
    import jsonschema

    try:
        err = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema).iter_errors(doc))
    except RecursionError:
        raise ValueError(f"{where} is nested too deeply to be {a_what}{tail}") from None
    if err is not None:
        at = "/".join(str(x) for x in err.absolute_path) or "top level"
        raise ValueError(f"{where} is not a valid {what}: at {at}: {err.message[:200]}{tail}")


STAGE_PREFIX = ".staging-"
"""Hidden folders inside an output folder where a multi-file result is written before it is published."""


def refuse_links(out: str, entries: list[str], *, flag: str = "--out") -> None:
    """Refuse, before any work, an output whose entries (or the folders on their way) are symbolic links:
    writing through one would change a file outside `out`."""
    for e in entries:
        parts = e.split("/")
        for i in range(1, len(parts) + 1):
            p = os.path.join(out, *parts[:i])
            if os.path.islink(p):
                raise UserError(f"{flag} {out}: {os.path.join(*parts[:i])} is a symbolic link (to "
                                f"{os.readlink(p)}): Overdrive never writes through one; remove it or pass another "
                                "folder")


def stage_folder(out: str) -> str:
    """A fresh hidden folder inside `out` (same file system, so its entries rename into place); stale
    ones a killed run left are removed first (the caller holds `out`'s lock)."""
    for n in os.listdir(out):
        p = os.path.join(out, n)
        if n.startswith(STAGE_PREFIX) and os.path.isdir(p) and not os.path.islink(p):
            shutil.rmtree(p, ignore_errors=True)
    return tempfile.mkdtemp(dir=out, prefix=STAGE_PREFIX)


def discard_stage(stage: str) -> None:
    shutil.rmtree(stage, ignore_errors=True)


def publish(stage: str, out: str, entries: list[str], *, last: str) -> None:
    """Make each of `entries` (paths relative to `out`; `last` too) what it is in `stage`, or absent
    when `stage` lacks it; then remove `stage`. `last` is removed first and moved in last: a publish cut
    short leaves no `last` (an export without export.json is visibly unfinished). Renames never follow
    a symbolic link: a link in the way is replaced, the file it points to is not touched. A folder entry
    is replaced whole (the old one is moved aside, then deleted)."""
    _replace(os.path.join(stage, last), os.path.join(out, last), stage, put=False)
    for e in entries:
        _replace(os.path.join(stage, e), os.path.join(out, e), stage)
    _replace(os.path.join(stage, last), os.path.join(out, last), stage)
    discard_stage(stage)


def _replace(src: str, dst: str, stage: str, *, put: bool = True) -> None:
    have = put and os.path.lexists(src)
    if os.path.lexists(dst):
        if os.path.isdir(dst) and not os.path.islink(dst):
            aside = tempfile.mkdtemp(dir=stage, prefix=".old-")
            os.rename(dst, os.path.join(aside, "x"))
        elif not have or os.path.isdir(src):
            os.unlink(dst)  # a file (or link) replaced by a folder, or by nothing
        # else: rename(2) below replaces the file or the link itself, atomically
    if have:
        parent = os.path.dirname(dst)
        if os.path.islink(parent) or (os.path.lexists(parent) and not os.path.isdir(parent)):
            raise UserError(f"{parent} is a symbolic link or a file: Overdrive never writes through one; remove "
                            "it and export again")
        os.makedirs(parent, exist_ok=True)
        os.rename(src, dst)
