"""MNIST from the original IDX files (gz or raw) and from PaddlePaddle's `mnist.json.gz`.

Both give a TensorImageDataset normalized with the usual full-MNIST training statistics (0.1307, 0.3081),
so a model trained on one source evaluates the same on the other.
"""

from __future__ import annotations

import math
import struct
import zlib
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import torch

from torchboost.data.tensors import TensorImageDataset
from torchboost.errors import DataError
from torchboost.fileio import read_regular
from torchboost.plaindata import load_json, shown_number

MNIST_MEAN, MNIST_STD = (0.1307,), (0.3081,)
# IDX type codes -> big-endian numpy dtypes (http://yann.lecun.com/exdb/mnist/, "THE IDX FILE FORMAT").
IDX_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
IDX_FILES = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
             "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}
PADDLE_SPLITS = {"train": 0, "valid": 1, "test": 2}  # the file holds [train, valid, eval]


MAX_INFLATED = 1 << 30  # 1 GiB: full MNIST is 55 MB inflated, Paddle's JSON about 400 MB
_IDX_HEADER_MAX = 4 + 4 * 255
MAX_IDX_DIMS = 16  # MNIST's files have 1 or 3; numpy holds at most 32 (64 from numpy 2)


def _read_bytes(path: Path, cap: Callable[[bytes], int] = lambda head: MAX_INFLATED) -> bytes:
    """File contents, gunzipped when the file starts with the gzip magic (whatever its name), inflating at
    most `cap(first bytes)` bytes: a few MB of gzip can inflate to GBs, so the output is bounded, not trusted."""
    try:
        raw = read_regular(path)
        if raw[:2] != b"\x1f\x8b":
            return raw
        inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)  # gzip framing
        head = inflate.decompress(raw, _IDX_HEADER_MAX)
        limit = min(cap(head), MAX_INFLATED)
        rest = inflate.decompress(inflate.unconsumed_tail, max(limit - len(head), 0) + 1)
    except (OSError, EOFError, zlib.error) as e:  # missing, unreadable, or a broken gzip stream
        raise DataError(f"cannot read {path}: {e}", "check the path and re-download the file") from None
    if len(head) + len(rest) > limit or inflate.unconsumed_tail:
        raise DataError(f"{path} inflates past {limit:,} bytes (what its contents can need)",
                        "the file is corrupt or not MNIST data: re-download it")
    if not inflate.eof:
        raise DataError(f"cannot read {path}: the gzip stream is truncated", "re-download the file")
    return head + rest


def _idx_header(head: bytes) -> Optional[tuple[np.dtype, tuple[int, ...]]]:
    """(dtype, dims) of the IDX header `head` starts with; None when it holds no whole header of a known type."""
    if len(head) < 4 or head[2] not in IDX_DTYPES or len(head) < 4 + 4 * head[3]:
        return None
    return np.dtype(IDX_DTYPES[head[2]]), struct.unpack_from(f">{head[3]}I", head, 4)


def _idx_size(head: bytes) -> int:
    """The byte size an IDX header declares (a huge or unreadable header: no more than the header), in Python
    integers: numpy's int64 product wraps (three dims of 2^31 make 2^93, which it calls 0)."""
    header = _idx_header(head)
    if header is None:
        return len(head)
    dtype, dims = header
    return 4 + 4 * len(dims) + math.prod(dims) * dtype.itemsize


def read_idx(path: str | Path) -> np.ndarray:
    """Read an IDX file (raw or gzipped) into a numpy array of its declared type and shape."""
    path = Path(path)
    data = _read_bytes(path, _idx_size)
    bad = "re-download it (a valid IDX file starts with 0x00 0x00 <type> <ndim>)"
    if len(data) < 4 or data[:2] != b"\x00\x00":
        raise DataError(f"{path} is not an IDX file (bad magic {data[:4].hex()})", bad)
    if data[2] not in IDX_DTYPES:
        raise DataError(f"{path} has unknown IDX type code 0x{data[2]:02x}", bad)
    header = _idx_header(data)
    if header is None:
        raise DataError(f"{path} is truncated inside its header", bad)
    dtype, dims = header
    if len(dims) > MAX_IDX_DIMS:
        raise DataError(f"{path} declares {len(dims)} dimensions (at most {MAX_IDX_DIMS})", bad)
    expected = _idx_size(data)
    if len(data) != expected:  # before numpy sees the dims: the size checked in Python integers
        shown = dims if len(dims) <= 4 else (*dims[:4], f"… {len(dims)} dims")
        raise DataError(f"{path} holds {len(data):,} bytes but its header {shown} needs {shown_number(expected)}",
                        "the file is truncated or corrupt: re-download it")
    return np.frombuffer(data, dtype, offset=4 + 4 * len(dims)).reshape(dims).astype(dtype.newbyteorder("="))


