"""A command's private temporary folder, removed when the command ends.

Libraries cache things where their own variables say, else under $HOME or $TMPDIR: torch creates
`$TMPDIR/torchinductor_<user>` when its compiler modules import (`export`, `race`, `lr-find`...), matplotlib
keeps its fonts under `~/.cache`. While a command runs, each variable the user left unset points into one
folder of `tempfile.mkdtemp` (mode 0700), so nothing is left in $HOME or $TMPDIR once it returns. A folder the
tool writes (a run's) still takes precedence for the caches it keeps (`fileio.cache_dir`).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

# each library's cache variable -> its sub-folder of the private folder
VARIABLES = {"TORCHINDUCTOR_CACHE_DIR": "inductor", "TRITON_CACHE_DIR": "triton", "MPLCONFIGDIR": "matplotlib"}
_ACTIVE: list[tuple[Path, frozenset[str]]] = []  # (folder, the variables the user had set) per running command


@contextmanager
def private_folder() -> Iterator[Optional[Path]]:
    """While the block runs, the cache variables the user left unset point into a fresh private folder; after
    it, the environment is as before (torch writes its variable back itself: undone too) and the folder is
    gone. None (and the libraries' defaults) when no temporary folder can be made."""
    saved = {key: os.environ.get(key) for key in VARIABLES}
    try:
        folder = Path(tempfile.mkdtemp(prefix="torchboost-"))
    except OSError:
        yield None
        return
    entry = (folder, frozenset(k for k, v in saved.items() if v is not None))
    _ACTIVE.append(entry)
    for key, kind in VARIABLES.items():
        if saved[key] is None:
            os.environ[key] = str(folder / kind)
    try:
        yield folder
    finally:
        _ACTIVE.remove(entry)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        shutil.rmtree(folder, ignore_errors=True)


def current() -> Optional[Path]:
    """The running command's private folder, if any."""
    return _ACTIVE[-1][0] if _ACTIVE else None


def users_own(key: str) -> bool:
    """Whether environment variable `key` holds the user's value (not one `private_folder` set)."""
    return key in _ACTIVE[-1][1] if _ACTIVE else key in os.environ
