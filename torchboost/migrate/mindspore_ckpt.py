"""Read and write MindSpore `.ckpt` files without MindSpore (protobuf schema below).

    message Checkpoint  { repeated Value value = 1; }
    message Value       { required string tag = 1;
                          oneof value { TensorProto tensor = 2; MapTensorProto maptensor = 3; } }
    message TensorProto { repeated int64 dims = 1; required string tensor_type = 2;
                          required bytes tensor_content = 3; }

Why a hand-written proto2 decoder rather than the `protobuf` package: the schema is three tiny messages,
and the file comes from outside, so the reader must bound every length by the bytes that remain BEFORE
allocating, reject absurd dims, and check that content size == prod(dims) * itemsize. With `protobuf` we
would need generated code (no protoc here) or runtime descriptors, and would still do all those checks
after the library has parsed (and copied) the whole message; the python-protobuf backends also differ in
limits (e.g. 2 GB messages). The decoder (here and protowire.py) is ~130 lines, copies each tensor's bytes
once, and turns every malformation into one CheckpointError line.

Rules (matching MindSpore's own loader):
- consecutive Values with the same tag are slices of one parameter: their contents are concatenated;
- dims [0] with exactly one element's worth of bytes is a scalar (dims [0] with no bytes: shape (0,));
- tensor_type "str" holds numpy 'U' bytes (UTF-32-LE, NUL-padded): returned in `strings`, never as tensors;
- map tensors (MindSpore MapParameter, hash-table embeddings) have no dense form: their names are listed in
  `skipped`;
- a trailing b"crc_num" + 10-byte big-endian zlib.crc32 of all preceding bytes is verified when present.
Content is little-endian, like every platform PyTorch runs on, so bytes are used as they are.
"""

from __future__ import annotations

import math
import os
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import torch

from torchboost.errors import CheckpointError
from torchboost.fileio import atomic_path, read_regular
from torchboost.migrate.entries import check_entry
from torchboost.migrate.protowire import (Malformed, expect_len, iter_fields, len_prefix, read_varint,
                                          varint_bytes)

CRC_MAGIC = b"crc_num"
SLICE_BYTES = 512 * 1024 * 1024  # MindSpore writes parameters bigger than this as several Values
MAX_DIMS = 64

DTYPES: dict[str, torch.dtype] = {
    "Float16": torch.float16, "Float32": torch.float32, "Float64": torch.float64, "BFloat16": torch.bfloat16,
    "Int8": torch.int8, "Int16": torch.int16, "Int32": torch.int32, "Int64": torch.int64,
    "UInt8": torch.uint8, "UInt16": torch.uint16, "UInt32": torch.uint32, "UInt64": torch.uint64,
    "Bool": torch.bool, "Complex64": torch.complex64, "Complex128": torch.complex128,
}
DTYPE_NAMES = {dt: name for name, dt in DTYPES.items()}  # writer: current spellings only
DTYPES.update({f"Uint{b}": DTYPES[f"UInt{b}"] for b in (8, 16, 32, 64)})  # older MindSpore spelling


@dataclass
class CkptContents:
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    strings: dict[str, str] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)


def _text(buf: memoryview, span: tuple[int, int], what: str) -> str:
    try:
        return bytes(buf[span[0]:span[1]]).decode("utf-8")
    except UnicodeDecodeError:
        raise Malformed(f"{what} at byte {span[0]} is not UTF-8") from None


def _parse_tensor(buf: memoryview, start: int, end: int):
    dims: list[int] = []
    dtype = content = None
    for number, wire, value, at in iter_fields(buf, start, end, "TensorProto"):
        if number == 1:
            if wire == 0:
                dims.append(value)
            elif wire == 2:  # packed encoding, which proto2 parsers must accept too
                pos = value[0]
                while pos < value[1]:
                    d, pos = read_varint(buf, pos, value[1])
                    dims.append(d)
            else:
                raise Malformed(f"dims has wire type {wire} at byte {at}")
            if len(dims) > MAX_DIMS or any(d >= 1 << 63 for d in dims):
                raise Malformed(f"absurd dims {dims[:8]} at byte {at}")
        elif number == 2:
            expect_len(wire, "tensor_type", at)
            dtype = _text(buf, value, "tensor_type")
        elif number == 3:
            expect_len(wire, "tensor_content", at)
            content = value
    if dtype is None or content is None:
        raise Malformed(f"TensorProto at byte {start} lacks the required tensor_type/tensor_content")
    return dtype, dims, content


