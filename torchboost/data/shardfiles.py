"""WebDataset-format tar shards: naming them (brace patterns, `pipe:` commands), reading their samples
safely, and the index (`_info.json`) that `export-shards` writes beside them.

A shard is a tar file whose members are grouped into samples by key: `dir/key.jpg` and `dir/key.cls` form one
sample (the key is the name up to the first dot of the last path part; the rest, lower-cased, is the field),
as webdataset and timm read them. Members whose names start with `__` (webdataset's metadata) and members
that are not regular files are skipped; nothing is ever extracted to disk, so member names are never paths.

Reader: the standard library's tarfile rather than the `webdataset` package (1.0.2). webdataset reads every
member whole into memory whatever its header claims (a hostile shard's "10 GB" member is read until the
stream ends), wraps errors in its own handlers, and its split across nodes and workers makes the order
depend on the worker count with no notion of a resume position; what this module needs from it is the few
lines of grouping below. Shard patterns expand with `braceexpand`, the package webdataset itself uses, so a
pattern names the same files in both.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import subprocess
import tarfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from torchboost.data.braces import count_names
from torchboost.data.folder import IMG_EXTENSIONS, FolderSample
from torchboost.data.pipes import PIPE
from torchboost.splits import EVAL_SPLITS, TRAIN
from torchboost.errors import DataError
from torchboost.fileio import open_regular, read_regular

INDEX_NAME = "_info.json"
IMAGE_FIELDS = tuple(e.lstrip(".") for e in IMG_EXTENSIONS)
MAX_MEMBER_BYTES = 64 * 2**20  # one encoded image; ImageNet's largest JPEG is ~15 MB
MAX_CLS_BYTES = 32  # a class index in ASCII
MAX_INDEX_BYTES = 16 * 2**20  # ~200k shard names
MAX_SHARDS = 1_000_000  # a pattern naming more is a typo in a range
MAX_PATTERN = 65_536  # characters in one shard pattern
MAX_NESTING = 32  # brace levels in one shard pattern (braceexpand recurses once per level)
RE_EXPORT = "re-create the shards with torchboost export-shards, or remove this shard from the list"


@dataclass(frozen=True)
class Sample:
    """One sample read from a shard: where it came from, its class index and its encoded image (the bytes,
    or where they lie in a local shard file, read when the sample is decoded)."""

    shard: str  # the shard's name as the user gave it (path or pipe command), for messages
    key: str
    label: int
    field: str  # the image member's extension (jpg, png, ...)
    data: bytes | MemberRef

    def image_bytes(self) -> bytes:
        if isinstance(self.data, bytes):
            return self.data
        data = os.pread(self.data.file.fd, self.data.size, self.data.offset)
        if len(data) != self.data.size:  # the file changed after its header was read
            raise DataError(f"shard {self.shard} sample {self.key}: the image is cut short", RE_EXPORT)
        return data


class OpenFile:
    """A file descriptor closed when the last sample pointing into its file is gone."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __del__(self) -> None:
        os.close(self.fd)


@dataclass(frozen=True)
class MemberRef:
    """Where a member's bytes lie in a local shard file. Loader workers read every sample's headers but
    decode only their share, so a local shard's image bytes are read only by the worker that decodes them."""

    file: OpenFile
    offset: int
    size: int


