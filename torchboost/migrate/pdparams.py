"""Read and write PaddlePaddle `.pdparams` files without PaddlePaddle.

A .pdparams file is a pickle of {structured name: numpy array}: protocol 4 from `paddle.save` (Paddle
2.x/3.x), protocol 2 from Paddle 1.x `fluid.save_dygraph`. Both add a "StructuredToParameterName@@"
table (structured name -> internal parameter name), which weights do not need; Paddle 2.x splits arrays
too big for protocol 2/3 into slices listed under "UnpackBigParamInfor@@", joined again here. Reading
goes through safe_pickle (nothing is imported or called); writing emits the protocol-4 opcodes numpy
itself produces (numpy._core.multiarray._reconstruct, which numpy >= 1.26 and paddle.load read), so
no numpy object is ever built.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from pathlib import Path

import torch

from torchboost.errors import CheckpointError
from torchboost.fileio import atomic_path, read_regular
from torchboost.migrate.entries import check_entry
from torchboost.migrate.safe_pickle import TORCH_TO_NUMPY, safe_unpickle

NAME_TABLE = "StructuredToParameterName@@"
BIG_PARAMS = "UnpackBigParamInfor@@"


def _join_big_params(obj: dict, name: str) -> None:
    """Undo Paddle's slicing of big arrays: {key: {"OriginShape": shape, "slices": [part keys]}}."""
    for key, info in obj.pop(BIG_PARAMS).items():
        try:
            parts = [obj.pop(part) for part in info["slices"]]
            obj[key] = torch.cat([p.reshape(-1) for p in parts]).reshape(tuple(info["OriginShape"]))
        except (KeyError, TypeError, RuntimeError, ValueError):
            raise CheckpointError(f"{name}: the slices of big parameter {key!r} are missing or do not fit",
                                  "re-save the weights with paddle.save") from None


def parse_pdparams(data: bytes | bytearray | memoryview, name: str = "<bytes>") -> dict[str, torch.Tensor]:
    """Decode the bytes of a .pdparams file into {structured name: tensor}."""
    obj = safe_unpickle(data, name)
    if not isinstance(obj, dict):
        raise CheckpointError(f"{name} holds a {type(obj).__name__}, not a dict of weights",
                              "save model.state_dict() with paddle.save")
    obj = dict(obj)
    obj.pop(NAME_TABLE, None)
    if BIG_PARAMS in obj:
        _join_big_params(obj, name)
    bad = next((k for k, v in obj.items() if not isinstance(k, str) or not isinstance(v, torch.Tensor)), None)
    if bad is not None:
        raise CheckpointError(f"{name}: entry {bad!r} is not a named array (nested state such as an optimizer's?)",
                              "pass the model's .pdparams; .pdopt optimizer state is not converted")
    if not obj:
        raise CheckpointError(f"{name} holds no weights", "save model.state_dict() with paddle.save")
    return obj


def load_pdparams(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Read a PaddlePaddle .pdparams file (Paddle 1.x-3.x) into {structured name: tensor}."""
    try:
        data = read_regular(path, CheckpointError)
    except OSError as e:
        raise CheckpointError(f"cannot read {path}: {e.strerror or e}", "check the path") from None
    return parse_pdparams(data, str(path))


# --- writer: the protocol-4 opcodes of pickle.dumps({name: ndarray}, protocol=4) ---
def _text(s: str) -> bytes:
    b = s.encode("utf-8")
    return (b"\x8c" + bytes([len(b)]) if len(b) < 256 else b"X" + struct.pack("<I", len(b))) + b


def _int(n: int) -> bytes:
    return b"J" + struct.pack("<i", n) if -(1 << 31) <= n < 1 << 31 else \
        b"\x8a" + bytes([9]) + n.to_bytes(9, "little", signed=True)


def _global(module: str, name: str) -> bytes:
    return _text(module) + _text(name) + b"\x93"


def _array(t: torch.Tensor) -> Iterator[bytes | memoryview]:
    code = TORCH_TO_NUMPY[t.dtype]
    raw = memoryview(t.reshape(-1).view(torch.uint8).numpy()).cast("B")
    order = "|" if t.element_size() == 1 else "<"
    dtype = (_global("numpy", "dtype") + _text(code) + b"\x89\x88\x87R"
             + b"(" + _int(3) + _text(order) + b"NNN" + _int(-1) + _int(-1) + _int(0) + b"tb")
    yield (_global("numpy._core.multiarray", "_reconstruct") + _global("numpy", "ndarray")
           + _int(0) + b"\x85" + b"C\x01b" + b"\x87R"
           + b"(" + _int(1) + b"(" + b"".join(_int(d) for d in t.shape) + b"t" + dtype + b"\x89"
           + (b"B" + struct.pack("<I", len(raw)) if len(raw) < 1 << 32 else b"\x8e" + struct.pack("<Q", len(raw))))
    yield raw
    yield b"tb"


def save_pdparams(path: str | os.PathLike, state: dict[str, torch.Tensor]) -> None:
    """Write {structured name: tensor} as a .pdparams file that `paddle.load` reads, atomically."""
    tensors = {}
    for name, t in state.items():
        check_entry(name, t, TORCH_TO_NUMPY, "a numpy-based .pdparams", "convert it to float32/float16/int/bool first")
        tensors[name] = t.detach().cpu().contiguous()
    if not tensors:
        raise CheckpointError(f"nothing to save to {path}", "pass at least one tensor")
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        f.write(b"\x80\x04}(")  # protocol 4, the dict, a MARK for one SETITEMS at the end
        for name, t in tensors.items():
            f.write(_text(name))
            for piece in _array(t):
                f.write(piece)
        f.write(b"u.")
