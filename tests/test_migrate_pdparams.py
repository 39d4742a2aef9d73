""".pdparams reading/writing and the restricted unpickler: pickles assembled here opcode by opcode (protocol 2
as Paddle 1.x fluid.save_dygraph wrote under Python 3, protocol 4 as paddle.save writes; numpy 1.x
`numpy.core` and 2.x `numpy._core` globals), numpy's own pickles, malicious pickles, and fuzzing."""

import os
import pickle
import random
import struct
import tracemalloc
from collections import OrderedDict

import numpy as np
import pytest
import torch

from bounded import within
from torchboost.errors import CheckpointError
from torchboost.migrate import load_pdparams, parse_pdparams, safe_unpickle, save_pdparams


# --- a minimal pickle assembler written from the opcode table (pickletools), independent of the library ---
class Asm:
    def __init__(self, protocol: int) -> None:
        self.p = protocol
        self.out = bytearray(b"\x80" + bytes([protocol]))

    def text(self, s: str) -> "Asm":
        b = s.encode()
        self.out += (b"\x8c" + bytes([len(b)]) if self.p >= 4 and len(b) < 256 else b"X" + struct.pack("<I", len(b))) + b
        return self

    def glob(self, module: str, name: str) -> "Asm":
        if self.p >= 4:
            self.text(module).text(name)
            self.out += b"\x93"
        else:
            self.out += f"c{module}\n{name}\n".encode()
        return self

    def raw(self, b: bytes) -> "Asm":
        if self.p >= 3:
            self.out += b"B" + struct.pack("<I", len(b)) + b
        else:  # protocol 2 under Python 3: _codecs.encode(latin-1 text, "latin1")
            self.glob("_codecs", "encode").text(b.decode("latin-1")).text("latin1")
            self.out += b"\x86R"
        return self

    def int(self, n: int) -> "Asm":
        self.out += b"J" + struct.pack("<i", n)
        return self

    def op(self, b: bytes) -> "Asm":
        self.out += b
        return self

    def array(self, a: np.ndarray, core: str) -> "Asm":
        self.glob(f"{core}.multiarray", "_reconstruct").glob("numpy", "ndarray").int(0).op(b"\x85")
        self.raw(b"b").op(b"\x87R")
        self.op(b"(").int(1).op(b"(")
        for d in a.shape:
            self.int(d)
        self.op(b"t")
        self.glob("numpy", "dtype").text(a.dtype.str[1:]).op(b"\x89\x88\x87R")
        self.op(b"(").int(3).text(a.dtype.str[0]).op(b"NNN").int(-1).int(-1).int(0).op(b"tb")
        self.op(b"\x89").raw(np.ascontiguousarray(a).tobytes()).op(b"tb")
        return self


W = np.arange(12, dtype="<f4").reshape(3, 4) / 8
B = np.array([1, -2, 3], dtype="<i8")
BIG = np.array([[1.5, 2.5]], dtype=">f8")


def paddle_file(protocol: int, core: str) -> bytes:
    """{"fc.weight": W, "fc.bias": B, "x": BIG, name table} the way paddle.save / fluid.save_dygraph lay it out."""
    a = Asm(protocol).op(b"}(")
    a.text("fc.weight").array(W, core).text("fc.bias").array(B, core).text("x").array(BIG, core)
    a.text("StructuredToParameterName@@").op(b"}(").text("fc.weight").text("linear_0.w_0").op(b"u")
    return bytes(a.op(b"u.").out)


@pytest.mark.parametrize("protocol", [2, 4])
@pytest.mark.parametrize("core", ["numpy.core", "numpy._core"])
def test_hand_built_paddle_files(protocol, core):
    data = paddle_file(protocol, core)
    assert pickle.loads(data)["fc.weight"].tolist() == W.tolist()  # the assembler itself is right
    got = parse_pdparams(data, "hand.pdparams")
    assert list(got) == ["fc.weight", "fc.bias", "x"]  # the name table is dropped
    assert torch.equal(got["fc.weight"], torch.from_numpy(W)) and got["fc.bias"].dtype == torch.int64
    assert torch.equal(got["fc.bias"], torch.tensor([1, -2, 3]))
    assert got["x"].dtype == torch.float64 and got["x"].tolist() == [[1.5, 2.5]]  # big-endian swapped


