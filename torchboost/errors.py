"""Errors a user can act on. The CLI prints them as one line: `error: <what> — <how to fix>`."""

import difflib
from typing import Iterable


class TorchboostError(Exception):
    """Base class: `what` says what is wrong, `fix` says what to do about it."""

    def __init__(self, what: str, fix: str = "") -> None:
        self.what = what
        self.fix = fix
        super().__init__(f"{what} — {fix}" if fix else what)


class ConfigError(TorchboostError):
    """Bad recipe, unknown key, wrong type, impossible option combination."""


class DataError(TorchboostError):
    """Missing/empty folders, corrupt images, malformed data files."""


class CheckpointError(TorchboostError):
    """Unreadable checkpoint, or one that does not match the model."""


class DistributedError(TorchboostError):
    """Process-group problems: a rank died, timeouts, unsupported world sizes, ranks that disagree."""


class OutputError(TorchboostError):
    """An output file or folder cannot be written: disk full, quota, permissions, read-only file system."""


class TrainingError(TorchboostError):
    """Training cannot go on meaningfully: the loss (or the weights) became non-finite."""


def suggest(key: str, valid: Iterable[str]) -> str:
    """The fix half of an 'unknown X' error: the closest valid name, else the list of valid ones."""
    valid = list(valid)
    close = difflib.get_close_matches(key, valid, n=1, cutoff=0.5)
    return f"did you mean '{close[0]}'?" if close else f"valid: {', '.join(valid) or 'none'}"
