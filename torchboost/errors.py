"""Errors a user can act on. The CLI prints them as one line: `error: <what> — <how to fix>`."""

import difflib
import unicodedata
from typing import Iterable

# Characters that would let a name from a file (a class folder, a shard key, a saved value) start a new line,
# rewrite the terminal or reorder the text around it: controls (Cc: newline, CR, ESC...), format characters
# (Cf: bidirectional overrides, zero-width) and line/paragraph separators (Zl, Zp).
_HIDDEN = ("Cc", "Cf", "Zl", "Zp", "Cs")  # controls, bidi/format, line breaks, lone surrogates (unencodable)


def printable(text: object) -> str:
    """`text` safe to print on one line: every control, format or line-separator character is written as
    its escape (\\n, \\x1b, \\u202e), so text from a file can neither cut a line nor forge one."""
    text = str(text)
    if text.isprintable():  # the common case, no work
        return text
    return "".join(c.encode("unicode_escape").decode("ascii") if unicodedata.category(c) in _HIDDEN else c for c in text)


class TorchboostError(Exception):
    """Base class: `what` says what is wrong, `fix` says what to do about it. Both are made printable (one
    line, no terminal controls): messages quote names and values read from files."""

    def __init__(self, what: str, fix: str = "") -> None:
        what, fix = printable(what), printable(fix)
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
