"""Trust, round four (issue 53): nothing written outside the run by any command, no non-number shown as a
number, names that stay data in every sink, reports that never cost a checkpoint, bounds where a size is input,
the remaining parsers, and the decisions docs/THREAT_MODEL.md records. Each example the outside pass found has
its test here (the ONNX graphs of allowed ops giving NaN, metadata std 5e-324 and a key given twice are cases of
tests/test_onnx_hostile.py's HOSTILE table)."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
import unicodedata
import warnings
from pathlib import Path

import numpy as np
import pytest
from bounded import within
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from test_trust import cli, refused
from torchboost.cli import main

QUIET = ["--set", "train.progress_bar=false", "--set", "train.log_every=1000"]
RACE_FILE = Path(__file__).resolve().parents[1] / "benchmarks" / "races" / "fashion10k-lenet" / "selection-1-a.json"


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> dict[str, Path]:
    """A digits run's best checkpoint, its .onnx export (with the export extra), one 8×8 image, a file that is no
    ONNX model and a two-class image folder."""
    root = tmp_path_factory.mktemp("made")
    assert main(["train", "-c", "digits-lenet", "--epochs", "1", "-b", "512", "-o", str(root / "run"), *QUIET]) == 0
    ckpt = root / "run" / "ckpt" / "mnist_cnn-best.pt"
    files = {"root": root, "ckpt": ckpt, "img": root / "img.png", "bad_onnx": root / "bad.onnx",
             "folder": root / "folder"}
    Image.fromarray((np.arange(64, dtype=np.uint8) * 4).reshape(8, 8)).save(files["img"])
    files["bad_onnx"].write_bytes(b"\xff" * 64)
    for split in ("train", "test"):
        for c in ("a", "b"):
            (files["folder"] / split / c).mkdir(parents=True)
            Image.new("L", (8, 8), 60 if c == "a" else 200).save(files["folder"] / split / c / "0.png")
    if _has("onnx") and _has("onnxruntime"):
        files["onnx"] = root / "m.onnx"
        assert main(["export", str(ckpt), str(files["onnx"])]) == 0
    return files


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


# 1. Confinement. Libraries settle their folders at their first import, so the commands run in one fresh process,
# ordered so that each library the outside pass caught is first imported by the command that leaked it:
# matplotlib by eval --out, the compiler's modules by export, ONNX Runtime (a child per predict) by predict,
# MLflow by train. `launch` is train under torchrun's agent: its workers are train processes.
def commands(m: dict[str, Path], out: Path) -> list[tuple[list[str], int]]:
    """Every subcommand's (argv, exit code), in the order the process runs them."""
    ckpt, img = str(m["ckpt"]), str(m["img"])
    runs = [(["eval", "--checkpoint", ckpt, "--out", f"{out}/ev"], 0)]
    if "onnx" in m:  # ONNX Runtime's device id and database (~/.cache) and $TMPDIR/.ses, for refused models too
        runs += [(["export", ckpt, f"{out}/m.onnx"], 0), (["predict", "--checkpoint", str(m["onnx"]), img], 0)]
    runs += [
        (["export", ckpt, f"{out}/m.pt2", "--format", "exported-program"], 0),
        (["export", ckpt, f"{out}/m.ts", "--format", "torchscript"], 0),
        (["predict", "--checkpoint", str(m["bad_onnx"]), img], 2),
        (["predict", "--checkpoint", ckpt, img, "--format", "csv"], 0),
        (["convert", ckpt, f"{out}/w.safetensors"], 0),
        (["diff-config", "digits-lenet", ckpt, "--json", f"{out}/d.json"], 0),
        (["debug-layers", "-c", "digits-lenet", "--batch-size", "4", "--json", f"{out}/l.json"], 0),
        (["bench", "--model", "mnist_cnn", "--image-size", "28", "--batch-size", "8", "--steps", "1", "--warmup",
          "1", "--mode", "train"], 0),
        (["export-folder", "--dataset", "digits", "--out", str(m["img"])], 2),  # its 1,797 PNGs: 12 s
        (["export-shards", str(m["folder"]), f"{out}/sh"], 0),
        (["options", "optim.lr"], 0), (["recipes"], 0),
        (["race", "-c", "digits-lenet", "--set", "data.batch_size=512", "--optimizers", "sgd", "--lr", "sgd=0.05",
          "--seeds", "1", "--epochs", "1", "--targets", "0.3", "-o", f"{out}/race"], 0),
        (["race", "--report", str(RACE_FILE)], 0),
        (["lr-find", "-c", "digits-lenet", "--optimizers", "sgd", "--updates", "10", "-o", f"{out}/lf"], 0),
        (["align", "-c", "digits-lenet", "--reference-config", "digits-lenet", "--batch-size", "4", "--steps", "1",
          "--rows", "3"], 0),
        (["train", "-c", "digits-lenet", "--epochs", "1", "-b", "512", "-o", f"{out}/t", "--set",
          f"train.loggers={'[csv,mlflow]' if _has('mlflow') else '[csv]'}", *QUIET], 0),
    ]
    return runs