def _parse_value(buf: memoryview, start: int, end: int):
    tag = tensor = None
    for number, wire, value, at in iter_fields(buf, start, end, "Value"):
        if number in (1, 2, 3):
            expect_len(wire, ("tag", "tensor", "maptensor")[number - 1], at)
        if number == 1:
            tag = _text(buf, value, "tag")
        elif number == 2:
            tensor = _parse_tensor(buf, *value)
        elif number == 3:
            tensor = None  # oneof: the last member present wins; a map tensor is only named, not decoded
    if tag is None:
        raise Malformed(f"Value at byte {start} has no tag")
    return tag, tensor


def _assemble(tag: str, dtype_name: str, dims: list[int], spans: list[tuple[int, int]], buf: memoryview, out):
    nbytes = sum(b - a for a, b in spans)
    if dtype_name == "str":
        raw = b"".join(buf[a:b] for a, b in spans)
        try:
            out.strings[tag] = raw.decode("utf-32-le").rstrip("\x00")
        except UnicodeDecodeError:
            raise Malformed(f"string value {tag!r} is not numpy 'U' (UTF-32-LE) text") from None
        return
    dtype = DTYPES.get(dtype_name)
    if dtype is None:
        raise Malformed(f"tensor {tag!r} has unknown tensor_type {dtype_name!r}")
    shape = () if not dims or (dims == [0] and nbytes == dtype.itemsize) else tuple(dims)
    if math.prod(shape) * dtype.itemsize != nbytes:
        raise Malformed(f"tensor {tag!r}: dims {list(dims)} x {dtype_name} need "
                         f"{math.prod(shape) * dtype.itemsize} bytes, content has {nbytes}")
    if nbytes == 0:
        try:
            out.tensors[tag] = torch.empty(shape, dtype=dtype)
        except RuntimeError:  # e.g. dims (0, 2**62, 2**62): torch's stride computation overflows
            raise Malformed(f"tensor {tag!r} has absurd dims {list(dims)}") from None
        return
    data = bytearray(nbytes)  # the only copy: the tensor owns it through torch.frombuffer
    offset = 0
    for a, b in spans:
        data[offset:offset + b - a] = buf[a:b]
        offset += b - a
    if dtype == torch.bool and max(data) > 1:
        raise Malformed(f"Bool tensor {tag!r} holds bytes other than 0 and 1")
    out.tensors[tag] = torch.frombuffer(data, dtype=dtype).reshape(shape)


def parse_mindspore_ckpt(data: bytes | bytearray | memoryview, name: str = "<bytes>") -> CkptContents:
    """Decode the bytes of a .ckpt file. Any malformation raises CheckpointError naming `name`."""
    buf = memoryview(data).cast("B")
    fix = "the file is truncated, corrupt, encrypted or not a MindSpore .ckpt; re-export it"
    if len(buf) >= 17 and bytes(buf[-17:-10]) == CRC_MAGIC:
        stored, buf = int.from_bytes(buf[-10:], "big"), buf[:-17]
        if zlib.crc32(buf) != stored:
            raise CheckpointError(f"{name}: CRC mismatch (stored {stored:#x}, computed {zlib.crc32(buf):#x})", fix)
    if len(buf) == 0:
        raise CheckpointError(f"{name}: empty MindSpore checkpoint", fix)
    out = CkptContents()
    pending: tuple | None = None  # (tag, dtype, dims, spans) of the parameter being assembled
    try:
        for number, wire, value, at in iter_fields(buf, 0, len(buf), "Checkpoint"):
            if number != 1:
                continue  # unknown field: proto2 readers skip it
            expect_len(wire, "Checkpoint.value", at)
            tag, tensor = _parse_value(buf, *value)
            if pending and pending[0] == tag and tensor is not None:
                if tensor[:2] != pending[1:3]:
                    raise Malformed(f"slices of {tag!r} disagree on dtype/dims")
                pending[3].append(tensor[2])
                continue
            if pending:
                _assemble(*pending, buf, out)
                pending = None
            if tag in out.tensors or tag in out.strings or tag in out.skipped:
                raise Malformed(f"tensor {tag!r} appears twice, not as consecutive slices")
            if tensor is None:
                out.skipped.append(tag)
            else:
                pending = (tag, tensor[0], tensor[1], [tensor[2]])
        if pending:
            _assemble(*pending, buf, out)
    except Malformed as e:
        raise CheckpointError(f"{name}: malformed MindSpore checkpoint: {e}", fix) from None
    return out


