"""The zoo's networks train at their defaults on a user's folder (`train --data DIR --set model.name=NAME`, no
recipe): each learns an easy task well above chance within 3 epochs. The task: 3 classes of distinct colours,
32 px, 32 images a class to train on and 8 to validate, batch 16 (6 updates an epoch), one thread.

Measured (best validation top-1 of 3 epochs, chance 0.33; CPU s): mobilenet_v3_small 1.0 (6.5 s), -large 1.0
(6.4 s), efficientnet_b0 1.0 (8.4 s), regnet_y_400mf 1.0 (4.6 s), regnet_x_400mf 1.0 (5.5 s), convnext_tiny 1.0
(11.7 s). Without their folder defaults (`recipe.model_defaults`) the first four's validation stayed at
chance (BatchNorm statistics) or diverged (lr 0.05)."""

from __future__ import annotations

import json

import pytest

from test_zoo_generator import make_colours
from torchboost.cli import main
from torchboost.recipe.model_defaults import FOLDER_DEFAULTS, folder_defaults

pytestmark = pytest.mark.usefixtures("one_thread")
QUIET = ["--set", "train.progress_bar=false", "--set", "train.log_every=1000"]


@pytest.fixture(scope="module")
def colours(tmp_path_factory):
    return make_colours(tmp_path_factory.mktemp("defaults") / "data", train=32, val=8)


def history(out) -> list[dict]:
    return [json.loads(line) for line in (out / "history.jsonl").read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.parametrize("name", [*FOLDER_DEFAULTS, "convnext_tiny"])
def test_every_new_zoo_family_learns_at_its_defaults(name, colours, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--data", str(colours), "--set", f"model.name={name}", "--epochs", "3", "-b", "16",
                 "-o", str(out), *QUIET]) == 0
    said = capsys.readouterr().out
    assert all(item in said for item in FOLDER_DEFAULTS.get(name, ())), said.splitlines()[0]
    best = max(row["val_top_1_accuracy"] for row in history(out))
    assert best >= 0.75, [(row["train_top_1_accuracy"], row["val_top_1_accuracy"]) for row in history(out)]


def test_folder_defaults_leave_what_the_user_set():
    assert folder_defaults("efficientnet_b0", ["optim.lr=0.1"]) == ["train.precise_bn=10"]
    assert folder_defaults("efficientnet_b0", []) == ["train.precise_bn=10", "optim.lr=0.01"]
    assert folder_defaults("resnet20", []) == []
