"""Every file the tool writes, deletes or reads goes through here.

Writes: `atomic_path` (or `atomic_write`, built on it): a temp file `.NAME.PID.tmp` in the same folder,
flushed and fsynced, then `os.replace`d. A failed write raises `OutputError` (disk full, quota, permissions)
and leaves the previous file untouched; the temp files a killed run left behind are removed at the next
start by `remove_stale_temps`.

Confinement: inside a folder the tool owns (a run's output, an export), `confine_writes(folder)` makes every
write, folder creation and deletion below it check that no link on the way leads out of it (`check_inside`):
a run folder whose `ckpt/` is a link to another run's cannot make `--overwrite` delete, or a new run write,
there. The folder itself may be a link (the user named it); what lies inside it is data.

Reads: `open_regular` / `read_regular` / `check_regular` refuse anything but a regular file before reading
(a FIFO blocks the reader forever, a device never ends).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import stat
import time
from collections.abc import Iterator
from typing import BinaryIO, Optional
from contextlib import contextmanager
from pathlib import Path

from torchboost import scratch
from torchboost.errors import DataError, OutputError, TorchboostError, printable

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


# (lexical absolute path, real path) of each folder writes are confined to. A process-wide stack, like
# torch.no_grad's flag: the callbacks, history and checkpoint writers are library code that takes a plain
# folder, and the run that owns the folder sets the policy once instead of threading it through every one.
_CONFINED: list[tuple[Path, Path]] = []


@contextmanager
def confine_writes(root: str | os.PathLike) -> Iterator[None]:
    """While the block runs, writes and deletes below `root` must not pass through a link leading out of it."""
    entry = (Path(os.path.abspath(root)), Path(os.path.realpath(root)))
    _CONFINED.append(entry)
    try:
        yield
    finally:
        _CONFINED.remove(entry)


CACHE_ENV = "TORCHBOOST_CACHE_DIR"  # where libraries' caches go (matplotlib's fonts, the compiler's kernels)


def cache_dir(kind: str) -> Optional[Path]:
    """The folder for a library's cache of `kind`: under TORCHBOOST_CACHE_DIR when the user names one, else
    under `.cache/` of the folder the tool is writing (the innermost `confine_writes` root), else under the
    command's private temporary folder (`scratch`, removed when it ends); None when none of these (the
    library's own default then: library code outside a command). Never $HOME or $TMPDIR unasked."""
    named = os.environ.get(CACHE_ENV)
    if named:
        return Path(named) / kind
    if _CONFINED:
        return _CONFINED[-1][0] / ".cache" / kind
    private = scratch.current()
    return private / kind if private is not None else None


def within(path: str | os.PathLike, folder: str | os.PathLike) -> bool:
    """Whether normalised path `path` is `folder` or lies under it (compared by parts, not by text: /a/bc is
    not under /a/b)."""
    path, folder = Path(path), Path(folder)
    return path == folder or folder in path.parents


def is_inside(path: str | os.PathLike) -> bool:
    """Whether `check_inside` accepts `path`."""
    try:
        check_inside(path)
    except OutputError:
        return False
    return True


def check_inside(path: str | os.PathLike) -> Path:
    """`path`, unless it lies in a confined folder and a link lies on its way below that folder (one leading out,
    or to another file inside: every link on the way resolved, the file's own too; parts that do not exist yet
    appended): then OutputError, before anything is touched."""
    path = Path(path)
    lexical = Path(os.path.abspath(path))
    for root, real in _CONFINED:
        if within(lexical, root) and lexical != root:
            target = Path(os.path.realpath(lexical))
            inner = next((p for p in [*reversed(lexical.parents), lexical]
                          if within(p, root) and p != root and os.path.islink(p)), None)
            if inner is not None and within(target, real):  # a link to elsewhere in the folder: another's file
                raise OutputError(f"{printable(str(inner))} is a link inside the folder {printable(str(root))} (to "
                                  f"{printable(os.path.realpath(inner))})", "remove the link (the tool never writes "
                                  "or deletes through one), or choose another --output")
            if not within(target, real):
                shown = next((p for p in [*reversed(lexical.parents), lexical]
                              if within(p, root) and p != root and os.path.islink(p)), lexical)
                raise OutputError(f"{printable(str(shown))} is a link out of the folder {printable(str(root))} "
                                  f"(to {printable(str(target))})",
                                  "remove the link (the tool never writes or deletes through one), or choose "
                                  "another --output")
    return path


def make_dirs(path: str | os.PathLike) -> Path:
    """mkdir -p, inside the confined folders only."""
    path = check_inside(path)
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise output_error(path, e) from e
    return path


def remove_file(path: str | os.PathLike) -> None:
    """Delete a file (a missing one is fine), inside the confined folders only."""
    check_inside(path)
    Path(path).unlink(missing_ok=True)


def remove_empty_dir(path: str | os.PathLike) -> bool:
    """rmdir when empty (True when removed), inside the confined folders only; a link is never followed."""
    path = Path(path)
    if path.is_symlink() or not path.is_dir():
        return False
    check_inside(path / "x")  # the folder's own real path must be inside
    try:
        path.rmdir()
    except OSError:
        return False
    return True


_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a folder"))