def expand_shards(pattern: str) -> list[str]:
    """Shard names from a brace pattern (`train-{000000..000127}.tar`, `{a,b}.tar`), in order; a `pipe:`
    command expands the same way (`pipe:curl -s http://host/train-{0000..0009}.tar`). The names are counted
    before they are made: braceexpand builds every range whole (`{0..999999999}` would take minutes and
    gigabytes before a limit applied to its output could say no)."""
    from braceexpand import UnbalancedBracesError, braceexpand  # here: only patterns in the config need it

    if not pattern.strip():
        raise DataError("an empty shard pattern", "give shard files such as train-{000000..000009}.tar")
    if len(pattern) > MAX_PATTERN:
        raise DataError(f"a shard pattern of {len(pattern):,} characters", f"write at most {MAX_PATTERN:,}")
    try:
        count = count_names(pattern, MAX_NESTING, MAX_SHARDS)
        if count > MAX_SHARDS:
            raise DataError(f"shard pattern {pattern[:80]!r} names {count:,} shards (over {MAX_SHARDS:,})",
                            "check the ranges")
        return list(braceexpand(pattern))
    except UnbalancedBracesError:
        raise DataError(f"shard pattern {pattern[:80]!r} has unbalanced braces",
                        "write ranges as {000000..000127} and lists as {a,b}") from None
    except ValueError as e:  # a range bound of thousands of digits (int() refuses it)
        raise DataError(f"shard pattern {pattern[:80]!r} is not readable ({e})", "check the ranges") from None


@contextmanager
def open_shard(name: str) -> Iterator[IO[bytes]]:
    """A shard's byte stream: a local file, or the standard output of a `pipe:` command (run by the shell:
    the command is the user's own, from the config; see docs/THREAT_MODEL.md). A command that fails is one
    DataError naming it, once its output has been read."""
    if not name.startswith(PIPE):
        try:
            with open_regular(name) as f:
                yield f
        except FileNotFoundError:
            raise DataError(f"shard {name} does not exist", "check data.path and the shard names") from None
        except IsADirectoryError:
            raise DataError(f"shard {name} is a folder, not a tar file", "give the .tar files") from None
        return
    command = name[len(PIPE):]
    proc = subprocess.Popen(command, shell=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=1 << 20)

    def failed() -> DataError:
        err = proc.stderr.read(500).decode(errors="replace").strip().splitlines()
        return DataError(f"shard command {command!r} exited with status {proc.returncode}"
                         + (f" ({err[-1]})" if err else ""), "check the command in the shard pattern")

    try:
        try:
            yield proc.stdout
        except DataError:
            # A command that failed explains its unreadable output better than the tar error does.
            with contextlib.suppress(subprocess.TimeoutExpired):
                if proc.wait(timeout=2) != 0:
                    raise failed() from None
            raise
        proc.stdout.close()
        if proc.wait() != 0:
            raise failed()
    finally:
        if proc.poll() is None:  # the reader stopped early (end of an epoch's share): stop the command
            proc.kill()
            proc.wait()
        proc.stderr.close()


def split_name(name: str) -> tuple[str, str]:
    """(key, field) of a member name, webdataset's rule: the key ends at the first dot of the last path part."""
    slash = name.rfind("/") + 1
    dot = name.find(".", slash)
    return (name, "") if dot < 0 else (name[:dot], name[dot + 1:].lower())


def _label(shard: str, key: str, raw: bytes | MemberRef, num_classes: int) -> int:
    if isinstance(raw, MemberRef):
        raw = os.pread(raw.file.fd, raw.size, raw.offset)  # at most MAX_CLS_BYTES
    text = raw.decode("ascii", errors="replace").strip()
    if not (text.isdigit() and text.isascii()):
        raise DataError(f"shard {shard} sample {key}: .cls holds {text[:20]!r}, not a class index", RE_EXPORT)
    label = int(text)
    if label >= num_classes:
        raise DataError(f"shard {shard} sample {key}: class index {label} but the index lists {num_classes} classes",
                        RE_EXPORT)
    return label


def make_sample(shard: str, key: str, fields: dict[str, bytes | MemberRef], num_classes: int, last: bool = False
            ) -> Sample:
    # tarfile ends a stream cut inside a header as if it were complete: the last sample then lacks a field.
    which = f"shard {shard} ends inside sample {key}, which" if last else f"shard {shard} sample {key}"
    images = [f for f in IMAGE_FIELDS if f in fields]
    if not images:
        raise DataError(f"{which} has no image (fields: {', '.join(sorted(fields)) or 'none'})", RE_EXPORT)
    if "cls" not in fields:
        raise DataError(f"{which} has no .cls class index", RE_EXPORT)
    if len(images) > 1:
        raise DataError(f"shard {shard} sample {key} has {len(images)} images ({', '.join(images)})",
                        "keep one image per key")
    return Sample(shard, key, _label(shard, key, fields["cls"], num_classes), images[0], fields[images[0]])