@pytest.mark.parametrize("protocol", [2, 3, 4])
def test_numpy_pickles_of_every_dtype_and_layout(protocol):
    obj = OrderedDict((np.dtype(c).name, np.arange(6).astype(c).reshape(2, 3))
                      for c in ["f2", "f4", "f8", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "c8", "c16"])
    obj["bool"] = np.array([True, False])
    obj["fortran"] = np.asfortranarray(np.arange(6.0).reshape(2, 3))
    obj["empty"] = np.zeros((0, 3), "f4")
    obj["scalar"] = np.float32(2.5)
    obj["plain"] = [1, 2.5, None, True, "s", b"b", b"", (1, 2), {"k": 2 ** 70}]
    got = safe_unpickle(pickle.dumps(obj, protocol=protocol))
    assert isinstance(got, OrderedDict) and list(got) == list(obj)
    for k, v in obj.items():
        if isinstance(v, np.ndarray):
            assert got[k].shape == v.shape and np.array_equal(got[k].numpy(), v), k
    assert got["scalar"].item() == 2.5 and got["plain"] == obj["plain"]


class Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


class EvilTensor:
    def __reduce__(self):
        return (eval, ("__import__('os').getpid()",))


@pytest.mark.parametrize("protocol", [2, 4])
def test_malicious_pickles_are_refused_and_run_nothing(tmp_path, protocol):
    marker = tmp_path / "pwned"
    for payload, name in (({"w": Evil(marker)}, "system"), ({"w": EvilTensor()}, r"(__builtin__|builtins)\.eval"),
                          (Evil(marker), "system")):
        path = tmp_path / "evil.pdparams"
        path.write_bytes(pickle.dumps(payload, protocol=protocol))
        with pytest.raises(CheckpointError, match=name) as e:
            load_pdparams(path)
        assert "\n" not in str(e.value) and "refuses global" in str(e.value)
    # a global hidden behind an allowed one: numpy's _reconstruct asked to build a foreign class
    data = Asm(4).glob("numpy._core.multiarray", "_reconstruct").glob("subprocess", "Popen").int(0).op(b"\x85")
    with pytest.raises(CheckpointError, match="subprocess.Popen"):
        safe_unpickle(bytes(data.raw(b"b").op(b"\x87R.").out))
    # an allowed function called with a dangerous argument
    with pytest.raises(CheckpointError, match="latin-1"):
        safe_unpickle(bytes(Asm(4).glob("_codecs", "encode").text("x").text("rot13").op(b"\x86R.").out))
    assert not marker.exists()


def test_writer_reads_back_with_numpy_and_ours(tmp_path):
    state = {"conv.weight": torch.randn(4, 3, 5, 5), "bn._mean": torch.zeros(4, dtype=torch.float64),
             "n": torch.tensor(7), "half": torch.randn(3).half(), "flag": torch.tensor([True, False])}
    save_pdparams(tmp_path / "w.pdparams", state)
    data = (tmp_path / "w.pdparams").read_bytes()
    ref = pickle.loads(data)  # numpy's own unpickler, as paddle.load uses: safe here, we wrote the file
    for k, v in state.items():
        assert isinstance(ref[k], np.ndarray) and ref[k].dtype == v.numpy().dtype and np.array_equal(ref[k], v.numpy())
    got = load_pdparams(tmp_path / "w.pdparams")
    assert list(got) == list(state) and all(torch.equal(got[k], v) for k, v in state.items())
    with pytest.raises(CheckpointError, match="bfloat16"):
        save_pdparams(tmp_path / "bf.pdparams", {"x": torch.zeros(2, dtype=torch.bfloat16)})


def test_structure_errors_and_pdopt(tmp_path):
    for obj, match in (([W], "not a dict"), ({"a": {"b": W}}, "not a named array"), ({}, "no weights"),
                       ({"StructuredToParameterName@@": {}}, "no weights")):
        with pytest.raises(CheckpointError, match=match):
            parse_pdparams(pickle.dumps(obj, protocol=4))
    opt = tmp_path / "model.pdopt"
    opt.write_bytes(pickle.dumps({"LR_Scheduler": {"last_epoch": 1}}, protocol=4))
    with pytest.raises(CheckpointError, match="optimizer state"):
        load_pdparams(opt)
    with pytest.raises(CheckpointError, match="cannot read"):
        load_pdparams(tmp_path / "missing.pdparams")


def test_big_parameter_slices_are_joined():
    parts = {"w@@.0": np.arange(4, dtype="f4"), "w@@.1": np.arange(4, 6, dtype="f4")}
    obj = {**parts, "UnpackBigParamInfor@@": {"w": {"OriginShape": [2, 3], "slices": list(parts)}}}
    got = parse_pdparams(pickle.dumps(obj, protocol=2))
    assert list(got) == ["w"] and got["w"].tolist() == [[0, 1, 2], [3, 4, 5]]


