"""Where each sample starts in its shard (`_offsets_{split}.npy`, written by export-shards), so a loader worker
reads only the samples it decodes.

Without the table every worker of a process walks every tar header of that process's shards to find its own
samples (a CPU cost per image and per worker, small against decoding it but multiplied by the workers). With it, the sample order of
an epoch, a function of the shard lengths only, is computed without reading, and a worker reads each of its
samples from [start, next start) by offset: each tar header (`parse_header`: tarfile's header checks,
without decoding the fields nobody reads) and each member's data with one `pread`, checked as the streaming
reader checks them. The table is an untrusted file like the rest: a plain int64 array (loaded without
pickle), checked for shape, order and bounds, and a start that does not land on a tar header of one sample is
a one-line error naming the shard.
"""

from __future__ import annotations

import os
import tarfile
from pathlib import Path

import numpy as np

from torchboost.data.shardfiles import MAX_CLS_BYTES, MAX_MEMBER_BYTES, Sample, make_sample, split_name
from torchboost.errors import DataError

BLOCK = 512
MAX_SAMPLE_BYTES = MAX_MEMBER_BYTES + MAX_CLS_BYTES + 8 * BLOCK  # an image, its .cls, their headers
FIX = "re-create the shards and their offsets with torchboost export-shards (or delete the offsets file)"


def offsets_path(folder: str | Path, split: str) -> Path:
    return Path(folder) / f"_offsets_{split}.npy"


def write_offsets(f, starts: list[list[int]]) -> None:
    """Write per-shard sample starts (each shard's list ends with the end of its last sample) to file `f`."""
    np.save(f, np.array([o for shard in starts for o in shard], dtype=np.int64), allow_pickle=False)


def read_offsets(path: Path, lengths: list[int]) -> list[np.ndarray] | None:
    """Per shard, its samples' starts and the end of its last sample; None when there is no table."""
    if not path.is_file():
        return None
    try:
        table = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:
        raise DataError(f"shard offsets {path} is not an int64 array ({type(e).__name__})", FIX) from None
    if table.dtype != np.int64 or table.shape != (sum(lengths) + len(lengths),):
        raise DataError(f"shard offsets {path} holds {table.dtype} {table.shape}, not int64 "
                        f"({sum(lengths) + len(lengths)},) for the index's shards", FIX)
    shards = np.split(table, np.cumsum([n + 1 for n in lengths])[:-1])
    for i, starts in enumerate(shards):
        steps = np.diff(starts)
        if starts[0] != 0 or (starts % BLOCK).any() or (steps < 2 * BLOCK).any() or (steps > MAX_SAMPLE_BYTES).any():
            raise DataError(f"shard offsets {path}: shard {i}'s sample starts are not increasing tar blocks", FIX)
    return shards


def _octal(field: bytes) -> int:
    digits = field.split(b"\0", 1)[0].strip()
    if not digits.isdigit():  # signs, "_", base-256 numbers: tarfile writes none of them for these fields
        if digits:
            raise tarfile.HeaderError("invalid header")
        return 0
    try:
        return int(digits, 8)
    except ValueError:  # an 8 or a 9
        raise tarfile.HeaderError("invalid header") from None


def parse_header(block: bytes) -> tuple[str, int, bool]:
    """(name, size, whether it is a regular file) of one tar header block, checked as tarfile checks it (the
    checksum; octal size). By hand because tarfile.TarInfo.frombuf decodes every field of the header, ~25 µs
    a header here: two of them per sample cost more CPU than reading the image itself. A header this does not
    read (base-256 or signed sizes, a bad checksum) raises tarfile.HeaderError."""
    if len(block) != BLOCK:
        raise tarfile.HeaderError("truncated header")
    if block.count(0) == BLOCK:
        raise tarfile.HeaderError("end of file header")
    if _octal(block[148:156]) != 256 + sum(block[:148]) + sum(block[156:]):  # the checksum field counts as spaces
        raise tarfile.HeaderError("bad checksum")
    name = block[:100].split(b"\0", 1)[0].decode(tarfile.ENCODING, "surrogateescape")
    prefix = block[345:500].split(b"\0", 1)[0].decode(tarfile.ENCODING, "surrogateescape")
    kind = block[156:157]
    regular = kind == tarfile.REGTYPE or (kind == tarfile.AREGTYPE and not name.endswith("/"))
    return (f"{prefix}/{name}" if prefix else name), _octal(block[124:136]), regular


def read_sample_at(shard: str, fd: int, start: int, end: int, num_classes: int) -> Sample:
    """The sample whose tar members fill [start, end) of an open shard file. Each header and each member's
    data is read on its own, so the image's bytes are read once, into the object the decoder reads."""
    key, fields, pos = None, {}, start
    while pos < end:
        try:
            name, size, regular = parse_header(os.pread(fd, BLOCK, pos))
        except tarfile.HeaderError as e:
            raise DataError(f"shard {shard}: no tar header at byte {pos:,} ({e})", FIX) from None
        k, field = split_name(name)
        cap = MAX_CLS_BYTES if field == "cls" else MAX_MEMBER_BYTES
        stop = pos + BLOCK + -(-size // BLOCK) * BLOCK
        if not regular or size > cap or (key is not None and k != key) or field in fields or stop > end:
            raise DataError(f"shard {shard}: bytes {start:,}-{end:,} are not one sample's members", FIX)
        key, data = k, os.pread(fd, size, pos + BLOCK)
        if len(data) != size:
            raise DataError(f"shard {shard} ends inside sample {key} (its offsets say the sample is whole)", FIX)
        fields[field] = data
        pos = stop
    return make_sample(shard, key, fields, num_classes)
