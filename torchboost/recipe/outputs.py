"""A run's output folder: one run per folder, a lock against two live runs, the resolved config file.

A new run refuses a folder that holds another run's files unless it resumes (`--resume`) or is told to
replace them (`--overwrite`): keep-newest-N pruning, the history and config.yaml of the old run would
otherwise be lost without a word. The lock is an `fcntl.flock` on OUTPUT/.lock, released by the kernel
when the process dies, so a killed run never leaves a stale lock behind; a run that ends removes the file.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import glob
import os
import stat
import time
from pathlib import Path
from typing import IO, Iterator, Optional

from torchboost.errors import ConfigError, OutputError, printable
from torchboost.fileio import atomic_write, check_inside, confine_writes, remove_empty_dir, remove_file
from torchboost.recipe.manifest import MANIFEST, read_manifest, still_ours

# Files only `torchboost train` writes at the top of a run folder: a folder holding them (or a manifest)
# holds a run. The per-rank worklogs in log/ are only ever appended to: not evidence of another run.
RUN_FILES = ("config.yaml", "history.jsonl", "history.csv", "history.png")
RUN_DIRS = ("ckpt", "tensorboard", "profile", "mlflow")


def previous_run(out: Path) -> list[str]:
    """The artifacts of an earlier run in `out` (empty when the folder is new or holds only other files)."""
    listed = [rel for rel in read_manifest(out) if (out / rel).exists()]
    return sorted(set(listed[:3] + [name for name in RUN_FILES if (out / name).is_file()]))


def check_output(out: Path, resume: Optional[str], overwrite: bool, prefix: Optional[str] = None) -> None:
    """Refuse a folder that belongs to another run, or whose own files sit where this run would write
    (before anything is written or deleted)."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"output {out} is a file, not a folder", "choose another --output")
    if out.is_symlink() and not out.exists():
        raise ConfigError(f"output {out} is a link to {os.readlink(out)}, which does not exist",
                          "create that folder, remove the link, or choose another --output")
    found = previous_run(out)
    if found and not resume and not overwrite:
        raise ConfigError(f"output folder {out} holds another run ({', '.join(found)})",
                          "continue it with --resume " + str(out) + ", replace it with --overwrite, or choose "
                          "another --output")
    if prefix and not resume:  # a user's file named like one this run writes would be overwritten: refuse
        owned = read_manifest(out) if overwrite else {}
        for p in sorted((out / "ckpt").glob(f"{glob.escape(prefix)}-*.pt")) if (out / "ckpt").is_dir() else []:
            rel = p.relative_to(out).as_posix()
            if rel not in owned:
                raise ConfigError(f"{p} is not this run's but has the name its checkpoints take",
                                  "move it away, set another checkpoint.prefix, or choose another --output")


@contextlib.contextmanager
def claim_output(out: Path, resume: Optional[str], overwrite: bool, prefix: Optional[str] = None) -> Iterator[None]:
    """Hold OUTPUT/.lock for the run; with `overwrite` (and no resume) remove the earlier run's files (those
    its manifest lists and that still have the recorded size and digest; nothing else)."""
    check_output(out, resume, overwrite, prefix)
    created = [p for p in (out, *out.parents) if not p.exists()]  # deepest first
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OutputError(f"cannot create output folder {out}: {e.strerror}", "choose a writable --output") from None
    try:
        with confine_writes(out), _take_lock(out / ".lock") as lock:
            yield from _hold(out, lock, resume, overwrite, prefix)
    except BaseException:
        # A run that failed before writing anything leaves no folder behind (so the corrected command is
        # not refused); a folder that holds anything stays.
        for folder in created:
            with contextlib.suppress(OSError):
                folder.rmdir()
        raise


def _hold(out: Path, lock: IO[str], resume: Optional[str], overwrite: bool, prefix: Optional[str]) -> Iterator[None]:
    """The run, under the taken lock: name ourselves in it, re-check the folder, clear it for --overwrite."""
    lock.seek(0)
    lock.truncate()
    lock.write(f"pid {os.getpid()}\n")  # first, so a run refused meanwhile can name us
    lock.flush()
    try:
        # Again, under the lock: a run that held it while we checked may have finished meanwhile, leaving
        # its files behind — they are another run's now, not ours to overwrite.
        check_output(out, resume, overwrite, prefix)
        for name in (*RUN_DIRS, *RUN_FILES, "log", MANIFEST):  # refused now, not at the first checkpoint
            check_inside(out / name)
        if overwrite and not resume:
            remove_run(out)
        yield
    finally:
        # Removed while still held, so a finished run leaves no .lock behind; a run that opened the
        # old file meanwhile sees it is gone once it gets the lock (see _take_lock) and locks anew.
        with contextlib.suppress(OSError):
            remove_file(out / ".lock")


@contextlib.contextmanager
def _take_lock(path: Path) -> Iterator[IO[str]]:
    """`path` opened and flock'ed, and still the file at `path` (not one a finishing run just unlinked)."""
    for _ in range(100):
        try:
            # no link followed, no FIFO waited on: the lock file is ours to create, truncate and write
            fd = os.open(check_inside(path), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
        except OSError as e:
            what = "a link" if e.errno == errno.ELOOP else e.strerror
            raise OutputError(f"cannot create {printable(path)}: {what}", "remove it, or choose a writable --output") \
                from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise OutputError(f"{printable(path)} is not a regular file", "remove it, or choose another --output")
        os.set_blocking(fd, True)
        with os.fdopen(fd, "a+") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                owner = _lock_owner(lock)
                raise ConfigError(f"output folder {path.parent} is in use by a live run ({owner})",
                                  "wait for it to finish or choose another --output") from None
            try:
                current = os.stat(path).st_ino == os.fstat(lock.fileno()).st_ino
            except FileNotFoundError:
                current = False
            if current:
                yield lock
                return
    raise OutputError(f"could not lock {path}: it is removed and recreated continually",
                      "make sure only torchboost runs write to this --output")


def _lock_owner(lock: IO[str]) -> str:
    """The holder's "pid N" line; it writes it right after taking the lock, so wait a moment for it."""
    for _ in range(50):
        lock.seek(0)
        owner = lock.read().strip()
        if owner:
            return owner
        time.sleep(0.01)
    return "another process"


def remove_run(out: Path) -> list[str]:
    """The earlier run's files, and only those: listed in its manifest with the size and digest it recorded
    (a run from before manifests: its top-level RUN_FILES). A user's own files stay; emptied run folders go."""
    listed = read_manifest(out)
    removed = [rel for rel, entry in listed.items() if still_ours(out, rel, entry)]
    if not (out / MANIFEST).exists():
        removed = [name for name in RUN_FILES if (out / name).is_file()]
    changed = [name for name in RUN_FILES if (out / name).is_file() and name not in removed]
    if changed:  # the new run would write over a file that is not the old run's any more
        raise ConfigError(f"{out / changed[0]} was changed since the run wrote it, so --overwrite will not delete it",
                          "move it away (or choose another --output)")
    for rel in removed:  # all checked before the first is deleted: a refusal leaves the old run whole
        check_inside(out / rel)
    for rel in removed:
        remove_file(out / rel)
    for name in RUN_DIRS:  # only when empty: a user's file keeps its folder
        if (out / name).is_symlink():
            continue
        for sub in sorted((p for p in (out / name).rglob("*") if p.is_dir() and not p.is_symlink()), reverse=True):
            remove_empty_dir(sub)
        remove_empty_dir(out / name)
    remove_file(out / MANIFEST)
    return removed


def write_config(out: Path, text: str) -> None:
    atomic_write(out / "config.yaml", text)