def test_absurd_lengths_allocate_nothing():
    tracemalloc.start()
    try:
        for data in (b"\x80\x04\x8e" + struct.pack("<Q", 1 << 60) + b"xx",  # BINBYTES8 of 1 EiB
                     b"\x80\x04\x95" + struct.pack("<Q", 1 << 62) + b"}.",  # a frame longer than the file
                     b"\x80\x02X" + struct.pack("<I", 0xFFFFFFF0) + b"a",
                     b"\x80\x04\x8b" + struct.pack("<I", 1 << 31) + b"\x01"):  # LONG4 of 2 GiB
            with pytest.raises(CheckpointError):
                safe_unpickle(data)
        assert tracemalloc.get_traced_memory()[1] < 1 << 20
    finally:
        tracemalloc.stop()


def test_memo_references_cannot_multiply_the_file():
    """40 arrays built from one memoized 64 KiB payload would materialise 40x the file: refused."""
    b = Asm(4).op(b"](")
    b.out += b"B" + struct.pack("<I", 1 << 16) + bytes(1 << 16) + b"\x940"  # memo 0: the payload
    for _ in range(40):
        b.glob("numpy._core.multiarray", "_reconstruct").glob("numpy", "ndarray").int(0).op(b"\x85")
        b.raw(b"b").op(b"\x87R(").int(1).op(b"(").int(1 << 14).op(b"t")
        b.glob("numpy", "dtype").text("f4").op(b"\x89\x88\x87R(").int(3).text("<").op(b"NNN").int(-1).int(-1)
        b.int(0).op(b"tb\x89h\x00tb")
    data = bytes(b.op(b"e.").out)
    assert len(pickle.loads(data)) == 40  # a valid pickle
    tracemalloc.start()
    try:
        with pytest.raises(CheckpointError, match="more often than the file could hold"):
            safe_unpickle(data)
        assert tracemalloc.get_traced_memory()[1] < 4 * len(data)
    finally:
        tracemalloc.stop()


FOREIGN = [("os", "system"), ("builtins", "eval"), ("builtins", "getattr"), ("subprocess", "Popen"),
           ("numpy", "load"), ("torch", "load"), ("paddle", "to_tensor"), ("numpy.core.multiarray", "array")]


def _mutate(rng: random.Random, base: bytes) -> bytes:
    data = bytearray(base)
    kind = rng.randrange(5)
    if kind == 0:  # truncation
        return bytes(data[:rng.randrange(len(data))])
    if kind == 1:  # bit flips
        for _ in range(rng.randint(1, 8)):
            i = rng.randrange(len(data))
            data[i] ^= 1 << rng.randrange(8)
        return bytes(data)
    if kind == 2:  # a huge length field after a length-prefixed opcode
        spots = [i for i, c in enumerate(data) if c in b"BX\x8c\x8e\x95"]
        i = rng.choice(spots)
        n = {0x8C: 1, 0x8E: 8, 0x95: 8}.get(data[i], 4)
        data[i + 1:i + 1 + n] = rng.choice([b"\xff" * n, (rng.getrandbits(8 * n)).to_bytes(n, "little")])
        return bytes(data)
    if kind == 3:  # a foreign global spliced in where a global was
        module, name = rng.choice(FOREIGN)
        return bytes(data).replace(b"numpy._core.multiarray", module.encode(), 1).replace(
            b"\x0c_reconstruct", bytes([len(name)]) + name.encode(), 1) if rng.random() < 0.5 else \
            bytes(data).replace(b"cnumpy.core.multiarray\n_reconstruct\n", f"c{module}\n{name}\n".encode(), 1)
    i, j = sorted(rng.sample(range(len(data)), 2))  # a duplicated or dropped span
    return bytes(data[:i] + data[j:]) if rng.random() < 0.5 else bytes(data[:j] + data[i:j] + data[j:])


def test_fuzz_mutated_files_fail_cleanly(tmp_path):
    marker = tmp_path / "pwned"
    bases = [paddle_file(4, "numpy._core"), paddle_file(2, "numpy.core"),
             pickle.dumps({"w": np.ones((3, 3), "f4"), "b": np.zeros(3, "f8")}, protocol=4)]
    rng = random.Random(0)
    outcomes = {"ok": 0, "error": 0}
    tracemalloc.start()
    try:
        for i in range(600):
            data = _mutate(rng, bases[i % len(bases)])
            tracemalloc.reset_peak()
            try:
                with within(60, f"mutant {i}"):  # a generous bound against a hang, not a speed claim
                    parse_pdparams(data, "fuzz.pdparams")
                outcomes["ok"] += 1
            except CheckpointError as e:
                assert "\n" not in str(e) and str(e).startswith("fuzz.pdparams"), str(e)
                outcomes["error"] += 1
            assert tracemalloc.get_traced_memory()[1] < 4 * len(data) + (256 << 10), i
    finally:
        tracemalloc.stop()
    assert sum(outcomes.values()) == 600 and outcomes["error"] > 300
    assert not marker.exists()