# the child: each command in turn, then every sentinel folder walked; the first that holds anything fails it
CHILD = """
import contextlib, io, json, os, sys
from torchboost.cli import main
runs, places = json.loads(sys.argv[1]), json.loads(sys.argv[2])
for argv, code in runs:
    with contextlib.redirect_stdout(io.StringIO()):
        got = main(argv)
    assert got == code, (argv, got, code)
    left = [os.path.join(d, n) for p in places for d, ds, fs in os.walk(p) for n in ds + fs]
    assert not left, (argv[0], left)
"""
SENTINELS = ("HOME", "TMPDIR", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME",
             "XDG_RUNTIME_DIR")
LIBRARY_VARIABLES = ("MPL", "TORCHINDUCTOR", "TRITON", "TORCHBOOST_CACHE", "MLFLOW", "XDG_", "ORT_")


@pytest.mark.slow
def test_no_subcommand_leaves_anything_in_home_tmpdir_xdg_or_the_working_folder(made, tmp_path):
    """Measured: every path under the sentinel HOME, TMPDIR, XDG folders and working folder after each
    subcommand (each ran to its expected exit code), in a fresh process that inherits none of the libraries'
    variables (round 3's plain `train` among them: matplotlib's font cache goes under the run). Caught before: ONNX Runtime's ~/.cache/Microsoft/DeveloperTools/.onnxruntime and $TMPDIR/.ses,
    an empty $TMPDIR/torchinductor_<user> from export, race, lr-find and predict, matplotlib's ~/.cache/matplotlib
    from eval --out."""
    places = {name: tmp_path / "sentinel" / name.lower() for name in (*SENTINELS, "CWD")}
    for folder in places.values():
        folder.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(LIBRARY_VARIABLES)}
    env.update({name: str(places[name]) for name in SENTINELS}, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(Path(__file__).resolve().parents[1]), env.get("PYTHONPATH", "")]))
    runs = [([str(a) for a in argv], code) for argv, code in commands(made, tmp_path / "out")]
    assert {argv[0] for argv, _ in runs} >= {"train", "eval", "predict", "export", "race", "lr-find", "convert",
                                             "align", "diff-config", "debug-layers", "bench", "export-shards"}
    watched = json.dumps([str(p) for p in places.values()])
    done = subprocess.run([sys.executable, "-c", CHILD, json.dumps(runs), watched], cwd=places["CWD"], env=env,
                          capture_output=True, text=True, timeout=540)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "out" / "t" / "history.png").is_file()  # matplotlib drew, its caches under the run


def one_line(code: int, out: str, err: str) -> str:
    """The one `error:` line of a refused command: exit 2, nothing on stdout, no traceback."""
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and not out and len(lines) == 1 and lines[0].startswith("error: "), (code, out, err[-2000:])
    return lines[0]


# 2. Numbers that are numbers (the ONNX graphs and metadata: tests/test_onnx_hostile.py's HOSTILE table).
def test_a_pt_whose_weights_are_nan_is_one_line_never_a_probability(made, tmp_path):
    """Measured: predict's and eval's exit code and output for a training checkpoint whose weights are all NaN
    (predict printed 'nan' probabilities with exit 0)."""
    ckpt = torch.load(made["ckpt"], weights_only=True)
    ckpt["model"] = {k: torch.full_like(v, float("nan")) if v.is_floating_point() else v
                     for k, v in ckpt["model"].items()}
    torch.save(ckpt, tmp_path / "nan.pt")
    err = one_line(*cli("predict", "--checkpoint", tmp_path / "nan.pt", made["img"]))
    assert "not a finite number" in err and "nan.pt" in err and "img.png" in err
    err = one_line(*cli("eval", "--checkpoint", tmp_path / "nan.pt"))  # its top-1 was class 0's share
    assert "not a finite number" in err and "nan.pt" in err


