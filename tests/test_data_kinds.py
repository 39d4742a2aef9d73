"""Data-set kinds are capabilities: a kind is a name, a help line and its source (`recipe/kinds.py`), from which
what it can do follows. Adding one is a loader and one registry line — here a throwaway kind (arrays in .npz
files) registered from outside the package, trained, resumed mid-epoch and raced on a held-out split."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from torchboost.cli import main
from torchboost.data import load_builtin
from torchboost.data.tensors import TensorImageDataset
from torchboost.recipe.kinds import DATA_KINDS, DataKind, Drawn, ImageFiles, InMemory, register
from torchboost.recipe.load import load_config
from torchboost.recipe.run import train_from_config
from torchboost.train.checkpoint import load_checkpoint

FAST = ["train.progress_bar=false", "schedule.mode=constant", "train.log_every=1000", "train.test_at_end=false"]


def load_npz(path: Path, split: str) -> TensorImageDataset:
    """The throwaway kind's loader: PATH/{train,test}.npz with `images` (N×H×W uint8) and `labels`."""
    def arrays(name):
        with np.load(path / f"{name}.npz", allow_pickle=False) as f:
            return f["images"], f["labels"]
    images, labels = arrays(split)
    pixels = arrays("train")[0] / 255.0  # statistics from the train split, as every in-memory kind
    return TensorImageDataset(torch.from_numpy(images)[:, None], torch.from_numpy(labels), [str(c) for c in range(10)],
                              (float(pixels.mean()),), (float(pixels.std()),))


@pytest.fixture
def npz_kind(tmp_path):
    """sklearn's digits written as .npz files, and the kind that reads them registered (for this test only)."""
    root = tmp_path / "npz"
    root.mkdir()
    for split in ("train", "test"):
        ds = load_builtin("digits", split)
        np.savez(root / f"{split}.npz", images=ds.images[:, 0].numpy(), labels=ds.labels.numpy())
    register(DataKind("npz", "images and labels in PATH/{train,test}.npz", InMemory(lambda cfg, split, n: load_npz(
        Path(cfg.path), split))))
    yield ["data.dataset=npz", f"data.path={root}"]
    del DATA_KINDS["npz"]


def weights(out: Path, name: str) -> dict:
    return load_checkpoint(out / "ckpt" / name)["model"]


@pytest.mark.slow
def test_a_kind_registered_in_one_line_trains_resumes_mid_epoch_and_races(tmp_path, npz_kind, capsys, one_thread):
    base = ["data.batch_size=64", "checkpoint.save_every_steps=30", *FAST, *npz_kind]  # 22 updates an epoch
    straight = train_from_config(load_config("digits-lenet", [*base, "train.epochs=2", f"output={tmp_path / 'a'}"]))
    mid = tmp_path / "a" / "ckpt" / "mnist_cnn-2_8.pt"  # update 30: epoch 2, its 8th update
    assert mid.is_file() and straight.epochs_done == 2
    resumed = train_from_config(load_config("digits-lenet", [*base, "train.epochs=2", f"output={tmp_path / 'b'}"]),
                                resume=str(mid))
    assert resumed.epochs_done == 2
    a, b = weights(tmp_path / "a", "mnist_cnn-2_22.pt"), weights(tmp_path / "b", "mnist_cnn-2_22.pt")
    assert all(torch.equal(a[k], b[k]) for k in a)  # resumed mid-epoch = never interrupted
    history = [json.loads(line) for line in (tmp_path / "a" / "history.jsonl").read_text().splitlines()]
    assert history[-1]["val_top_1_accuracy"] > 0.8  # it learned the digits it read through the new kind

    out = tmp_path / "race"
    assert main(["race", "-c", "digits-lenet", *sum((["--set", s] for s in [*npz_kind, "data.batch_size=64"]), []),
                 "--optimizers", "sgd", "--lr", "sgd=0.05", "--epochs", "1", "--seeds", "1", "--targets", "0.5",
                 "--holdout", "300", "--evals-per-epoch", "1", "-o", str(out)]) == 0
    assert "(1137 training images)" in capsys.readouterr().out  # the holdout carved from the kind's train split
    run = json.loads((out / "race.json").read_text())["runs"][0]
    acc = run["history"][-1]["val_top_1_accuracy"]
    assert round(acc * 300) == pytest.approx(acc * 300, abs=1e-6)  # a count over the 300 held-out images


def test_what_a_kind_can_do_follows_from_its_source():
    memory = DataKind("m", "", InMemory(lambda *a: None))
    folder, shards = DataKind("f", "", ImageFiles()), DataKind("s", "", ImageFiles(open_split=print, streamed=True))
    drawn = DataKind("d", "", Drawn())
    table = {k.name: (k.needs_path, k.decoded, k.folder, k.streamed, k.carvable, k.mixing, k.own_labels, k.augments)
             for k in (memory, folder, shards, drawn)}
    photo = ("auto", "imagenet", "flip", "shift", "none")
    assert table == {"m": (True, False, False, False, True, True, True, ("auto", "shift", "none")),
                     "f": (True, True, True, False, True, True, True, photo),
                     "s": (True, True, False, True, False, False, True, photo),
                     "d": (False, False, False, False, True, True, False, ("auto", "none"))}
    assert DataKind("b", "", InMemory(print, reads_path=False)).needs_path is False  # a built-in set
    assert {n for n, k in DATA_KINDS.items() if k.decoded} == {"folder", "shards"}
