"""Trust, round three: numbers past float range and Python's digit limits (docs/THREAT_MODEL.md).

An int above 1.8e308 is an OverflowError wherever it meets a float, and one of over 4,300 digits a ValueError
wherever Python parses or prints it. Numeric strings of every size (1, 10, 308, 309, 400, 4,300, 5,001 digits,
either sign) and floats (1e309, -1e309, nan, inf, 1e-400) go through every place a number comes in: `--set`
for int and float keys, `--epochs`, `--lr`, a recipe file, a checkpoint's saved config, ONNX metadata, and
IDX headers whose dimensions multiply past int64. Each is a valid value where the key allows it, otherwise
one `error:` line, exit 2: never a traceback. Each case failed before its fix (OverflowError, ValueError, a
reshape traceback)."""

from __future__ import annotations

import contextlib
import gzip
import json
import struct
import sys

import pytest
import torch

from test_trust import cli
from torchboost.data.mnist import read_idx
from torchboost.deploy.metadata import DeployInfo
from torchboost.errors import CheckpointError, DataError
from torchboost.recipe.config import build_config

pytestmark = pytest.mark.usefixtures("one_thread")
FLOAT_MAX = sys.float_info.max


def numbers() -> list[str]:
    """Numeric strings of every size and sign, and the floats that overflow, underflow or are not numbers."""
    out = []
    for digits in (1, 10, 308, 309, 400, 4300, 5001):
        text = "1" + "0" * (digits - 1) if digits < 4300 else "9" * digits
        out += [text, "-" + text]
    return out + ["1e309", "-1e309", "1.0e+309", "nan", ".nan", "inf", "-inf", ".inf", "1e-400", "0.5", "3"]


NUMBERS = numbers()
REFUSALS = ("is not a finite number in range", "must be int, got")


@contextlib.contextmanager
def any_digits():
    """Python's limit on int <-> str lifted, for the test's own arithmetic on 5,001-digit numbers."""
    old = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)
    try:
        yield
    finally:
        sys.set_int_max_str_digits(old)


def number(text: str) -> int | float:
    """What `text` means as a number, exactly."""
    with any_digits():
        try:
            return int(text)
        except ValueError:
            return float(text.lstrip(".") if text.lstrip("-").startswith(".") else text)


def in_range(text: str) -> bool:
    return -FLOAT_MAX <= number(text) <= FLOAT_MAX


def one_line_or_ok(*argv) -> tuple[int, str]:
    """(exit code, the error line or '') of the real CLI: exit 0, or exit 2 with exactly one `error:` line;
    no traceback either way."""
    code, out, err = cli(*argv, seconds=60)
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith(("note:", "warning:"))]
    assert "Traceback" not in err, err[-3000:]
    assert (code == 0 and not lines) or (code == 2 and len(lines) == 1 and lines[0].startswith("error: ")), \
        (code, err[:3000])
    return code, lines[0] if lines else ""


@pytest.mark.parametrize("text", NUMBERS, ids=[t if len(t) < 12 else f"{t[:3]}..{len(t)}" for t in NUMBERS])
def test_set_epochs_lr_and_a_recipe_take_any_number_in_one_line(text, tmp_path):
    """int keys (train.epochs, in 1..10^6) and float keys (optim.lr > 0; data.mean, a list of floats)."""
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"train:\n  epochs: {text}\noptim:\n  lr: {text}\n")
    results = {
        "int": one_line_or_ok("train", "--print-config", "--set", f"train.epochs={text}"),
        "float": one_line_or_ok("train", "--print-config", "--set", f"optim.lr={text}"),
        "list": one_line_or_ok("train", "--print-config", "--set", f"data.mean=[{text}]", "--set", "data.std=[1]"),
        "--epochs": one_line_or_ok("train", "--print-config", "--epochs", text),
        "--lr": one_line_or_ok("train", "--print-config", "--lr", text),
        "recipe": one_line_or_ok("train", "--print-config", "-c", recipe),
    }
    value = number(text)
    for source, (code, err) in results.items():
        if not in_range(text):  # never accepted; said as what it is where the value reaches its key
            # the flags are argparse's first (its own one line, which may quote the value whole)
            flag = source.startswith("--") and err.startswith(f"error: argument {source}")
            assert code == 2 and (flag or any(words in err for words in REFUSALS)), (source, err[:400])
            assert len(err) < 400 or flag, (source, err[:400])
    assert (results["float"][0] == 0) == (isinstance(value, (int, float)) and in_range(text) and value > 0
                                           and float(value) > 0)
    assert (results["int"][0] == 0) == (type(value) is int and 1 <= value <= 1_000_000)


