"""A restricted reader for pickled weight files (PaddlePaddle .pdparams) that executes nothing.

It is a small pickle machine of its own rather than a `pickle.Unpickler` subclass: a global is never
imported, only looked up in ALLOWED, which maps the names numpy writes (numpy 1.x `numpy.core...`, 2.x
`numpy._core...`) to local builders that turn the array state straight into torch tensors. Any other
global is refused by name before anything is built. The C unpickler also allocates a BINBYTES8 length
before checking it against the input; here every length is checked against the bytes that remain before
anything is sliced, payloads are views of the file, and the bytes copied into tensors (or decoded from
protocol-2 latin-1 strings) are counted against twice the file's size (a protocol-2 array is decoded once
from its text, then copied into its tensor), so memo references cannot multiply a small file.

It runs over 400 lines because the opcode table and its handlers are one unit: splitting them would
scatter the one allow-list an auditor has to read.

Accepted: protocols 2-4 (and the protocol 0/1 opcodes numpy state uses), dict/list/tuple/OrderedDict,
str/bytes/int/float/bool/None, numpy arrays and scalars of numeric dtypes.
"""

from __future__ import annotations

import math
import struct
from collections import OrderedDict
from typing import Any, Callable

import torch

from torchboost.errors import CheckpointError

MAX_LINE = 256  # GLOBAL/GET/PUT text arguments are short names and numbers

NUMPY_TO_TORCH: dict[str, torch.dtype] = {
    "f2": torch.float16, "f4": torch.float32, "f8": torch.float64, "c8": torch.complex64,
    "c16": torch.complex128, "i1": torch.int8, "i2": torch.int16, "i4": torch.int32, "i8": torch.int64,
    "u1": torch.uint8, "u2": torch.uint16, "u4": torch.uint32, "u8": torch.uint64, "b1": torch.bool,
}
TORCH_TO_NUMPY = {dt: code for code, dt in NUMPY_TO_TORCH.items()}


class Refused(Exception):
    """Malformed or disallowed content; the caller names the file."""


class _Ndarray:
    """Stands for the numpy.ndarray class, which numpy's pickles pass to _reconstruct; never called."""


NDARRAY = _Ndarray()


class _DType:
    """numpy.dtype(spec, align, copy) + its BUILD state, reduced to a torch dtype and a byte order."""

    def __init__(self, spec: Any, align: Any = False, copy: Any = True) -> None:
        if not isinstance(spec, str) or spec.lstrip("<>|=") not in NUMPY_TO_TORCH:
            raise Refused(f"array dtype {spec!r} is not a numeric type torch can hold")
        self.code = spec.lstrip("<>|=")
        self.dtype = NUMPY_TO_TORCH[self.code]
        self.big_endian = spec.startswith(">")

    def setstate(self, state: Any) -> None:
        # (version, byte order, subarray, names, fields, elsize, alignment, flags): only plain dtypes pass
        if not isinstance(state, tuple) or len(state) < 5 or state[1] not in ("<", ">", "|", "=") \
                or any(s is not None for s in state[2:5]):
            raise Refused("structured or sub-array numpy dtypes are not weights")
        self.big_endian = state[1] == ">"


def _tensor(dtype: _DType, shape: tuple, data: Any, fortran: bool, budget: "_Budget") -> torch.Tensor:
    if not isinstance(dtype, _DType):
        raise Refused("array state holds no dtype")
    if not isinstance(shape, tuple) or len(shape) > 64 or not all(type(d) is int and d >= 0 for d in shape):
        raise Refused(f"bad array shape {shape!r}"[:120])
    if isinstance(data, str):  # Python 2 pickles hold the raw bytes as a str (decoded as latin-1)
        budget.take(len(data))
        data = data.encode("latin-1")
    elif isinstance(data, (bytes, memoryview)):
        budget.take(len(data))
    else:
        raise Refused("array data is not a byte string")
    itemsize = dtype.dtype.itemsize
    if math.prod(shape) * itemsize != len(data):
        raise Refused(f"array of shape {list(shape)} x {dtype.code} needs {math.prod(shape) * itemsize} "
                      f"bytes, has {len(data)}")
    if len(data) == 0:
        return torch.empty(shape, dtype=dtype.dtype)
    raw = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    if dtype.big_endian and itemsize > 1:
        raw = raw.reshape(-1, itemsize).flip(1).reshape(-1)
    if dtype.dtype == torch.bool and int(raw.max()) > 1:
        raise Refused("bool array holds bytes other than 0 and 1")
    t = raw.view(dtype.dtype)
    return t.reshape(shape[::-1]).permute(*range(len(shape) - 1, -1, -1)).contiguous() if fortran \
        else t.reshape(shape)