def read_mindspore_ckpt(path: str | os.PathLike) -> CkptContents:
    """Read a .ckpt file: tensors, string values and the names of skipped map tensors."""
    try:
        data = read_regular(path, CheckpointError)
    except OSError as e:
        raise CheckpointError(f"cannot read {path}: {e.strerror or e}", "check the path") from None
    return parse_mindspore_ckpt(data, str(path))


def load_mindspore_ckpt(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Read a MindSpore .ckpt into {name: tensor}; string values and map tensors are left out."""
    return read_mindspore_ckpt(path).tensors


def _value_pieces(tag: str, dtype_name: str, dims: list[int], content: memoryview, slice_bytes: int, itemsize: int):
    """Yield (header, content) per Value: each slice repeats the full dims and dtype, as MindSpore writes."""
    tag_b, dtype_b = tag.encode(), dtype_name.encode()
    step = max(itemsize, slice_bytes // itemsize * itemsize)
    for start in range(0, max(len(content), 1), step):
        piece = content[start:start + step]
        tensor_head = b"".join(varint_bytes(1 << 3) + varint_bytes(d) for d in dims)
        tensor_head += len_prefix(2, len(dtype_b)) + dtype_b + len_prefix(3, len(piece))
        tensor_len = len(tensor_head) + len(piece)
        value_head = len_prefix(1, len(tag_b)) + tag_b + len_prefix(2, tensor_len)
        yield len_prefix(1, len(value_head) + tensor_len) + value_head + tensor_head, piece


def save_mindspore_ckpt(path: str | os.PathLike, tensors: dict[str, torch.Tensor], crc: bool = False,
                        strings: dict[str, str] | None = None, slice_bytes: int = SLICE_BYTES) -> None:
    """Write tensors (and optional string values) as a MindSpore .ckpt, atomically.

    Scalars are written with dims [0]; parameters over `slice_bytes` are split into consecutive Values;
    `crc=True` appends MindSpore's b"crc_num" trailer.
    """
    items = []
    for tag, t in tensors.items():
        check_entry(tag, t, DTYPE_NAMES, "MindSpore checkpoints", "convert it to float32/float16/bfloat16/int/bool first")
        t = t.detach().cpu().contiguous()
        raw = memoryview(t.reshape(-1).view(torch.uint8).numpy()).cast("B")
        items.append((tag, DTYPE_NAMES[t.dtype], list(t.shape) or [0], raw, t.dtype.itemsize))
    for tag, text in (strings or {}).items():
        items.append((tag, "str", [0], memoryview(text.encode("utf-32-le")), 4))
    if not items:
        raise CheckpointError(f"nothing to save to {path}", "pass at least one tensor")
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        crc_value = 0
        for item in items:
            for header, piece in _value_pieces(*item[:4], slice_bytes, item[4]):
                f.write(header)
                f.write(piece)
                crc_value = zlib.crc32(piece, zlib.crc32(header, crc_value))
        if crc:
            f.write(CRC_MAGIC + crc_value.to_bytes(10, "big"))
