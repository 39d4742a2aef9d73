"""matplotlib for writing PNG files, whatever the user's environment says about displays."""

from __future__ import annotations

import os
import sys
from types import ModuleType

from torchboost.fileio import cache_dir, make_dirs
from torchboost.scratch import users_own


def pyplot() -> ModuleType:
    """`matplotlib.pyplot` on the file-only Agg backend. The tool only writes PNGs: a GUI backend would want a
    display, and an unknown `MPLBACKEND` (matplotlib validates it while importing) would fail the run after
    its first epoch, so the variable is set aside while matplotlib is imported (and put back)."""
    saved = os.environ.pop("MPLBACKEND", None)
    # matplotlib settles its config and font cache folder at its first import: the run's cache, not ~/.matplotlib
    folder = None if users_own("MPLCONFIGDIR") or "matplotlib" in sys.modules else cache_dir("matplotlib")
    before = os.environ.get("MPLCONFIGDIR")
    if folder is not None:
        os.environ["MPLCONFIGDIR"] = str(make_dirs(folder))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    finally:
        if saved is not None:
            os.environ["MPLBACKEND"] = saved
        if folder is not None:  # read once, at the import: later runs must not inherit this run's
            if before is None:
                del os.environ["MPLCONFIGDIR"]
            else:
                os.environ["MPLCONFIGDIR"] = before
    return plt