class _Array:
    """numpy's _reconstruct(ndarray, (0,), b'b') result, filled by BUILD with
    (version, shape, dtype, is_fortran, data) or the older 4-tuple without version."""

    def __init__(self, budget: "_Budget") -> None:
        self.budget = budget
        self.tensor: torch.Tensor | None = None

    def setstate(self, state: Any) -> None:
        if isinstance(state, tuple) and len(state) == 5:
            state = state[1:]
        if not isinstance(state, tuple) or len(state) != 4:
            raise Refused("array state is not numpy's (shape, dtype, is_fortran, data)")
        shape, dtype, fortran, data = state
        self.tensor = _tensor(dtype, shape, data, bool(fortran), self.budget)


class _Budget:
    """Bytes that may still be materialised (copied into tensors or decoded from latin-1 text)."""

    def __init__(self, size: int) -> None:
        self.left = size

    def take(self, n: int) -> None:
        if n > self.left:
            raise Refused("data referenced more often than the file could hold")
        self.left -= n


def _globals(budget: _Budget) -> dict[tuple[str, str], Callable[..., Any]]:
    def reconstruct(cls: Any, shape: Any = (0,), typecode: Any = b"b") -> _Array:
        if cls is not NDARRAY:
            raise Refused("_reconstruct called for something other than numpy.ndarray")
        return _Array(budget)

    def scalar(dtype: Any, data: Any = b"") -> torch.Tensor:
        return _tensor(dtype, (), data, False, budget)

    def encode(text: Any, encoding: Any = "utf-8") -> bytes:  # how Python 3 protocol 2 writes bytes
        if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
            raise Refused("_codecs.encode is allowed only for latin-1 byte strings")
        budget.take(len(text))
        return text.encode("latin-1")

    def empty_bytes() -> bytes:  # protocol 2 writes b"" as bytes(); any argument is refused
        return b""

    allowed: dict[tuple[str, str], Callable[..., Any]] = {
        ("__builtin__", "bytes"): empty_bytes, ("builtins", "bytes"): empty_bytes,
        ("numpy", "ndarray"): NDARRAY, ("numpy", "dtype"): _DType,
        ("collections", "OrderedDict"): OrderedDict, ("_codecs", "encode"): encode,
    }
    for core in ("numpy.core", "numpy._core"):
        allowed[(f"{core}.multiarray", "_reconstruct")] = reconstruct
        allowed[(f"{core}.multiarray", "scalar")] = scalar
    return allowed


class _Machine:
    def __init__(self, data: bytes | bytearray | memoryview) -> None:
        self.buf = memoryview(data).cast("B")
        self.pos = 0
        self.stack: list[Any] = []
        self.marks: list[list[Any]] = []
        self.memo: dict[int, Any] = {}
        self.allowed = _globals(_Budget(2 * len(self.buf)))

    # --- reading, bounded by the bytes that remain ---
    def take(self, n: int) -> memoryview:
        if n < 0 or n > len(self.buf) - self.pos:
            raise Refused(f"length {n} at byte {self.pos} runs past the end of the file")
        self.pos += n
        return self.buf[self.pos - n:self.pos]

    def uint(self, n: int) -> int:
        return int.from_bytes(self.take(n), "little")

    def line(self) -> str:
        end = bytes(self.buf[self.pos:self.pos + MAX_LINE]).find(b"\n")
        if end < 0:
            raise Refused(f"unterminated text argument at byte {self.pos}")
        return bytes(self.take(end + 1)[:-1]).decode("latin-1")

    def text(self, n: int) -> str:
        try:
            return str(self.take(n), "utf-8", "surrogatepass")
        except UnicodeDecodeError:
            raise Refused(f"invalid UTF-8 string at byte {self.pos}") from None

    # --- the stack ---
    def pop(self) -> Any:
        if not self.stack:
            raise Refused(f"stack underflow at byte {self.pos}")
        return self.stack.pop()

    def pop_mark(self) -> list[Any]:
        if not self.marks:
            raise Refused(f"no MARK before byte {self.pos}")
        items, self.stack = self.stack, self.marks.pop()
        return items

    def top(self, kind: type | tuple[type, ...]) -> Any:
        if not self.stack or not isinstance(self.stack[-1], kind):
            raise Refused(f"opcode at byte {self.pos} applied to the wrong kind of object")
        return self.stack[-1]

    def find(self, module: Any, name: Any) -> Any:
        fn = self.allowed.get((module, name)) if isinstance(module, str) and isinstance(name, str) else None
        if fn is None:
            raise Refused(f"refuses global {str(module)[:80]}.{str(name)[:80]}: only numpy arrays, dtypes and "
                          "plain containers are allowed")
        return fn

    def run(self) -> Any:
        ops = _OPS
        while True:
            if self.pos >= len(self.buf):
                raise Refused("the pickle ends without STOP (truncated file)")
            code = self.buf[self.pos]
            self.pos += 1
            if code == 0x2E:  # STOP
                return _finish(self.pop())
            op = ops.get(code)
            if op is None:
                raise Refused(f"unsupported pickle opcode {bytes([code])!r} at byte {self.pos - 1}")
            op(self)


