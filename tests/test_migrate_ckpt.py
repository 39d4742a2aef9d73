"""MindSpore .ckpt reader/writer: a file built here byte by byte from the proto2 schema (independent
encoder below), bit-exact round trips for every dtype, CRC checks, malformed inputs and fuzzing."""

import tracemalloc
import zlib

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bounded import within
from torchboost.errors import CheckpointError
from torchboost.migrate import load_mindspore_ckpt, parse_mindspore_ckpt, read_mindspore_ckpt, save_mindspore_ckpt


# --- a minimal protobuf encoder, written from the wire-format spec, independent of the library ---
def varint(n: int) -> bytes:
    out = b""
    while True:
        byte, n = n & 0x7F, n >> 7
        out += bytes([byte | (0x80 if n else 0)])
        if not n:
            return out


def key(field: int, wire: int) -> bytes:
    return varint(field << 3 | wire)


def ld(field: int, payload: bytes) -> bytes:
    return key(field, 2) + varint(len(payload)) + payload


def tensor_proto(dims, dtype: str, content: bytes, packed=False) -> bytes:
    d = ld(1, b"".join(varint(x) for x in dims)) if packed else b"".join(key(1, 0) + varint(x) for x in dims)
    return d + ld(2, dtype.encode()) + ld(3, content)


def value(tag: str, tp: bytes) -> bytes:
    """One Checkpoint.value entry (= a one-Value Checkpoint message, as MindSpore appends them)."""
    return ld(1, ld(1, tag.encode()) + ld(2, tp))


def with_crc(body: bytes) -> bytes:
    return body + b"crc_num" + zlib.crc32(body).to_bytes(10, "big")


CONV = np.arange(6, dtype="<f4").reshape(2, 3) / 4
FC = (np.arange(20, dtype="<f2") - 7).reshape(4, 5)
BF_VALUES = np.array([1.5, -2.0, 0.25, 3.0], dtype="<f4")  # exactly representable in bfloat16
BF = (BF_VALUES.view("<u4") >> 16).astype("<u2")  # bfloat16 = the top 16 bits of float32


def hand_built_file() -> bytes:
    fc = FC.tobytes()
    body = (value("conv.weight", tensor_proto([2, 3], "Float32", CONV.tobytes()))
            # a split parameter: three consecutive Values with the same tag, full dims on each slice
            + value("fc.weight", tensor_proto([4, 5], "Float16", fc[:16]))
            + value("fc.weight", tensor_proto([4, 5], "Float16", fc[16:32]))
            + value("fc.weight", tensor_proto([4, 5], "Float16", fc[32:]))
            + value("global_step", tensor_proto([0], "Int32", np.array(1234, "<i4").tobytes()))
            + value("flags", tensor_proto([3], "Uint8", bytes([0, 7, 255]), packed=True))  # old spelling
            + value("bf", tensor_proto([2, 2], "BFloat16", BF.tobytes()))
            + value("mask", tensor_proto([2], "Bool", bytes([1, 0])))
            + value("net_name", tensor_proto([0], "str", np.array("resnet50").tobytes()))
            + key(9, 0) + varint(42))  # an unknown top-level field: proto2 readers skip it
    return with_crc(body)


def test_hand_built_file(tmp_path):
    p = tmp_path / "hand.ckpt"
    p.write_bytes(hand_built_file())
    c = read_mindspore_ckpt(p)
    t = c.tensors
    assert list(t) == ["conv.weight", "fc.weight", "global_step", "flags", "bf", "mask"]
    np.testing.assert_array_equal(t["conv.weight"].numpy(), CONV)
    assert t["fc.weight"].dtype == torch.float16 and t["fc.weight"].shape == (4, 5)
    np.testing.assert_array_equal(t["fc.weight"].numpy(), FC)
    assert t["global_step"].shape == () and t["global_step"].dtype == torch.int32 and t["global_step"].item() == 1234
    assert t["flags"].dtype == torch.uint8 and t["flags"].tolist() == [0, 7, 255]
    assert t["bf"].dtype == torch.bfloat16 and t["bf"].float().flatten().tolist() == BF_VALUES.tolist()
    assert t["mask"].tolist() == [True, False]
    assert c.strings == {"net_name": "resnet50"} and c.skipped == []
    assert list(load_mindspore_ckpt(p)) == list(t)


