"""End to end: the CLI's main job, exact resume, SIGKILL-then-resume, and the one-line errors."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from torchboost.cli import main
from torchboost.recipe.load import load_config
from torchboost.train.checkpoint import list_checkpoints, load_checkpoint
from torchboost.recipe.run import train_from_config

FAST = ["train.progress_bar=false", "schedule.mode=constant", "train.log_every=1000"]


def _cfg(tmp, *extra):
    return load_config("digits-lenet", FAST + [f"output={tmp}", *extra])


def _final_weights(out: Path, prefix="mnist_cnn") -> dict:
    return load_checkpoint(list_checkpoints(out / "ckpt", prefix)[-1])["model"]


@pytest.mark.slow
def test_resume_is_exact(tmp_path):
    straight = train_from_config(_cfg(tmp_path / "a", "train.epochs=4"))
    first = train_from_config(_cfg(tmp_path / "b", "train.epochs=2"))
    resumed = train_from_config(_cfg(tmp_path / "b", "train.epochs=4"), resume=str(first.last_checkpoint))
    assert resumed.epochs_done == 4
    a, b = _final_weights(tmp_path / "a"), _final_weights(tmp_path / "b")
    for k in a:
        assert torch.equal(a[k], b[k]), k
    hist = (tmp_path / "b" / "history.jsonl").read_text().splitlines()
    assert len(hist) == 4  # the resumed run continues the history instead of restarting it


def _cli(*args, **kw):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.Popen([sys.executable, "-m", "torchboost", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env, **kw)


@pytest.mark.slow
def test_sigkill_mid_epoch_then_resume(tmp_path):
    common = ["train", "--config", "digits-lenet", *sum((["--set", s] for s in FAST), []),
              "--set", "train.epochs=4", "--set", "checkpoint.save_every_steps=7", "--set", "checkpoint.keep_max=50"]
    ref = _cli(*common, "--output", str(tmp_path / "ref"))
    victim = _cli(*common, "--set", "train.log_every=10", "--output", str(tmp_path / "run"))
    ckdir = tmp_path / "run" / "ckpt"
    # An event, not a clock: kill at the first loss line of epoch 3 (epoch 2's step checkpoints exist by then,
    # and epochs 3-4 are still to come).
    for line in victim.stdout:
        if line.startswith("epoch: 3 "):
            victim.send_signal(signal.SIGKILL)
            break
    assert victim.wait(30) == -signal.SIGKILL, "the run ended before printing epoch 3"
    mids = [p for p in ckdir.glob("mnist_cnn-*_*.pt") if not p.name.endswith("_44.pt")
            and int(p.name.split("-")[1].split("_")[0]) >= 2]
    assert mids, "no mid-epoch checkpoint of epoch 2 was written before the kill"
    for p in list_checkpoints(ckdir, "mnist_cnn"):  # nothing corrupt: every visible checkpoint loads
        load_checkpoint(p)
    last = list_checkpoints(ckdir, "mnist_cnn")[-1]
    resumed = _cli(*common, "--output", str(tmp_path / "run"), "--resume", str(last))
    out, _ = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, out
    assert "resumed from" in out
    assert ref.wait(300) == 0
    a, b = _final_weights(tmp_path / "ref"), _final_weights(tmp_path / "run")
    for k in a:
        assert torch.equal(a[k], b[k]), k


def _error_line(capsys, argv):
    code = main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err
    return err


def test_errors_are_one_line(tmp_path, capsys):
    assert "did you mean 'train.epochs'" in _error_line(capsys, ["train", "--set", "train.epoch=3"])
    assert "must be int" in _error_line(capsys, ["train", "--set", "train.epochs=x"])
    missing = tmp_path / "nope"
    err = _error_line(capsys, ["train", "--set", "data.dataset=folder", "--data", str(missing)])
    assert str(missing) in err
    empty = tmp_path / "empty"
    (empty / "train").mkdir(parents=True)
    (empty / "val").mkdir()
    _error_line(capsys, ["train", "--set", "data.dataset=folder", "--data", str(empty)])


@pytest.mark.slow
def test_corrupt_image_and_wrong_checkpoint(tmp_path, capsys):
    from PIL import Image

    root = tmp_path / "imgs"
    for split in ("train", "val"):
        for c in ("a", "b"):
            d = root / split / c
            d.mkdir(parents=True)
            for i in range(4):
                Image.new("L", (12, 12), color=30 * i).save(d / f"{i}.png")
    (root / "train" / "a" / "bad.png").write_bytes(b"\x89PNG\r\n\x1a\n not an image")
    args = ["train", "--output", str(tmp_path / "out"), "--data", str(root), "--set", "data.image_size=12",
            "--set", "train.epochs=1", "--set", "train.progress_bar=false", "--set", "data.batch_size=4",
            "--set", "model.name=mnist_cnn"]
    assert "bad.png" in _error_line(capsys, args)
    assert main(args + ["--set", "data.skip_corrupt=true", "--overwrite"]) == 0
    assert "skipped 1 corrupt image(s)" in capsys.readouterr().out
    # A checkpoint of a 2-class model resumed as a 10-class run is refused, naming both.
    ckpt = list_checkpoints(tmp_path / "out" / "ckpt", "mnist_cnn")[-1]
    err = _error_line(capsys, ["train", "--resume", str(ckpt), "--set", "model.num_classes=10"])
    assert "model.num_classes=2" in err and "10" in err
    # Its weights as the start of a 10-class run: the head (another class count and input size) starts fresh...
    capsys.readouterr()
    assert main(["train", "--set", f"train.init_weights={ckpt}", "--epochs", "1", "--set", "train.progress_bar=false",
                 "--output", str(tmp_path / "o3")]) == 0
    assert "fc.weight, fc.bias re-initialised (2x180 in the file, 10 classes here)" in capsys.readouterr().out
    # ...but weights of another network name the first tensor that does not fit.
    err = _error_line(capsys, ["train", "--set", f"train.init_weights={ckpt}", "--set", "model.name=resnet18",
                               "--output", str(tmp_path / "o4")])
    assert "has no tensor 'conv1.weight'" in err or "conv1.weight" in err