def _setitems(m: _Machine, items: list[Any]) -> None:
    d = m.top(dict)
    if len(items) % 2:
        raise Refused("odd number of items for a dict")
    for k, v in zip(items[::2], items[1::2]):
        try:
            d[k] = v
        except TypeError:
            raise Refused("unhashable dict key") from None


def _push(m: _Machine, value: Any) -> None:
    """Push after the argument was computed: popping a MARK swaps `m.stack` for the outer list."""
    m.stack.append(value)


def _setitem(m: _Machine) -> None:
    value, key = m.pop(), m.pop()
    _setitems(m, [key, value])


def _dict(m: _Machine) -> None:
    items = m.pop_mark()
    m.stack.append({})
    _setitems(m, items)


def _extend(m: _Machine, items: list[Any]) -> None:
    m.top(list).extend(items)


def _append(m: _Machine) -> None:
    _extend(m, [m.pop()])


def _reduce(m: _Machine) -> None:
    args, fn = m.pop(), m.pop()
    if not isinstance(args, tuple) or not callable(fn) or not any(fn is f for f in m.allowed.values()):
        raise Refused("REDUCE of something that is not an allowed function")
    try:
        m.stack.append(fn(*args))
    except TypeError:
        raise Refused(f"wrong arguments for {getattr(fn, '__name__', fn)}") from None


def _build(m: _Machine) -> None:
    state = m.pop()
    m.top((_Array, _DType)).setstate(state)


def _proto(m: _Machine) -> None:
    if m.uint(1) > 4:
        raise Refused("pickle protocol above 4 (out-of-band buffers) is not a weights file")


def _long(m: _Machine, n: int) -> None:
    if n > 64:
        raise Refused(f"integer of {n} bytes")
    m.stack.append(int.from_bytes(m.take(n), "little", signed=True))


def _put(m: _Machine, i: int) -> None:
    if not m.stack:
        raise Refused(f"memo store from an empty stack at byte {m.pos}")
    m.memo[i] = m.stack[-1]


def _get(m: _Machine, i: int) -> None:
    if i not in m.memo:
        raise Refused(f"memo entry {i} was never stored")
    m.stack.append(m.memo[i])


def _line_int(m: _Machine) -> int:
    try:
        return int(m.line())
    except ValueError:
        raise Refused(f"bad number at byte {m.pos}") from None


def _tuple_n(n: int) -> Callable[[_Machine], None]:
    def op(m: _Machine) -> None:
        if len(m.stack) < n:
            raise Refused(f"stack underflow at byte {m.pos}")
        items = tuple(m.stack[len(m.stack) - n:])
        del m.stack[len(m.stack) - n:]
        m.stack.append(items)
    return op


def _stack_global(m: _Machine) -> None:
    name, module = m.pop(), m.pop()
    m.stack.append(m.find(module, name))


def _global(m: _Machine) -> None:
    module = m.line()
    m.stack.append(m.find(module, m.line()))


def _mark(m: _Machine) -> None:
    m.marks.append(m.stack)
    m.stack = []


def _frame(m: _Machine) -> None:
    if m.uint(8) > len(m.buf) - m.pos:
        raise Refused(f"frame at byte {m.pos} is longer than the file")