def test_map_tensor_is_skipped_not_fatal():
    data = value("w", tensor_proto([1], "Float32", b"\0\0\x80?")) + ld(1, ld(1, b"emb") + ld(3, b"\x0a\x00"))
    c = parse_mindspore_ckpt(data)
    assert c.tensors["w"].tolist() == [1.0] and c.skipped == ["emb"]


ALL_DTYPES = [torch.float16, torch.float32, torch.float64, torch.bfloat16, torch.int8, torch.int16, torch.int32,
              torch.int64, torch.uint8, torch.uint16, torch.uint32, torch.uint64, torch.bool, torch.complex64]


def sample(dtype, shape, seed):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype.is_floating_point or dtype.is_complex:
        t = (torch.randn(shape, generator=g, dtype=torch.float64) * 1e3).to(dtype)
        if t.numel() >= 4 and dtype.is_floating_point:  # specials must survive bit for bit
            t.view(-1)[:4] = torch.tensor([float("nan"), float("inf"), -0.0, -float("inf")]).to(dtype)
        return t
    info = torch.iinfo(dtype)
    return torch.randint(0, min(info.max, 2**62), shape, generator=g, dtype=torch.int64).to(dtype)


def raw(t):
    return bytes(t.contiguous().reshape(-1).view(torch.uint8).numpy())


@pytest.mark.parametrize("crc", [False, True])
def test_round_trip_every_dtype_bit_exact(tmp_path, crc):
    tensors = {}
    for i, dt in enumerate(ALL_DTYPES):
        name = str(dt).removeprefix("torch.")
        tensors[f"{name}.matrix"] = sample(dt, (3, 5), i)
        tensors[f"{name}.scalar"] = sample(dt, (), 100 + i)
    tensors["transposed"] = torch.arange(12.0).reshape(3, 4).T  # non-contiguous input
    tensors["empty"] = torch.empty(0)
    tensors["empty2d"] = torch.empty(2, 0, dtype=torch.int16)
    p = tmp_path / "all.ckpt"
    save_mindspore_ckpt(p, tensors, crc=crc, strings={"tag": "ünïcode"})
    assert (p.read_bytes()[-17:-10] == b"crc_num") == crc
    c = read_mindspore_ckpt(p)
    assert list(c.tensors) == list(tensors) and c.strings == {"tag": "ünïcode"}
    for k, t in tensors.items():
        got = c.tensors[k]
        assert got.dtype == t.dtype and got.shape == t.shape, k
        assert raw(got) == raw(t), k
    assert not [f for f in tmp_path.iterdir() if f.name != "all.ckpt"]  # no temp file left behind


def test_writer_splits_large_parameters_and_scalar_uses_dims_0(tmp_path):
    w = torch.randn(100)
    p = tmp_path / "split.ckpt"
    save_mindspore_ckpt(p, {"big.weight": w, "s": torch.tensor(2.5)}, slice_bytes=64)
    data = p.read_bytes()
    assert data.count(ld(1, b"big.weight")) == 400 // 64 + 1  # 7 slices of <= 64 bytes
    assert value("s", tensor_proto([0], "Float32", np.float32(2.5).tobytes())) in data
    assert torch.equal(load_mindspore_ckpt(p)["big.weight"], w)


def test_crc_mismatch_detected(tmp_path):
    good = hand_built_file()
    p = tmp_path / "bad.ckpt"
    body_flip = bytearray(good)
    body_flip[40] ^= 0x01
    p.write_bytes(bytes(body_flip))
    with pytest.raises(CheckpointError, match="CRC mismatch"):
        load_mindspore_ckpt(p)
    crc_flip = bytearray(good)
    crc_flip[-1] ^= 0xFF
    with pytest.raises(CheckpointError, match="CRC mismatch"):
        parse_mindspore_ckpt(bytes(crc_flip))


