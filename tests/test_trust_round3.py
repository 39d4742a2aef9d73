"""Trust, round three: the surfaces and value classes the last outside pass found open — writes that would
replace a device node or pass a link, names that would forge a line, folders skipped in silence, shapes past
any photo, numbers that say nothing, and a tracking store that does not answer. Each through the real CLI:
one `error:` line, a non-zero exit, nothing outside changed."""

from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path

import pytest
from PIL import Image

from bounded import within
from torchboost.cli import main
from torchboost.errors import printable

QUIET = ["--set", "train.progress_bar=false", "--set", "train.log_every=1000"]


def one_error(capsys, code: int) -> str:
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert code == 2 and err.startswith("error: ") and "\n" not in err and "Traceback" not in err, (code, err)
    return err


@pytest.fixture(scope="module")
def digits_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("r") / "run"
    assert main(["train", "-c", "digits-lenet", "--epochs", "1", "-b", "512", "-o", str(out), *QUIET]) == 0
    return out


@pytest.mark.parametrize("command", ["diff-config", "export", "convert"])
@pytest.mark.slow
def test_no_writer_renames_over_a_fifo_or_a_link(digits_run, tmp_path, capsys, command):
    ckpt = digits_run / "ckpt" / "mnist_cnn-best.pt"
    name = {"diff-config": "d.json", "export": "m.onnx", "convert": "w.safetensors"}[command]
    argv = {"diff-config": ["diff-config", "digits-lenet", "mnist-lenet", "--json"],
            "export": ["export", str(ckpt)], "convert": ["convert", str(ckpt)]}[command]
    fifo, link, victim = tmp_path / name, tmp_path / f"l{name}", tmp_path / "victim.txt"
    os.mkfifo(fifo)
    victim.write_text("keep")
    link.symlink_to(victim)
    for target in (fifo, link):
        err = one_error(capsys, main([*argv, str(target)]))
        assert "never replaced" in err or "never writes or deletes through" in err
    assert fifo.is_fifo() and link.is_symlink() and victim.read_text() == "keep"


def test_export_folder_never_writes_through_a_link_inside_its_folder(tmp_path, capsys):
    out = tmp_path / "out"
    (out / "train" / "1").mkdir(parents=True)
    (out / "train" / "0").symlink_to(out / "train" / "1")  # class 0's images would land in class 1's folder
    one_error(capsys, main(["export-folder", "--dataset", "digits", "--out", str(out)]))
    assert list((out / "train" / "1").iterdir()) == []


def test_names_that_would_forge_or_break_a_line_are_escaped():
    assert printable("a\udcffb") == "a\\udcffb"  # a lone surrogate: escaped, never a UnicodeEncodeError
    assert printable("x\u202ey\x1b[2J") == "x\\u202ey\\x1b[2J"
    printable("a\udcffb").encode("utf-8")


def test_predict_csv_escapes_controls_and_the_oserror_printer_escapes_names(digits_run, tmp_path, capsys):
    odd = tmp_path / "a\x1b[2J\u202eb.png"
    Image.new("L", (8, 8)).save(odd, format="PNG")
    capsys.readouterr()
    assert main(["predict", "--checkpoint", str(digits_run / "ckpt" / "mnist_cnn-best.pt"), str(odd),
                 "--format", "csv", "--topk", "1"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\u202e" not in out and "\\x1b[2J\\u202eb.png" in out


def test_predict_refuses_a_folder_it_cannot_read(digits_run, tmp_path, capsys, monkeypatch):
    for c in ("a", "b"):
        (tmp_path / "imgs" / c).mkdir(parents=True)
        Image.new("L", (8, 8)).save(tmp_path / "imgs" / c / "0.png")
    real = os.scandir

    def scandir(path="."):  # what a folder without read permission does (root reads any folder)
        if not isinstance(path, int) and Path(path).name == "b":  # an int: a descriptor (shutil.rmtree's)
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)
    err = one_error(capsys, main(["predict", "--checkpoint", str(digits_run / "ckpt" / "mnist_cnn-best.pt"),
                                  str(tmp_path / "imgs")]))
    assert "cannot read the folder" in err and "imgs/b" in err


def png_header_only(path: Path, width: int, height: int) -> None:
    """A PNG whose header claims width×height (8-bit grey) with one empty data chunk: the size alone matters."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"")) +
                     chunk(b"IEND", b""))


@pytest.mark.parametrize("w, h", [(99_000_000, 1), (1, 40_000), (5000, 20)])
def test_images_are_bounded_by_each_side_and_their_aspect(digits_run, tmp_path, capsys, w, h):
    path = tmp_path / "long.png"
    if w * h > 10**6:
        png_header_only(path, w, h)
    else:
        Image.new("L", (w, h)).save(path)
    err = one_error(capsys, main(["predict", "--checkpoint", str(digits_run / "ckpt" / "mnist_cnn-best.pt"),
                                  str(path)]))
    assert "limit" in err or "longer than 64:1" in err


@pytest.mark.parametrize("setting, words", [
    ("model.num_classes=4611686018427387904", "model.num_classes must be >= 1 and <= 1000000"),
    ("data.std=[5e-324]", "data.std must be >= 0.0001"),
    ("data.mean=[1e300]", "data.mean must be >= -1000 and <= 1000"),
])
def test_values_that_overflow_a_size_or_give_nan_are_refused(capsys, setting, words):
    assert words in one_error(capsys, main(["train", "--set", setting, "--print-config"]))


@pytest.mark.parametrize("value", ["nan", "0", "-1", "inf"])
def test_a_race_time_budget_must_be_a_positive_number(capsys, value):
    assert "is not a finite number > 0" in one_error(capsys, main(["race", "--time-budget", value]))


@pytest.mark.slow
def test_a_closed_tracking_port_fails_in_seconds_with_its_cause(tmp_path, capsys):
    pytest.importorskip("mlflow")
    with within(60, "a train against a closed tracking port"):  # MLflow's own defaults retried for minutes
        code = main(["train", "-c", "digits-lenet", "--epochs", "1", "-o", str(tmp_path / "run"),
                     "--set", "train.loggers=[csv,mlflow]", "--set", "train.mlflow.tracking_uri=http://127.0.0.1:9",
                     *QUIET])
    err = one_error(capsys, code)
    assert "Connection refused" in err and "no checkpoint was written yet" in err and "intact" not in err
