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
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
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
    variables. Caught before: ONNX Runtime's ~/.cache/Microsoft/DeveloperTools/.onnxruntime and $TMPDIR/.ses,
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
    done = subprocess.run([sys.executable, "-c", CHILD, json.dumps(runs), json.dumps([str(p) for p in places.values()])],
                          cwd=places["CWD"], env=env, capture_output=True, text=True, timeout=540)
    assert done.returncode == 0, done.stderr[-3000:]