@pytest.mark.parametrize("dtype", [torch.int8, torch.bool, torch.int64])
def test_plain_weights_of_another_dtype_kind_are_refused(made, tmp_path, dtype):
    """Measured: predict on a plain state dict whose first conv weight is int8 / bool / int64 (cast to float32
    without a word before)."""
    state = torch.load(made["ckpt"], weights_only=True)["model"]
    name = next(k for k, v in state.items() if v.ndim == 4)
    state[name] = state[name].to(dtype)
    torch.save(state, tmp_path / "w.pt")
    err = one_line(*cli("predict", "--checkpoint", tmp_path / "w.pt", "-c", "digits-lenet", made["img"]))
    assert f"tensor '{name}' holds {str(dtype).removeprefix('torch.')}, the model's is float32" in err


def test_half_precision_weights_still_load(made, tmp_path):
    """The dtype check is by kind: float16 weights of a float32 network load (torch casts within a kind)."""
    state = {k: v.half() if v.is_floating_point() else v
             for k, v in torch.load(made["ckpt"], weights_only=True)["model"].items()}
    torch.save(state, tmp_path / "w.pt")
    code, out, err = cli("predict", "--checkpoint", tmp_path / "w.pt", "-c", "digits-lenet", made["img"])
    assert code == 0 and out.startswith(str(made["img"])), err


# 3. Names that stay data: one generator of hostile names over every sink.
FORMULA = ("=", "+", "-", "@")
PIECES = ["\x1b[2J", "\r", "\n", "\t", "\x00", "\u202e", "\u2028", "\udcff", "$", "$\\frac{", "=cmd|' /C calc'!A0",
          "+1", "-1", "@SUM(A1)", ",", '"', "é", "猫", "\U0001f408"]
NAMES = st.lists(st.lists(st.one_of(st.characters(exclude_categories=()), st.sampled_from(PIECES)), min_size=1,
                          max_size=5).map("".join), min_size=2, max_size=4, unique=True)