@pytest.mark.parametrize("text", [t for t in NUMBERS if t.lstrip("-").isdigit()] + ["1e309", "nan", "inf"])
def test_a_checkpoints_saved_config_takes_any_number_in_one_line(text, tmp_path):
    """A saved config holds Python numbers (pickled: no digit limit): train.epochs and optim.lr set to each,
    read by diff-config (types) and eval (the validation pass)."""
    cfg = build_config().to_dict()
    with any_digits():
        cfg["train"]["epochs"] = cfg["optim"]["lr"] = number(text)
    ckpt = tmp_path / "run.pt"
    torch.save({"config": cfg, "model": {}}, ckpt)
    for argv in (["diff-config", ckpt, "mnist-lenet"], ["eval", "--checkpoint", ckpt]):
        code, err = one_line_or_ok(*argv)
        if not in_range(text):
            # torch's weights-only unpickler refuses an int of over 255 bytes itself (LONG4): a file it cannot
            # read (diff-config), or not a training checkpoint (eval reads it as plain weights), in one line too
            assert code == 2 and any(w in err for w in ("past the float range", "not a finite number in range",
                                                        "cannot read checkpoint", "holds weights but no saved")), err


@pytest.mark.parametrize("text", NUMBERS + ["1" * 400 + ".5"], ids=lambda t: t if len(t) < 12 else f"{t[:3]}..{len(t)}")
def test_onnx_metadata_takes_any_number_in_one_line(text):
    info = DeployInfo("tiny", ("a", "b"), 1, 8, 8, (0.5,), (0.25,), "test")
    json_text = {"nan": "NaN", ".nan": "NaN", "inf": "Infinity", ".inf": "Infinity", "-inf": "-Infinity"}.get(
        text, text.lstrip(".") if text.startswith(".") else text)
    for key, bad in (("mean", f"[{json_text}]"), ("std", f"[{json_text}]"), ("resize", json_text),
                     ("input_size", f"[1, 8, {json_text}]")):
        props = {**info.to_props(), key: bad}
        try:
            DeployInfo.from_props(props, "m.onnx")
        except CheckpointError as e:
            assert "\n" not in str(e) and len(str(e)) < 300
        else:
            assert in_range(text), (key, text)


def idx(dims: tuple[int, ...], payload: bytes = b"", code: int = 8) -> bytes:
    return bytes([0, 0, code, len(dims)]) + struct.pack(f">{len(dims)}I", *dims) + payload


# headers whose dims multiply past int64 (numpy's product wraps: to 0, to a negative, to a small size)
IDX_HEADERS = {
    "three dims of 2^31 (2^93: numpy says 0)": idx((2**31,) * 3),
    "four dims of 2^16 (2^64: numpy says 0)": idx((2**16,) * 4),
    "2^31 x 2^31 x 3 (numpy says negative)": idx((2**31, 2**31, 3)),
    "largest dims, 255 of them": idx((2**32 - 1,) * 255),
    "255 dims of 2": idx((2,) * 255, bytes(64)),
    "17 dims of 1, one value": idx((1,) * 17, b"\x00"),
    "float64 of 2^61 values": idx((2**61 // 2**32, 2**32 - 1), code=0x0E),
    "a zero dim": idx((0, 2**32 - 1)),
    "one huge dim, a few bytes": idx((2**32 - 1,), b"\x00" * 7),
}


@pytest.mark.parametrize("name", list(IDX_HEADERS))
@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.slow
def test_idx_headers_that_multiply_past_int64_are_one_line(name, gz, tmp_path):
    data = IDX_HEADERS[name]
    data = gzip.compress(data) if gz else data
    path = tmp_path / "train-images-idx3-ubyte"
    path.write_bytes(data)
    try:
        array = read_idx(path)
    except DataError as e:
        assert "\n" not in str(e) and len(str(e)) < 3000
    else:  # only a header that holds what it says
        assert array.size * array.itemsize == len(IDX_HEADERS[name]) - 4 - 4 * IDX_HEADERS[name][3]
    labels = tmp_path / "train-labels-idx1-ubyte"
    labels.write_bytes(idx((1,), b"\x00"))
    code, err = one_line_or_ok("train", "--set", "data.dataset=mnist_idx", "--set", f"data.path={tmp_path}",
                               "--epochs", "1", "-o", tmp_path / "out")
    assert code == 2 and str(path) in err
    assert not (tmp_path / "out").exists()


def test_messages_show_a_long_number_short():
    code, err = one_line_or_ok("train", "--print-config", "--set", "optim.lr=" + "7" * 5001)
    assert code == 2 and "optim.lr=777777777777…(5,001 digits) is not a finite number in range" in err
    code, err = one_line_or_ok("train", "--print-config", "--set", "optim.lr=1e999")
    assert code == 2 and "optim.lr=1e999 is not a finite number in range" in err
    code, err = one_line_or_ok("train", "--print-config", "--set", "train.epochs=" + "1" * 320)
    assert code == 2 and "train.epochs=111111111111…(320 digits)" in err and len(err) < 200
    code, err = one_line_or_ok("train", "--print-config", "--set", "train.epochs=" + "1" * 300)
    assert code == 2 and "must be >= 1 and <= 1000000, got 111111111111…(300 digits)" in err
    assert json.loads(json.dumps(build_config(overrides=["optim.lr=1e308"]).optim.lr)) == 1e308  # legal: kept