MALFORMED = {
    "empty": b"",
    "wrong wire type": key(1, 0) + varint(5),
    "absurd length": key(1, 2) + varint(2**62) + b"abc",
    "truncated varint": b"\x0a\xff\xff",
    "overlong varint": key(1, 2) + b"\xff" * 11,
    "group wire type": key(1, 3),
    "field number 0": b"\x02\x00",
    "absurd dims": value("w", tensor_proto([2**40, 2**40], "Float32", b"\0" * 4)),
    "negative dim": value("w", tensor_proto([2**64 - 1], "Float32", b"\0" * 4)),
    "overflowing empty dims": value("w", tensor_proto([0, 2**62, 2**62], "Float32", b"")),
    "bad dtype": value("w", tensor_proto([1], "Float128", b"\0" * 16)),
    "size mismatch": value("w", tensor_proto([3], "Float32", b"\0" * 8)),
    "no dtype": value("w", key(1, 0) + varint(1) + ld(3, b"\0" * 4)),
    "no tag": ld(1, ld(2, tensor_proto([1], "Int8", b"\1"))),
    "tag not utf8": ld(1, ld(1, b"\xff\xfe") + ld(2, tensor_proto([1], "Int8", b"\1"))),
    "bad bool": value("m", tensor_proto([2], "Bool", b"\x01\x02")),
    "bad str": value("s", tensor_proto([0], "str", b"abc")),
    "split dtype disagree": value("w", tensor_proto([2], "Int8", b"\1"))
    + value("w", tensor_proto([2], "UInt8", b"\1")),
    "duplicate tag": value("a", tensor_proto([1], "Int8", b"\1")) + value("b", tensor_proto([1], "Int8", b"\1"))
    + value("a", tensor_proto([1], "Int8", b"\1")),
    "value is varint": ld(1, key(2, 0) + varint(3)),
    "garbage": b"PK\x03\x04 this is a zip file, not a checkpoint",
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_inputs_raise_one_line_checkpoint_error(case):
    with pytest.raises(CheckpointError) as e:
        parse_mindspore_ckpt(MALFORMED[case], "x.ckpt")
    assert "\n" not in str(e.value) and str(e.value).startswith("x.ckpt")


def test_absurd_length_allocates_nothing():
    tracemalloc.start()
    with pytest.raises(CheckpointError, match="claims"):
        # well-formed outer lengths; the innermost tensor_content claims 8 GiB that are not there
        parse_mindspore_ckpt(value("w", ld(2, b"Float32") + key(3, 2) + varint(2**33)))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 1_000_000


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(CheckpointError, match="cannot read"):
        load_mindspore_ckpt(tmp_path / "nope.ckpt")
    with pytest.raises(CheckpointError, match="is a folder, not a regular file"):
        load_mindspore_ckpt(tmp_path)


def test_every_truncation_is_an_error_or_a_clean_prefix():
    full = hand_built_file()[:-17]  # without the CRC, so cuts reach the decoder
    whole = parse_mindspore_ckpt(full).tensors
    for cut in range(1, len(full)):
        try:
            part = parse_mindspore_ckpt(full[:cut]).tensors
        except CheckpointError:
            continue
        assert list(part) == list(whole)[:len(part)]  # cut at a Value boundary: earlier values intact
        assert all(raw(part[k]) == raw(whole[k]) for k in part)


def _parse_bounded(data: bytes) -> None:
    try:
        with within(60, f"parse_mindspore_ckpt of {len(data)} bytes"):  # a generous bound against a hang
            out = parse_mindspore_ckpt(data)
        assert all(isinstance(t, torch.Tensor) for t in out.tensors.values())
    except CheckpointError:
        pass


FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(st.binary(max_size=300))
def test_fuzz_random_bytes(data):
    _parse_bounded(data)


@FUZZ
@given(st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=6),
       st.integers(0, 10**6), st.binary(max_size=12))
def test_fuzz_mutated_valid_file(mutations, cut, insert):
    data = bytearray(hand_built_file()[:-17])
    for pos, byte in mutations:
        data[pos % len(data)] = byte
    at = cut % (len(data) + 1)
    _parse_bounded(bytes(data[:at] + insert + data[at:]))
