"""A run's output folder: one run per folder, a lock against two live runs, the resolved config file.

A new run refuses a folder that holds another run's files unless it resumes (`--resume`) or is told to
replace them (`--overwrite`): keep-newest-N pruning, the history and config.yaml of the old run would
otherwise be lost without a word. The lock is an `fcntl.flock` on OUTPUT/.lock, released by the kernel
when the process dies, so a killed run never leaves a stale lock behind.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import time
from pathlib import Path
from typing import IO, Iterator, Optional

from torchboost.errors import ConfigError, OutputError
from torchboost.fileio import atomic_write

# What `torchboost train` writes into an output folder (the run's artifacts, nothing else is touched).
# The per-rank worklogs in log/ are opened before the folder is claimed and only ever appended to: they
# are not evidence of another run, and --overwrite keeps them.
RUN_FILES = ("config.yaml", "history.jsonl", "history.csv", "history.png")
RUN_DIRS = ("ckpt", "tensorboard", "profile")
CHECKPOINT = re.compile(r".+-(\d+_\d+|best)\.pt$")  # ModelCheckpoint's names: PREFIX-E_S.pt, PREFIX-best.pt


def previous_run(out: Path) -> list[str]:
    """The artifacts of an earlier run in `out` (empty when the folder is new or holds none)."""
    found = [name for name in RUN_FILES if (out / name).exists()]
    found += [f"{name}/" for name in RUN_DIRS if (out / name).is_dir() and any((out / name).iterdir())]
    return found


def check_output(out: Path, resume: Optional[str], overwrite: bool) -> None:
    """Refuse a folder that belongs to another run (before anything is written or deleted)."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"output {out} is a file, not a folder", "choose another --output")
    found = previous_run(out)
    if found and not resume and not overwrite:
        raise ConfigError(f"output folder {out} holds another run ({', '.join(found)})",
                          "continue it with --resume CHECKPOINT, replace it with --overwrite, or choose another "
                          "--output")


@contextlib.contextmanager
def claim_output(out: Path, resume: Optional[str], overwrite: bool) -> Iterator[None]:
    """Hold OUTPUT/.lock for the run; with `overwrite` (and no resume) remove the earlier run's artifacts
    (its files, its checkpoints, its TensorBoard and profiler folders; nothing else)."""
    check_output(out, resume, overwrite)
    try:
        out.mkdir(parents=True, exist_ok=True)
        lock = open(out / ".lock", "a+")
    except OSError as e:
        raise OutputError(f"cannot create output folder {out}: {e.strerror}", "choose a writable --output") from None
    with lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = _lock_owner(lock)
            raise ConfigError(f"output folder {out} is in use by a live run ({owner})",
                              "wait for it to finish or choose another --output") from None
        lock.seek(0)
        lock.truncate()
        lock.write(f"pid {os.getpid()}\n")  # first, so a run refused meanwhile can name us
        lock.flush()
        # Again, under the lock: a run that held it while we checked may have finished meanwhile, leaving
        # its files behind — they are another run's now, not ours to overwrite.
        check_output(out, resume, overwrite)
        if overwrite and not resume:
            remove_run(out)
        yield


def _lock_owner(lock: IO[str]) -> str:
    """The holder's "pid N" line; it writes it right after taking the lock, so wait a moment for it."""
    for _ in range(50):
        lock.seek(0)
        owner = lock.read().strip()
        if owner:
            return owner
        time.sleep(0.01)
    return "another process"


def remove_run(out: Path) -> None:
    """The earlier run's artifacts, and only those: a user's own files in the folder (ckpt/ included) stay."""
    for name in RUN_FILES:
        (out / name).unlink(missing_ok=True)
    for path in (out / "ckpt").glob("*.pt"):
        if CHECKPOINT.match(path.name):
            path.unlink()
    for name in RUN_DIRS:
        if name != "ckpt":  # the run owns these folders whole; in ckpt/ only its checkpoints
            shutil.rmtree(out / name, ignore_errors=True)


def write_config(out: Path, text: str) -> None:
    atomic_write(out / "config.yaml", text)