def shown_safely(text: str) -> bool:
    """No control, format, line-separator or lone-surrogate character (an unassigned code point is a box)."""
    return not any(unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp", "Cs") for c in text)


def safe_cell(cell: str) -> bool:
    return shown_safely(cell) and not cell.startswith(FORMULA)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(names=NAMES)
def test_hostile_class_names_stay_data_in_every_sink(names, tmp_path, monkeypatch, capsys):
    """Measured, for generated class names (controls, lone surrogates of non-UTF-8 folder names, bidi and line
    separators, formula prefixes, matplotlib math): the terminal lines (printable), each CSV cell (printable, never
    starting = + - @), the JSON (ASCII text giving the names back exactly), the picture (drawn, no warning carrying
    a control character) — per-class files, summary lines and predict's text, CSV and JSON."""
    from torchboost.recipe.per_class import per_class_report, summary_lines, write_per_class
    from torchboost.train.per_class import ClassTally

    k = len(names)
    tally = ClassTally(k)
    y = torch.arange(2 * k) % k
    tally.update(torch.nn.functional.one_hot((y + 1) % k, k).float() * 5, y)  # every sample confused
    report = per_class_report(tally, names, [f"{names[i % k]}.png" for i in range(2 * k)])
    said: list[str] = []
    folder = tmp_path / "pc"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        write_per_class(report, folder, f"title {names[0]}", said.append)
    assert not said and (folder / "confusion.png").read_bytes().startswith(b"\x89PNG")
    assert all(shown_safely(str(w.message)) for w in caught), [str(w.message) for w in caught]
    for name in ("per_class.csv", "confusion.csv"):
        rows = list(csv.reader(io.StringIO((folder / name).read_text())))
        cells = [r[0] for r in rows[1:]] + (rows[0][1:] if name == "confusion.csv" else [])
        assert len(cells) == (2 * k if name == "confusion.csv" else k) and all(map(safe_cell, cells)), cells
    text = (folder / "per_class.json").read_text()
    assert text.isascii() and json.loads(text)["classes"] == names
    assert all(map(shown_safely, summary_lines(report)))

    rows = [(f"{names[0]}.png", [(n, 1 / k) for n in names])]
    monkeypatch.setattr("torchboost.recipe.infer.predict_images", lambda *a, **kw: rows)
    capsys.readouterr()
    for fmt in ("text", "csv", "json"):
        code, out, err = cli("predict", "--checkpoint", "m.pt", "x.png", "--format", fmt)
        assert code == 0 and not err, err
        if fmt == "text":
            assert out.count("\n") == 1 and shown_safely(out.rstrip("\n"))
        elif fmt == "csv":
            cells = [c for r in list(csv.reader(io.StringIO(out)))[1:] for c in (r[0], r[2])]
            assert all(map(safe_cell, cells)), cells
        else:
            assert out.isascii() and [t["class"] for t in json.loads(out)[0]["top"]] == names


def test_class_folders_whose_names_are_not_utf8_train_and_report(tmp_path, capsys):
    """Measured: a 1-epoch train on a folder whose class folders are named b'\\xff\\xfebad', b'=cmd' and
    b'ok\\x1b[2J\\r' (the first crashed the end of the run drawing confusion.png): exit 0, the checkpoint, the
    picture, every printed line printable, every CSV name cell safe."""
    root = os.fsencode(tmp_path / "data")
    for split in (b"train", b"val"):
        for c in (b"\xff\xfebad", b"=cmd", b"ok\x1b[2J\r"):
            os.makedirs(os.path.join(root, split, c))
            for i in range(3):
                Image.new("L", (8, 8), 40 * i + (c[0] % 7)).save(os.path.join(root, split, c, b"%d.png" % i))
    out = tmp_path / "run"
    capsys.readouterr()
    code = main(["train", "--data", os.fsdecode(root), "--set", "model.name=mnist_cnn", "--epochs", "1",
                 "-o", str(out), *QUIET])
    printed = capsys.readouterr()
    assert code == 0, printed.err[-2000:]
    assert list((out / "ckpt").glob("*-1_*.pt")) and (out / "val" / "confusion.png").is_file()
    assert all(map(shown_safely, (printed.out + printed.err).splitlines()))
    rows = list(csv.reader(io.StringIO((out / "val" / "per_class.csv").read_text())))
    assert sorted(r[0] for r in rows[1:]) == ["'=cmd", "\\udcff\\udcfebad", "ok\\x1b[2J\\r"]


def test_convert_prints_its_output_path_escaped(made, tmp_path):
    """Measured: convert's stdout when the output path holds ESC and a line break (printed raw before)."""
    target = tmp_path / "w\x1b[2J\nerror: forged.safetensors"
    code, out, err = cli("convert", made["ckpt"], target)
    assert code == 0 and target.is_file(), err
    assert "\x1b" not in out and "w\\x1b[2J\\nerror: forged.safetensors" in out


# 4. Nothing lost to a report.
def test_a_picture_that_cannot_be_drawn_is_one_warning_line(made, tmp_path, monkeypatch, capsys):
    """Measured: eval --out's exit code, its stderr and files when drawing confusion.png raises."""
    def broken(*_, **__):
        raise RuntimeError("matplotlib\nfailed")

    monkeypatch.setattr("torchboost.recipe.per_class.confusion_figure", broken)
    code, out, err = cli("eval", "--checkpoint", made["ckpt"], "--out", tmp_path / "ev")
    assert code == 0 and (tmp_path / "ev" / "per_class.csv").is_file()
    assert not (tmp_path / "ev" / "confusion.png").exists() and not list((tmp_path / "ev").glob(".*tmp"))
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("warning: ") and "confusion.png not drawn" in lines[0]


def test_history_plot_failure_is_one_line_after_the_rows(tmp_path, monkeypatch):
    """Measured: what History.write leaves and says when its picture fails (the rows are written first)."""
    from torchboost.train.callbacks import History

    history = History(tmp_path)
    history.records = [{"epoch": 1, "loss": 1.0}]
    monkeypatch.setattr(History, "plot", lambda self, path: 1 / 0)
    said: list[str] = []
    history.write(said.append)
    assert (tmp_path / "history.jsonl").read_text() == '{"epoch": 1, "loss": 1.0}\n'
    assert len(said) == 1 and "history.png not drawn (ZeroDivisionError" in said[0]


# 5. Bounds where size is input.
def test_ten_thousand_classes_write_a_summary_not_a_matrix(tmp_path):
    """Measured: the files, their sizes and the time of the per-class stage at 10,000 classes and 20,000 samples
    (it wrote a 200 MB confusion.csv, reached 3.4 GB and ran past 200 s)."""
    from torchboost.recipe.per_class import MATRIX_CLASSES, TOP_CONFUSIONS, per_class_report, write_per_class
    from torchboost.train.per_class import ClassTally

    k = 10_000
    tally = ClassTally(k)
    g = torch.Generator().manual_seed(0)
    for _ in range(4):
        tally.update(torch.randn(5000, k, generator=g), torch.randint(0, k, (5000,), generator=g))
    with within(60, "per-class output of 10,000 classes"):  # a bound against the old minutes-long matrix
        report = per_class_report(tally, [f"c{i}" for i in range(k)])
        written = write_per_class(report, tmp_path, "10,000 classes", pytest.fail)
    assert k > MATRIX_CLASSES
    assert sorted(p.name for p in written) == ["per_class.csv", "per_class.json", "top_confusions.csv"]
    assert len((tmp_path / "top_confusions.csv").read_text().splitlines()) == TOP_CONFUSIONS + 1
    assert sum(p.stat().st_size for p in written) < 5 << 20 and report["confusion"] is None


def _race_text(tmp_path: Path, old: str, new: str) -> Path:
    """The committed selection with the first `old` replaced: in its settings, else in its first run."""
    text = RACE_FILE.read_text()
    cut = 0 if old.startswith('"seeds"') else text.index('"runs": [')
    assert old in text[cut:]
    path = tmp_path / "race.json"
    path.write_text(text[:cut] + text[cut:].replace(old, new, 1))
    return path


@pytest.mark.parametrize("old, new, words", [
    ('"seeds": ', '"seeds": ' + "1" * 5000 + ", \"x_seeds\": ", "settings"),  # 5,000 digits: a traceback before
    ('"epoch": ', '"epoch": ' + "9" * 5000 + ", \"x\": ", "evaluation"),
    ('"stopped": "epoch budget"', '"stopped": "reached and held every target, really"', "stopped"),  # a false note
    ('"stopped": "epoch budget"', '"stopped": 7', "stopped"),
    ('"lr": ', '"lr": 1e999, "x": ', "lr"),
])
@pytest.mark.parametrize("flag", ["--report", "--frozen"])
def test_race_files_with_huge_numbers_or_forged_fields_are_one_line(tmp_path, flag, old, new, words):
    """Measured: race --report / --frozen on the committed selection file with one field replaced."""
    err = one_line(*cli("race", flag, _race_text(tmp_path, old, new)))
    assert "is not a race result" in err and words in err


def test_a_ledger_nested_100000_deep_is_one_line(tmp_path):
    """Measured: reading a --ledger of 100,000 nested lists (a RecursionError traceback before)."""
    from torchboost.errors import ConfigError
    from torchboost.race.ledger import read_ledger

    path = tmp_path / "ledger.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ConfigError, match="not a test-split ledger .*nested too deep"):
        read_ledger(path)
    path.write_text('{"format": "torchboost test-split ledger", "tasks": [{"recipe": "r", "overrides": [], '
                    '"runs": [{"racer": "sgd", "lr": 1e999, "seed": 0}]}]}')
    with pytest.raises(ConfigError, match="is not a test-split ledger"):
        read_ledger(path)


def test_a_timm_file_whose_head_has_another_rank_is_refused_not_reshaped(tmp_path):
    """Measured: a timm-named MobileNetV3 file whose conv_head.weight is 960×1280×3×3 (reshape raised before its
    shape was checked): not read as timm's, and loading it is one CheckpointError."""
    from test_timm_names import timm_state
    from torchboost.errors import CheckpointError
    from torchboost.migrate.formats import read_torch_named
    from torchboost.migrate.timm_names import from_timm
    from torchboost.models import create_model
    from torchboost.train.checkpoint import load_model_state

    state = timm_state("mobilenet_v3_small")
    name = next(k for k in state if k.startswith("conv_head") and k.endswith("weight"))
    state[name] = torch.zeros(state[name].shape[0], state[name].shape[1], 3, 3)
    net = create_model("mobilenet_v3_small", num_classes=10)
    assert from_timm(state, "mobilenet_v3_small", net.state_dict()) is None
    torch.save(state, tmp_path / "timm.pt")
    with pytest.raises(CheckpointError):
        load_model_state(net, read_torch_named(tmp_path / "timm.pt", "mobilenet_v3_small", 10, net.state_dict()))


# 6. The remaining parsers.
def test_a_fifo_where_the_mlflow_store_is_is_refused_at_once(tmp_path):
    """Measured: train's exit, its one line and its time with a FIFO at RUN/mlflow/mlflow.db (117 s and 36 WARNING
    lines before)."""
    pytest.importorskip("mlflow")
    (tmp_path / "run" / "mlflow").mkdir(parents=True)
    os.mkfifo(tmp_path / "run" / "mlflow" / "mlflow.db")
    with within(60, "train with a FIFO as its MLflow store"):  # refused before MLflow waits on it (117 s before)
        err = refused("train", "-c", "digits-lenet", "--epochs", "1", "-o", tmp_path / "run",
                      "--set", "train.loggers=[csv,mlflow]", *QUIET)
    assert "mlflow.db is a FIFO" in err


# 7. Decisions written down (docs/THREAT_MODEL.md).
def test_an_image_link_out_of_the_data_folder_is_read(made, tmp_path):
    """Decided: links inside an image folder that lead out of it are followed (a data set assembled from links
    into a shared store); the image is read, never written. Measured: predict's line for such a link."""
    (tmp_path / "imgs").mkdir()
    (tmp_path / "imgs" / "out.png").symlink_to(made["img"])
    code, out, err = cli("predict", "--checkpoint", made["ckpt"], tmp_path / "imgs")
    assert code == 0 and out.startswith(f"{tmp_path / 'imgs' / 'out.png'}: "), err


def test_diff_config_shows_saved_values_unvalidated_but_escaped(made, tmp_path):
    """Decided: diff-config reads a saved config with the checks of a recipe's keys, types and numbers (as eval),
    not its ranges: it shows what a file holds, a value train refuses included. Measured: its exit and table for
    a checkpoint holding optim.lr=-1 and a weight-decay pattern holding ESC."""
    ckpt = torch.load(made["ckpt"], weights_only=True)
    ckpt["config"]["optim"]["lr"] = -1.0
    ckpt["config"]["optim"]["weight_decay_groups"] = {"fc\x1b[2J": 0.0}
    torch.save(ckpt, tmp_path / "odd.pt")
    code, out, err = cli("diff-config", "digits-lenet", tmp_path / "odd.pt")
    assert code == 0 and "\x1b" not in out, err
    assert any(line.split()[:1] == ["optim.lr"] and "-1.0" in line for line in out.splitlines())
    assert "optim.weight_decay_groups.fc\\x1b[2J" in out
    ckpt["config"]["optim"]["lr"] = float("inf")
    torch.save(ckpt, tmp_path / "inf.pt")
    assert "optim.lr=inf is not a finite number" in refused("diff-config", "digits-lenet", tmp_path / "inf.pt")


@pytest.mark.parametrize("argv", [
    ["train", "--epochs", "٣"], ["train", "--set", "train.epochs=٣"], ["train", "--set", "optim.lr=٠.١"],
    ["train", "--lr", "٠.١"], ["train", "-b", "٦٤"],
    ["train", "--set", "data.mean=[٠.٥]", "--set", "data.std=[1]"],
    ["race", "--optimizers", "sgd", "--lr", "sgd=٠.١"], ["race", "--optimizers", "sgd", "--budget", "sgd=²"],
    ["race", "--optimizers", "sgd@²"], ["race", "--seeds", "٣"],
], ids=lambda a: " ".join(a))
def test_numbers_are_written_in_ascii_digits_everywhere(argv):
    """Decided: one rule for digits, ASCII 0-9 (Arabic-Indic digits were read by --set optim.lr and --epochs,
    refused by --set train.epochs; '²' in a budget was a traceback). Measured: each is one line, exit 2."""
    err = refused(*argv, "--print-config") if argv[0] == "train" else refused(*argv, "--epochs", "1")
    assert any(words in err for words in ("not a whole number", "not a number", "must be", "bad", "budget")), err