def _dataset(images: np.ndarray, labels: np.ndarray, source: str) -> TensorImageDataset:
    if len(images) != len(labels):
        raise DataError(f"{source}: {len(images)} images but {len(labels)} labels", "use matching files")
    if len(labels) and (labels.min() < 0 or labels.max() > 9):
        raise DataError(f"{source}: labels outside 0..9", "use MNIST label files")
    return TensorImageDataset(torch.from_numpy(np.ascontiguousarray(images[:, None])),
                              torch.from_numpy(labels.astype(np.int64)), [str(c) for c in range(10)],
                              MNIST_MEAN, MNIST_STD)


def load_mnist_idx(root: str | Path, split: str) -> TensorImageDataset:
    """MNIST "train" or "test" from `root` holding the standard file names, each raw or with `.gz`."""
    if split not in IDX_FILES:
        raise DataError(f"MNIST IDX has no split {split!r}", "use 'train' or 'test'")
    root = Path(root)
    paths = []
    for name in IDX_FILES[split]:
        found = [p for p in (root / name, root / f"{name}.gz") if p.is_file()]
        if not found:
            raise DataError(f"missing {root / name}[.gz]",
                            "put the four MNIST IDX files (train/t10k images and labels) in that folder")
        paths.append(found[0])
    images, labels = read_idx(paths[0]), read_idx(paths[1])
    if images.ndim != 3 or images.dtype != np.uint8 or labels.ndim != 1:
        raise DataError(f"{paths[0]} / {paths[1]} are not MNIST images (N×H×W uint8) and labels (N)",
                        "use the MNIST IDX files")
    return _dataset(images, labels, str(root))


def _to_uint8(images: np.ndarray, path: Path) -> np.ndarray:
    """Paddle's file stores floats; the tutorial's copy is scaled to [-1, 1], others to [0, 1]. Any negative
    value means [-1, 1] (MNIST background is the minimum, so a [-1, 1] split always has negatives)."""
    lo, hi = float(images.min()), float(images.max())
    if lo >= -1 and hi <= 1:
        return np.round((images + 1) * 127.5 if lo < 0 else images * 255).astype(np.uint8)
    raise DataError(f"{path}: pixel values span {lo}..{hi}, expected [-1, 1] or [0, 1]",
                    "use PaddlePaddle's mnist.json.gz")


def load_paddle_json(path: str | Path, split: str) -> TensorImageDataset:
    """PaddlePaddle's `mnist.json.gz`: JSON [train, valid, eval], each [images (N × 784 floats), labels]."""
    if split not in PADDLE_SPLITS:
        raise DataError(f"mnist.json.gz has no split {split!r}", "use 'train', 'valid' or 'test'")
    path = Path(path)
    try:
        part = load_json(_read_bytes(path))[PADDLE_SPLITS[split]]  # nested too deep: a ValueError too
        images = np.asarray(part[0], dtype=np.float64)
        labels = np.asarray(part[1], dtype=np.float64)
    except (ValueError, TypeError, IndexError, KeyError) as e:
        raise DataError(f"{path} is not PaddlePaddle's MNIST JSON ({type(e).__name__}: {e})",
                        "expected [train, valid, eval], each [images, labels]") from None
    if images.ndim != 2 or images.shape[1] != 784 or labels.ndim != 1 or np.any(labels != np.round(labels)):
        raise DataError(f"{path} split {split}: images {images.shape} / labels {labels.shape}",
                        "expected N × 784 pixel lists and N integer labels")
    return _dataset(_to_uint8(images, path).reshape(-1, 28, 28), labels.astype(np.int64), str(path))