def _member_ref(file: OpenFile, size: int, member: tarfile.TarInfo) -> MemberRef:
    if member.offset_data + member.size > size:  # claims more than the file holds (the cap was checked first)
        raise EOFError(f"member {member.name[:80]} is cut short")
    return MemberRef(file, member.offset_data, member.size)


def _members(stream: IO[bytes]) -> Iterator[tuple[tarfile.TarInfo, Callable[[], bytes | MemberRef]]]:
    """(member, a function giving its data) of a tar stream. A local uncompressed file is read by seeking:
    only headers are read here, data become MemberRefs read later by the worker that decodes them. Anything
    else (a pipe, a compressed shard) is read as a stream, data as bytes."""
    if stream.seekable():
        try:
            tar = tarfile.open(fileobj=stream, mode="r:")
        except tarfile.ReadError:  # compressed (or broken): the stream reader says which
            stream.seek(0)
        else:
            file, size = OpenFile(os.dup(stream.fileno())), os.fstat(stream.fileno()).st_size
            for member in tar:
                yield member, functools.partial(_member_ref, file, size, member)
            return
    with tarfile.open(fileobj=stream, mode="r|*") as tar:
        for member in tar:
            yield member, lambda m=member: tar.extractfile(m).read()


def read_samples(shard: str, stream: IO[bytes], num_classes: int) -> Iterator[Sample]:
    """The samples of one tar stream, in order. Every member is size-checked from its header before its bytes
    are read; a truncated or malformed tar, a missing field or a bad class index is one DataError naming the
    shard (and the sample's key)."""
    key, fields = None, {}
    try:
        for member, data in _members(stream):
            if not member.isfile() or member.name.rsplit("/", 1)[-1].startswith("__"):
                continue
            k, field = split_name(member.name)
            cap = MAX_CLS_BYTES if field == "cls" else MAX_MEMBER_BYTES
            if member.size > cap:
                raise DataError(f"shard {shard} member {member.name[:80]} claims {member.size:,} bytes "
                                f"(limit {cap:,})", RE_EXPORT)
            if k != key:
                if key is not None:
                    yield make_sample(shard, key, fields, num_classes)
                key, fields = k, {}
            if field in fields:
                raise DataError(f"shard {shard} sample {key} has two .{field} members", RE_EXPORT)
            value = data()
            if isinstance(value, bytes) and len(value) != member.size:
                raise EOFError(f"member {member.name[:80]} is cut short")
            fields[field] = value
    except (tarfile.TarError, EOFError, OSError, ValueError) as e:  # ValueError: corrupt compressed stream
        raise DataError(f"shard {shard} is not a readable tar file ({type(e).__name__}: {e})", RE_EXPORT) from None
    if key is not None:
        yield make_sample(shard, key, fields, num_classes, last=True)


@dataclass(frozen=True)
class ShardSplit:
    """One split of an index: shard file names (bare names in the index's folder), their sample counts and
    the split's class names (labels are indices into them)."""

    filenames: list[str]
    lengths: list[int]
    classes: list[str]


@dataclass(frozen=True)
class ShardIndex:
    """What `export-shards` records beside the shards (`_info.json`, with the keys timm's `wds` reader
    reads: `splits.<name>.filenames / shard_lengths / num_samples`): per split, the shards and their sample
    counts (so every rank knows every rank's step count before reading a byte) and the class names; and a
    header sample of the images (channels and native size, as `sample_folder` reports for a folder)."""

    folder: Path
    splits: dict[str, ShardSplit]
    sample: FolderSample


def _bad(path: Path, what: str) -> DataError:
    return DataError(f"shard index {path}: {what}", "re-create it with torchboost export-shards")


