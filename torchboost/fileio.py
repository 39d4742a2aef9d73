"""Atomic file replacement: a reader never sees a half-written file, even after a crash or SIGKILL.

Every file the library writes goes through `atomic_path` (or `atomic_write`, built on it): a temp file
`.NAME.PID.tmp` in the same folder, flushed and fsynced, then `os.replace`d. A failed write raises
`OutputError` (disk full, quota, permissions) and leaves the previous file untouched; the temp files a
killed run left behind are removed at the next start by `remove_stale_temps`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from torchboost.errors import OutputError

_TEMP = re.compile(r"^\.(?P<name>.+)\.(?P<pid>\d+)\.tmp$")
_STARTED = time.time()  # about when this process started (torchboost is imported early)

_REASONS = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded",
            errno.EACCES: "permission denied", errno.EPERM: "operation not permitted",
            errno.EROFS: "read-only file system", errno.ENOTDIR: "a part of the path is a file, not a folder",
            errno.EISDIR: "it is a folder", errno.ENAMETOOLONG: "the name is too long for the file system"}
_FULL = (errno.ENOSPC, errno.EDQUOT)


def output_error(path: str | os.PathLike, e: OSError) -> OutputError:
    """The one error for an output that cannot be written, with a reason a user can act on."""
    reason = _REASONS.get(e.errno) or e.strerror or str(e)
    fix = ("free disk space or choose another --output" if e.errno in _FULL
           else "use a shorter name or folder" if e.errno == errno.ENAMETOOLONG
           else "remove or rename what is in the way, or choose another --output" if e.errno in (errno.ENOTDIR, errno.EISDIR)
           else "make the folder writable or choose another --output")
    return OutputError(f"cannot write {path}: {reason}", f"{fix}; the last good checkpoint is intact")


def temp_path(path: str | os.PathLike) -> Path:
    """The temp file `atomic_path` writes before renaming it onto `path`."""
    path = Path(path)
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path next to `path`; on success fsync it and os.replace it onto `path`.

    The temp file lives in the same folder so os.replace is a same-filesystem rename (atomic on POSIX);
    the folder is fsynced too so the rename itself survives a power cut. On any exception the temp file
    is removed and `path` is left untouched; an OSError (in the body or here) becomes `OutputError`.
    """
    path = Path(path)
    if not path.name or path.is_dir():
        raise OutputError(f"cannot write {path}: it is a folder", "give a file name")
    tmp = temp_path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        yield tmp
        with open(tmp, "rb+") as f:  # fsync here so writers that open the file themselves are covered too
            os.fsync(f.fileno())
        os.replace(tmp, path)
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError as e:
        raise output_error(path, e) from e
    finally:
        with contextlib.suppress(OSError):  # cleanup must never hide the error being raised (ENOTDIR, EACCES...)
            tmp.unlink(missing_ok=True)


def atomic_write(path: str | os.PathLike, data: bytes | str) -> Path:
    """Replace `path` with `data` (str is written as UTF-8) atomically; returns the path."""
    raw = data.encode() if isinstance(data, str) else data
    with atomic_path(path) as tmp:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(raw)
            while view:  # os.write may write less than asked
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
    return Path(path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def remove_stale_temps(directory: str | os.PathLike, started: float | None = None) -> list[Path]:
    """Remove the `.NAME.PID.tmp` files a killed run left in `directory`; returns what was removed.

    A temp file is stale when its process is gone, or when it was last written before `started` (default:
    this process's start; catches PIDs reused after a restart and files from another machine). A temp
    file a live process is writing right now is kept: writing keeps its modification time recent.
    """
    directory = Path(directory)
    if not directory.is_dir():
        return []
    started = _STARTED if started is None else started
    removed = []
    for p in directory.iterdir():
        m = _TEMP.match(p.name)
        if not m or not p.is_file():
            continue
        try:
            stale = not _alive(int(m["pid"])) or p.stat().st_mtime < started
            if stale:
                p.unlink()
                removed.append(p)
        except FileNotFoundError:  # its writer renamed or removed it meanwhile
            continue
    return removed
