"""matplotlib for writing PNG files, whatever the user's environment says about displays."""

from __future__ import annotations

import os
from types import ModuleType


def pyplot() -> ModuleType:
    """`matplotlib.pyplot` on the file-only Agg backend. The tool only writes PNGs: a GUI backend would want a
    display, and an unknown `MPLBACKEND` (matplotlib validates it while importing) would fail the run after
    its first epoch, so the variable is set aside while matplotlib is imported (and put back)."""
    saved = os.environ.pop("MPLBACKEND", None)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    finally:
        if saved is not None:
            os.environ["MPLBACKEND"] = saved
    return plt
