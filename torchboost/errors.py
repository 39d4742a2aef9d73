"""Errors a user can act on. The CLI prints them as one line: `error: <what> — <how to fix>`."""


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
    """Process-group problems: a rank died, timeouts, unsupported world sizes."""
