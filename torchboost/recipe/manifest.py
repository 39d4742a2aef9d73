"""The run manifest: OUTPUT/.torchboost-run.json lists every file this run wrote, with its size and sha256.

It is what "a run owns exactly its files" rests on: `--overwrite` deletes only listed files whose size and
digest still match (a file the user replaced or added is not the run's any more), and an output folder
holds "another run" only when it has a manifest (or the files only torchboost writes: config.yaml,
history.jsonl). Files that were in the folder before the run started are never listed.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Optional

from torchboost.fileio import atomic_write, read_regular
from torchboost.plaindata import check_plain
from torchboost.train.state import Callback, TrainState

MANIFEST = ".torchboost-run.json"
_SKIP = {MANIFEST, ".lock"}  # the lock and the per-rank worklogs (log/) are not run artifacts
_SKIP_DIRS = ("log",)


def _files(out: Path) -> list[str]:
    if not out.is_dir():
        return []
    found = []
    for p in out.rglob("*"):
        rel = p.relative_to(out)
        if p.is_file() and not p.is_symlink() and rel.as_posix() not in _SKIP and rel.parts[0] not in _SKIP_DIRS \
                and not (p.name.startswith(".") and p.name.endswith(".tmp")):
            found.append(rel.as_posix())
    return sorted(found)


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def read_manifest(out: Path) -> dict[str, dict]:
    """{relative path: {"size", "sha256", "mtime"}}; an unreadable or malformed manifest lists nothing."""
    try:
        data = json.loads(read_regular(out / MANIFEST))  # a FIFO in its place must not block the run
        check_plain(data, str(out / MANIFEST))
    except (OSError, ValueError, Exception):  # noqa: BLE001 - any damage means "owns nothing": safe side
        return {}
    if not isinstance(data, dict) or not isinstance(data.get("files"), dict):
        return {}
    return {k: v for k, v in data["files"].items()
            if isinstance(k, str) and ".." not in Path(k).parts and not Path(k).is_absolute() and isinstance(v, dict)}


def still_ours(out: Path, rel: str, entry: dict) -> bool:
    """The listed file exists with the size and digest the run recorded (not replaced by the user since)."""
    path = out / rel
    try:
        return path.is_file() and not path.is_symlink() and path.stat().st_size == entry.get("size") \
            and _digest(path) == entry.get("sha256")
    except OSError:
        return False


class ManifestCallback(Callback):
    """Records the files that appeared in the output folder since the run started (and the files of the run
    it resumes), at the start, after each epoch and at the end."""

    def __init__(self, out: Path, before: set[str], previous: Optional[dict] = None) -> None:
        self.out, self.before, self.entries = out, set(before) - set(previous or {}), dict(previous or {})

    def record(self) -> None:
        entries, digests = {}, {}  # digests: by inode, so a hard-linked best checkpoint is read once
        for rel in _files(self.out):
            if rel in self.before:
                continue
            path = self.out / rel
            stat = path.stat()
            old = self.entries.get(rel)
            if old and old.get("size") == stat.st_size and old.get("mtime") == stat.st_mtime_ns:
                entries[rel] = old  # unchanged since last recorded: no re-hash of big checkpoints
            else:
                key = (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)
                digests[key] = digests.get(key) or _digest(path)
                entries[rel] = {"size": stat.st_size, "sha256": digests[key], "mtime": stat.st_mtime_ns}
        self.entries = entries
        atomic_write(self.out / MANIFEST, json.dumps({"files": entries}, indent=1))

    def on_train_begin(self, state: TrainState) -> None:
        self.record()

    def on_train_epoch_end(self, state: TrainState) -> None:
        self.record()

    def on_train_end(self, state: TrainState) -> None:
        self.record()


def snapshot(out: Path) -> set[str]:
    """The files in `out` before a run starts: never the run's."""
    return set(_files(out))
