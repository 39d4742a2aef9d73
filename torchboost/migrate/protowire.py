"""The few pieces of the protobuf wire format a proto2 reader/writer needs, with hard bounds.

Every length is checked against the bytes that remain before anything is sliced, so a hostile file can
make the reader fail but never allocate more than the file's own size.
"""

from __future__ import annotations


class Malformed(Exception):
    """A decoding failure at a byte offset; callers turn it into CheckpointError naming the file."""


def read_varint(buf: memoryview, pos: int, end: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= end:
            raise Malformed(f"truncated varint at byte {pos}")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            break
        shift += 7
        if shift >= 70:
            raise Malformed(f"varint longer than 10 bytes at byte {pos}")
    if value >= 1 << 64:
        raise Malformed(f"varint over 64 bits at byte {pos}")
    return value, pos


def iter_fields(buf: memoryview, pos: int, end: int, where: str):
    """Yield (field number, wire type, value, offset); value is an int (varint) or a (start, stop) span."""
    while pos < end:
        at = pos
        key, pos = read_varint(buf, pos, end)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise Malformed(f"field number 0 in {where} at byte {at}")
        if wire == 0:
            value, pos = read_varint(buf, pos, end)
        elif wire in (1, 2, 5):
            if wire == 2:
                size, pos = read_varint(buf, pos, end)
            else:
                size = 8 if wire == 1 else 4
            if size > end - pos:  # checked before anything is sliced or allocated
                raise Malformed(f"{where} field {number} at byte {at} claims {size} bytes, {end - pos} remain")
            value, pos = (pos, pos + size), pos + size
        else:  # 3/4 are proto2 groups (absent from this schema), 6/7 do not exist
            raise Malformed(f"bad wire type {wire} in {where} at byte {at}")
        yield number, wire, value, at


def expect_len(wire: int, what: str, at: int) -> None:
    if wire != 2:
        raise Malformed(f"{what} has wire type {wire}, expected 2 (length-delimited) at byte {at}")


def varint_bytes(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def len_prefix(number: int, size: int) -> bytes:
    return varint_bytes(number << 3 | 2) + varint_bytes(size)
