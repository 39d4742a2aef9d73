"""Atomic file replacement: a reader never sees a half-written file, even after a crash or SIGKILL."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path next to `path`; on success fsync it and os.replace it onto `path`.

    The temp file lives in the same folder so os.replace is a same-filesystem rename (atomic on POSIX);
    the folder is fsynced too so the rename itself survives a power cut. On any exception the temp file
    is removed and `path` is left untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        yield tmp
        with open(tmp, "rb+") as f:  # fsync here so writers that open the file themselves are covered too
            os.fsync(f.fileno())
        os.replace(tmp, path)
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    finally:
        tmp.unlink(missing_ok=True)