def _not_regular(path: str | os.PathLike, mode: int, error: type[TorchboostError]) -> TorchboostError:
    kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
    return error(f"{printable(str(path))} is {kind}, not a regular file",
                 "replace it with the file it stands for, or remove it")


def regular_fd(path: str | os.PathLike, error: type[TorchboostError] = DataError) -> int:
    """A read-only descriptor of `path`, after checking (on the open descriptor, so nothing can swap the file
    in between) that it is a regular file: a FIFO is opened without blocking and refused, never read."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise _not_regular(path, mode, error)
        os.set_blocking(fd, True)
        return fd
    except BaseException:
        os.close(fd)
        raise


def open_regular(path: str | os.PathLike, error: type[TorchboostError] = DataError) -> BinaryIO:
    """The regular file `path` opened for binary reading (see `regular_fd`), named by its path (messages of
    readers such as Pillow quote the file object's name)."""
    f = os.fdopen(regular_fd(path, error), "rb")
    f.raw.name = os.fspath(path)
    return f


def read_regular(path: str | os.PathLike, error: type[TorchboostError] = DataError) -> bytes:
    """The bytes of a regular file (see `open_regular`)."""
    with open_regular(path, error) as f:
        return f.read()


def check_regular(path: str | os.PathLike, error: type[TorchboostError] = DataError) -> Path:
    """`path`, when it is a regular file (links followed), for readers that open paths themselves
    (torch.load's mmap, safetensors, np.load); a FIFO, device or socket is refused without opening it."""
    mode = os.stat(path).st_mode
    if not stat.S_ISREG(mode):
        raise _not_regular(path, mode, error)
    return Path(path)


def temp_path(path: str | os.PathLike) -> Path:
    """The temp file `atomic_path` writes before renaming it onto `path`."""
    path = Path(path)
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def _check_folder_path(folder: Path, written: str) -> None:
    """The nearest existing path at or above `folder` must be a folder: a file, FIFO or dangling link there
    would make mkdir say "File exists", which names neither the culprit nor the fix."""
    for parent in (folder, *folder.parents):
        if os.path.lexists(parent):
            if not parent.is_dir():
                what = "a link to nothing" if parent.is_symlink() and not parent.exists() else "not a folder"
                raise OutputError(f"cannot write {written}: {printable(str(parent))} is {what}",
                                  "remove or rename what is in the way, or choose another --output")
            return


def check_output_folder(folder: str | os.PathLike) -> None:
    """Refuse, before any work, an output folder that is a file, FIFO or dangling link (or lies under one)."""
    _check_folder_path(Path(folder), f"into {printable(str(folder))}")


def _check_replaceable(path: Path) -> None:
    """A rename replaces only a regular file: over a device node, FIFO or socket it would swap a system object
    for a file (as root, /dev/null), and over a link it would drop the link someone made."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as e:
        raise output_error(path, e) from e
    if not stat.S_ISREG(mode):
        what = "a link" if stat.S_ISLNK(mode) else "not a regular file (a device, FIFO or socket)"
        raise OutputError(f"cannot write {printable(str(path))}: it is {what}, which is never replaced",
                          "remove it yourself, or write to another file name")


@contextmanager
def atomic_path(path: str | os.PathLike, sync: bool = True) -> Iterator[Path]:
    """Yield a temporary path next to `path`; on success fsync it and os.replace it onto `path`.

    The temp file lives in the same folder so os.replace is a same-filesystem rename (atomic on POSIX);
    the folder is fsynced too so the rename itself survives a power cut. On any exception the temp file
    is removed and `path` is left untouched; an OSError (in the body or here) becomes `OutputError`.
    `sync=False`: no fsyncs (still whole or absent under its name), for a writer of many files that syncs once
    at the end (each fsync waits for the disk: ~6 ms, 40 s over mnist5k's 6,000 exported images).
    """
    path = check_inside(path)
    if not path.name or path.is_dir():
        raise OutputError(f"cannot write {printable(str(path))}: it is a folder", "give a file name")
    _check_folder_path(path.parent, printable(str(path)))
    _check_replaceable(path)
    tmp = temp_path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if tmp.is_symlink() or tmp.exists():  # a planted temp name: writing would go through it
            tmp.unlink()
        yield tmp
        if sync:
            with open(tmp, "rb+") as f:  # fsync here so writers that open the file themselves are covered too
                os.fsync(f.fileno())
        os.replace(tmp, path)
        if sync:
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


def atomic_same(source: str | os.PathLike, path: str | os.PathLike) -> Path:
    """Replace `path` atomically with a file of `source`'s bytes: a hard link to it (no second write of a big
    checkpoint; removing `source` later leaves `path` whole), or a copy where the filesystem has no hard links."""
    with atomic_path(path) as tmp:
        try:
            os.link(source, tmp)
        except OSError as e:
            if e.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK, errno.ENOSYS):
                raise
            shutil.copyfile(source, tmp)
    return Path(path)


def atomic_write(path: str | os.PathLike, data: bytes | str) -> Path:
    """Replace `path` with `data` (str is written as UTF-8) atomically; returns the path."""
    raw = data.encode() if isinstance(data, str) else data
    with atomic_path(path) as tmp:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
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
    if not directory.is_dir() or not is_inside(directory / "x"):
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
                remove_file(p)
                removed.append(p)
        except FileNotFoundError:  # its writer renamed or removed it meanwhile
            continue
    return removed