_OPS: dict[int, Callable[[_Machine], None]] = {
    0x80: _proto, 0x95: _frame,
    ord("("): _mark, ord("0"): lambda m: m.pop(), ord("1"): lambda m: m.pop_mark(),
    ord("2"): lambda m: m.stack.append(m.top(object)),
    ord("N"): lambda m: m.stack.append(None), 0x88: lambda m: m.stack.append(True),
    0x89: lambda m: m.stack.append(False),
    ord("J"): lambda m: m.stack.append(int.from_bytes(m.take(4), "little", signed=True)),
    ord("K"): lambda m: m.stack.append(m.uint(1)), ord("M"): lambda m: m.stack.append(m.uint(2)),
    0x8A: lambda m: _long(m, m.uint(1)), 0x8B: lambda m: _long(m, m.uint(4)),
    ord("G"): lambda m: m.stack.append(struct.unpack(">d", m.take(8))[0]),
    0x8C: lambda m: m.stack.append(m.text(m.uint(1))), ord("X"): lambda m: m.stack.append(m.text(m.uint(4))),
    0x8D: lambda m: m.stack.append(m.text(m.uint(8))),
    ord("C"): lambda m: m.stack.append(m.take(m.uint(1))), ord("B"): lambda m: m.stack.append(m.take(m.uint(4))),
    0x8E: lambda m: m.stack.append(m.take(m.uint(8))),
    # Python 2 str: decoded as latin-1, like pickle.load(encoding="latin1") (what Paddle's loader passes)
    ord("U"): lambda m: m.stack.append(str(m.take(m.uint(1)), "latin-1")),
    ord("T"): lambda m: m.stack.append(str(m.take(m.uint(4)), "latin-1")),
    ord(")"): lambda m: m.stack.append(()), ord("]"): lambda m: m.stack.append([]),
    ord("}"): lambda m: m.stack.append({}),
    ord("t"): lambda m: _push(m, tuple(m.pop_mark())),
    0x85: _tuple_n(1), 0x86: _tuple_n(2), 0x87: _tuple_n(3),
    ord("l"): lambda m: _push(m, m.pop_mark()),
    ord("d"): _dict, ord("a"): _append, ord("e"): lambda m: _extend(m, m.pop_mark()),
    ord("s"): _setitem, ord("u"): lambda m: _setitems(m, m.pop_mark()),
    ord("c"): _global, 0x93: _stack_global, ord("R"): _reduce, ord("b"): _build,
    ord("q"): lambda m: _put(m, m.uint(1)), ord("r"): lambda m: _put(m, m.uint(4)),
    0x94: lambda m: _put(m, len(m.memo)), ord("p"): lambda m: _put(m, _line_int(m)),
    ord("h"): lambda m: _get(m, m.uint(1)), ord("j"): lambda m: _get(m, m.uint(4)),
    ord("g"): lambda m: _get(m, _line_int(m)),
}


def _finish(obj: Any, depth: int = 0, done: dict[int, Any] | None = None) -> Any:
    """Replace array builders by their tensors and byte views by bytes, throughout the result.

    Each container is converted once (`done`, by identity): a pickle whose memo references one list from
    many places stays as small as its file instead of being copied once per reference (exponential)."""
    done = {} if done is None else done
    if id(obj) in done:
        return done[id(obj)][1]
    if depth > 100:
        raise Refused("containers nested more than 100 deep")
    out = _finish_one(obj, depth, done)
    done[id(obj)] = (obj, out)  # keep obj alive so its id is not reused while converting
    return out


def _finish_one(obj: Any, depth: int, done: dict[int, Any]) -> Any:
    if isinstance(obj, _Array):
        if obj.tensor is None:
            raise Refused("an array was never given its data")
        return obj.tensor
    if isinstance(obj, memoryview):
        return bytes(obj)
    if callable(obj) or isinstance(obj, (_DType, _Ndarray)):
        raise Refused("the pickle holds a type or function where data belongs")
    if isinstance(obj, dict):
        out = type(obj)()
        for k, v in obj.items():
            out[_finish(k, depth + 1, done)] = _finish(v, depth + 1, done)
        return out
    if isinstance(obj, (list, tuple)):
        return type(obj)(_finish(v, depth + 1, done) for v in obj)
    return obj


def safe_unpickle(data: bytes | bytearray | memoryview, name: str = "<bytes>") -> Any:
    """Decode a pickle of weights without importing or calling anything outside the allow-list.

    Every problem (a foreign global, a truncated or corrupt file) raises one CheckpointError line."""
    try:
        return _Machine(data).run()
    except Refused as e:
        raise CheckpointError(f"{name}: {e}", "re-save the weights as a plain {name: array} dict (paddle.save("
                              "model.state_dict(), path)); torchboost never runs code from a weights file") from None
    except Exception as e:  # any other failure on untrusted bytes (e.g. torch refusing a shape) = corrupt file
        raise CheckpointError(f"{name}: malformed pickle ({type(e).__name__}: {str(e)[:100]})",
                              "the file is truncated or corrupt; re-save it") from None
