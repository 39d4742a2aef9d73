"""MNIST readers: IDX files (raw and gzipped) and PaddlePaddle's mnist.json.gz, on generated files."""

import gzip
import json
import struct

import numpy as np
import pytest

from torchboost.data.mnist import load_mnist_idx, load_paddle_json, read_idx
from torchboost.errors import DataError


def idx_bytes(arr: np.ndarray, code: int) -> bytes:
    """IDX by the spec, written independently of the reader: magic, big-endian dims, big-endian data."""
    be = arr.astype(arr.dtype.newbyteorder(">"))
    return bytes([0, 0, code, arr.ndim]) + struct.pack(f">{arr.ndim}I", *arr.shape) + be.tobytes()


def write_mnist(root, n=12, gz=True, seed=0):
    rng = np.random.default_rng(seed)
    data = {}
    for split, prefix in (("train", "train"), ("test", "t10k")):
        images = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        labels = rng.integers(0, 10, n, dtype=np.uint8)
        for name, arr, code in ((f"{prefix}-images-idx3-ubyte", images, 8), (f"{prefix}-labels-idx1-ubyte", labels, 8)):
            raw = idx_bytes(arr, code)
            (root / (name + ".gz" if gz else name)).write_bytes(gzip.compress(raw) if gz else raw)
        data[split] = images, labels
    return data


@pytest.mark.parametrize("dtype,code", [(np.uint8, 0x08), (np.int8, 0x09), (np.int16, 0x0B), (np.int32, 0x0C),
                                        (np.float32, 0x0D), (np.float64, 0x0E)])
@pytest.mark.parametrize("gz", [False, True])
def test_read_idx_round_trips_every_type(tmp_path, dtype, code, gz):
    arr = (np.arange(24).reshape(2, 3, 4) * 3 - 20).astype(dtype)
    raw = idx_bytes(arr, code)
    path = tmp_path / "a.idx"
    path.write_bytes(gzip.compress(raw) if gz else raw)
    out = read_idx(path)
    assert out.shape == (2, 3, 4) and out.dtype == np.dtype(dtype) and np.array_equal(out, arr)


@pytest.mark.parametrize("mutate,match", [
    (lambda b: b"\x01" + b[1:], "bad magic"),
    (lambda b: b[:2] + b"\x07" + b[3:], "type code 0x07"),
    (lambda b: b[:-1], "header .* needs"),
    (lambda b: b + b"\x00", "header .* needs"),
    (lambda b: b[:6], "truncated inside its header"),
    (lambda b: gzip.compress(b)[:-9], "cannot read"),
])
def test_read_idx_rejects_bad_files(tmp_path, mutate, match):
    path = tmp_path / "bad"
    path.write_bytes(mutate(idx_bytes(np.zeros((3, 4), np.uint8), 8)))
    with pytest.raises(DataError, match=match):
        read_idx(path)


@pytest.mark.parametrize("gz", [False, True])
def test_load_mnist_idx_matches_written_arrays(tmp_path, gz):
    written = write_mnist(tmp_path, gz=gz)
    for split in ("train", "test"):
        ds = load_mnist_idx(tmp_path, split)
        images, labels = written[split]
        assert ds.images.shape == (12, 1, 28, 28) and np.array_equal(ds.images[:, 0].numpy(), images)
        assert np.array_equal(ds.labels.numpy(), labels) and ds.classes == [str(c) for c in range(10)]
        x, y = ds[3]
        np.testing.assert_allclose(x[0].numpy(), (images[3] / 255 - 0.1307) / 0.3081, atol=1e-5)


def test_load_mnist_idx_errors(tmp_path):
    with pytest.raises(DataError, match="missing .*train-images-idx3-ubyte"):
        load_mnist_idx(tmp_path, "train")
    write_mnist(tmp_path)
    (tmp_path / "t10k-labels-idx1-ubyte.gz").write_bytes(gzip.compress(idx_bytes(np.zeros(5, np.uint8), 8)))
    with pytest.raises(DataError, match="12 images but 5 labels"):
        load_mnist_idx(tmp_path, "test")
    with pytest.raises(DataError, match="no split 'valid'"):
        load_mnist_idx(tmp_path, "valid")


def write_paddle(path, scale: str, seed=0):
    rng = np.random.default_rng(seed)
    splits, pixels = [], []
    for n in (6, 3, 4):
        u8 = rng.integers(0, 256, (n, 784)).astype(np.uint8)
        u8[:, 0] = 0  # MNIST always has background pixels
        values = u8 / 127.5 - 1 if scale == "-1..1" else u8 / 255
        labels = rng.integers(0, 10, n)
        splits.append([values.tolist(), labels.tolist()])
        pixels.append((u8, labels))
    path.write_bytes(gzip.compress(json.dumps(splits).encode()))
    return pixels


@pytest.mark.parametrize("scale", ["-1..1", "0..1"])
def test_load_paddle_json_detects_scale_and_splits(tmp_path, scale):
    path = tmp_path / "mnist.json.gz"
    pixels = write_paddle(path, scale)
    for k, split in enumerate(("train", "valid", "test")):
        ds = load_paddle_json(path, split)
        u8, labels = pixels[k]
        assert np.array_equal(ds.images.reshape(len(u8), 784).numpy(), u8)  # exact back to 0..255
        assert np.array_equal(ds.labels.numpy(), labels)


@pytest.mark.parametrize("content,match", [
    (b"not json", "not PaddlePaddle's MNIST JSON"),
    (b"[" * 100_000 + b"]" * 100_000, "not PaddlePaddle's MNIST JSON"),  # past the parser's stack
    (json.dumps([[[[0.0] * 784], [1]]]).encode(), "not PaddlePaddle's MNIST JSON"),  # only one split
    (json.dumps([[[[0.0] * 10], [1]]] * 3).encode(), r"images \(1, 10\)"),
    (json.dumps([[[[0.0] * 784], [1.5]]] * 3).encode(), "integer labels"),
    (json.dumps([[[[3.0] * 784], [1]]] * 3).encode(), r"span 3.0..3.0"),
    (json.dumps([[[[0.0] * 784], [11]]] * 3).encode(), "labels outside 0..9"),
])
def test_load_paddle_json_rejects_bad_files(tmp_path, content, match):
    path = tmp_path / "m.json.gz"
    path.write_bytes(gzip.compress(content))
    with pytest.raises(DataError, match=match):
        load_paddle_json(path, "test")


def test_missing_paddle_file(tmp_path):
    with pytest.raises(DataError, match="cannot read"):
        load_paddle_json(tmp_path / "nope.json.gz", "train")