def _bare_name(path: Path, name: object) -> str:
    # Names come from a file: never a path or a command (only the user's own config may say pipe:).
    if not isinstance(name, str) or not name or name in (".", "..") or any(c in name for c in "/\\\0") \
            or name.startswith(PIPE):
        raise _bad(path, f"shard name {str(name)[:60]!r} is not a plain file name")
    return name


def _split(path: Path, name: str, raw: object) -> ShardSplit:
    if not isinstance(raw, dict):
        raise _bad(path, f"split {name!r} is not a mapping")
    files, lengths, classes = raw.get("filenames"), raw.get("shard_lengths"), raw.get("classes")
    if not isinstance(files, list) or not isinstance(lengths, list) or len(files) != len(lengths) or not files:
        raise _bad(path, f"split {name!r} needs equally long, non-empty filenames and shard_lengths lists")
    if not all(type(n) is int and n >= 1 for n in lengths):
        raise _bad(path, f"split {name!r}: shard_lengths must be positive integers")
    if raw.get("num_samples", sum(lengths)) != sum(lengths):
        raise _bad(path, f"split {name!r}: num_samples is not the sum of shard_lengths")
    if not isinstance(classes, list) or not classes or not all(isinstance(c, str) for c in classes) \
            or len(set(classes)) != len(classes):
        raise _bad(path, f"split {name!r} needs a list of distinct class names")
    return ShardSplit([_bare_name(path, f) for f in files], lengths, classes)


def read_index(folder: str | Path) -> ShardIndex:
    """The shard index in `folder` (a file anyone may have written: size-capped, every field checked)."""
    folder = Path(folder)
    path = folder / INDEX_NAME
    if not path.is_file():
        what = "does not exist" if not folder.exists() else f"has no {INDEX_NAME}"
        raise DataError(f"shard folder {folder} {what}",
                        "write shards and their index with: torchboost export-shards IMAGE_FOLDER OUT")
    if path.stat().st_size > MAX_INDEX_BYTES:
        raise _bad(path, f"over {MAX_INDEX_BYTES:,} bytes")
    try:
        raw = json.loads(read_regular(path))
    except (ValueError, RecursionError) as e:  # JSON is a tree (no shared references) and the size is capped
        raise _bad(path, f"not JSON ({type(e).__name__})") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("splits"), dict) or not raw["splits"]:
        raise _bad(path, "no splits")
    sample = raw.get("sample")
    if not isinstance(sample, dict) or not all(type(sample.get(k)) is int and sample[k] >= 0
                                               for k in ("gray", "color", "largest_side")):
        raise _bad(path, "sample needs gray, color and largest_side counts")
    splits = {str(name): _split(path, str(name), s) for name, s in raw["splits"].items()}
    return ShardIndex(folder, splits, FolderSample(sample["gray"], sample["color"], sample["largest_side"]))


def index_split(index: ShardIndex, split: str) -> tuple[str, ShardSplit]:
    """(name, split) for "train"; for "val" or "test" that split, else the other one (the evaluation split)."""
    names = (TRAIN,) if split == TRAIN else tuple(dict.fromkeys((split, *EVAL_SPLITS)))
    for name in names:
        if name in index.splits:
            return name, index.splits[name]
    raise DataError(f"the shard index in {index.folder} has no {' or '.join(names)} split "
                    f"(it has: {', '.join(index.splits)})", "export a folder that holds that split")


def index_json(splits: dict[str, ShardSplit], sample: FolderSample) -> str:
    """The text of an index (what `read_index` reads back)."""
    train = splits.get("train") or next(iter(splits.values()))
    return json.dumps({
        "num_classes": len(train.classes),
        "sample": {"gray": sample.gray, "color": sample.color, "largest_side": sample.largest_side},
        "splits": {name: {"name": name, "num_samples": sum(s.lengths), "filenames": s.filenames,
                          "shard_lengths": s.lengths, "classes": s.classes} for name, s in splits.items()},
    }, indent=1) + "\n"

