"""The zoo's networks train at their defaults on a user's folder (`train --data DIR --set model.name=NAME`, no
recipe). Every zoo name has its folder settings (maybe none) and a reason, the guide's table shows them, and a
resolved config applies them under what the user set: cheap checks. The measurement of every network learning
at those defaults is benchmarks/zoo_defaults.py's (BENCHMARKS.md); the slow test below repeats it for the two
networks of issue 55's examples (MobileNetV3's BatchNorm statistics, EfficientNet-B0's divergence) on a smaller
task, the rest of the zoo left to the benchmark to keep the suite inside its 10 minutes. That task: 3 classes of distinct colours,
32 px, 32 images a class to train on and 8 to validate, batch 16 (6 updates an epoch), one thread.

Measured (best validation top-1 of 3 epochs, chance 0.33; CPU s): mobilenet_v3_small 1.0 (6.5 s), -large 1.0
(6.4 s), efficientnet_b0 1.0 (8.4 s), regnet_y_400mf 1.0 (4.6 s), regnet_x_400mf 1.0 (5.5 s), convnext_tiny 1.0
(11.7 s). Without their folder defaults (`recipe.model_defaults`) the first four's validation stayed at
chance (BatchNorm statistics) or diverged (lr 0.05)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from test_zoo_generator import make_colours
from torchboost.cli import main
from torchboost.models import has_batchnorm, list_models
from torchboost.recipe.load import recipe_with_data
from torchboost.recipe.model_defaults import (BATCH_WHY, FOLDER_DEFAULTS, WHY, folder_batch,
                                              folder_defaults)

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "guide" / "own-folder.md"
EXAMPLES = ("mobilenet_v3_small", "efficientnet_b0")

pytestmark = pytest.mark.usefixtures("one_thread")
QUIET = ["--set", "train.progress_bar=false", "--set", "train.log_every=1000"]


@pytest.fixture(scope="module")
def colours(tmp_path_factory):
    return make_colours(tmp_path_factory.mktemp("defaults") / "data", train=32, val=8)


def history(out) -> list[dict]:
    return [json.loads(line) for line in (out / "history.jsonl").read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.parametrize("name", EXAMPLES)
def test_the_issues_examples_learn_at_their_defaults(name, colours, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--data", str(colours), "--set", f"model.name={name}", "--epochs", "3", "-b", "16",
                 "-o", str(out), *QUIET]) == 0
    said = capsys.readouterr().out
    assert all(item in said for item in FOLDER_DEFAULTS.get(name, ())), said.splitlines()[0]
    best = max(row["val_top_1_accuracy"] for row in history(out))
    assert best >= 0.75, [(row["train_top_1_accuracy"], row["val_top_1_accuracy"]) for row in history(out)]


def test_folder_defaults_leave_what_the_user_set():
    adamw = ["optim.name=adamw", "optim.momentum=null", "optim.lr=0.001", "optim.weight_decay=0.05"]
    assert folder_defaults("efficientnet_b0", ["optim.lr=0.1"]) == ["train.precise_bn=10", *adamw[:2], adamw[3]]
    assert folder_defaults("efficientnet_b0", []) == ["train.precise_bn=10", *adamw]
    # another optimizer named: none of the settings chosen for the network's own optimizer
    assert folder_defaults("efficientnet_b0", ["optim.name=sgd"], 400) == ["data.batch_size=16", "train.precise_bn=10"]
    assert folder_defaults("convnext_tiny", ["optim.name=sgd"]) == []
    assert folder_defaults("resnet18", ["optim.name=sgd"]) == ["train.precise_bn=10", "optim.lr=0.02"]  # its own
    assert folder_defaults("resnet18", ["train.precise_bn=0", "optim.lr = 0.1"]) == []
    assert folder_defaults("mnist_cnn", ["data.batch_size=8"]) == [] and folder_defaults("not_a_zoo_name", []) == []


@pytest.mark.parametrize("images", [1, 79, 80, 400, 639, 640, 1279, 1280, 2559, 2560, 10**6])
@pytest.mark.parametrize("name", ["resnet20", "efficientnet_b0", "convnext_tiny"])
def test_a_folders_batch_gives_40_updates_an_epoch_within_its_bounds(images, name):
    """Independently: of the batches 2, 4, ..., 64 (from 16 for a BatchNorm network), the largest with 40 updates
    an epoch, else the smallest."""
    batches = [b for b in (2, 4, 8, 16, 32, 64) if b >= (16 if has_batchnorm(name) else 2)]
    expected = max([b for b in batches if images / b >= 40], default=batches[0])
    assert folder_batch(images, name) == expected
    shown = folder_defaults(name, [], images)
    assert (f"data.batch_size={expected}" in shown) == (expected != 64)  # 64: the default recipe's, not repeated
    assert not any(item.startswith("data.batch_size") for item in folder_defaults(name, ["data.batch_size=8"], images))
    assert folder_defaults("mnist_cnn", [], images) == ["data.batch_size=64"]  # its own: the recipe's


def folder_of(root: Path, per_class: list[int]) -> Path:
    """root/train/c<k>/ with per_class[k] empty .png files (counted, never decoded, before the run)."""
    for k, n in enumerate(per_class):
        (root / "train" / f"c{k}").mkdir(parents=True)
        for i in range(n):
            (root / "train" / f"c{k}" / f"{i}.png").touch()
    return root


def test_a_small_folders_note_names_its_batch_and_the_updates_it_gives(tmp_path):
    data = folder_of(tmp_path / "d", [150, 150, 50])  # 350 images: 16 a batch, 21 updates an epoch
    cfg, overrides, note = recipe_with_data(None, ["model.name=resnet20"], str(data), choose_model=True)
    assert cfg.data.batch_size == 16 and "data.batch_size=16" in overrides  # what a resume re-applies
    assert "resnet20's settings for a folder: data.batch_size=16, train.precise_bn=10 (each can be set; " \
           "data.batch_size=16: 21 updates an epoch of 350 training images)" in note
    cfg, _, note = recipe_with_data(None, ["model.name=resnet20", "data.batch_size=100"], str(data),
                                    choose_model=True)
    assert cfg.data.batch_size == 100 and "data.batch_size" not in note
    cfg, _, note = recipe_with_data("mnist-lenet", ["model.name=resnet20"], str(data))  # a recipe keeps its own
    assert cfg.data.batch_size == 64


def test_a_big_folder_keeps_the_default_batch_and_is_counted_only_so_far(tmp_path, monkeypatch):
    import torchboost.recipe.load as load

    data = folder_of(tmp_path / "d", [1300, 1300, 1300])
    listed = []
    monkeypatch.setattr(load, "class_files", lambda folder: listed.append(folder) or sorted(folder.iterdir()))
    cfg, _, note = recipe_with_data(None, ["model.name=resnet20"], str(data), choose_model=True)
    assert cfg.data.batch_size == 64 and "data.batch_size" not in note
    assert len(listed) == 2  # 2,600 images from two classes are enough to know: the third is not listed


def test_every_zoo_network_has_its_folder_settings_and_a_reason():
    assert sorted(FOLDER_DEFAULTS) == sorted(list_models()) == sorted(WHY)
    assert all(WHY[name].strip() for name in WHY)
    for name, items in FOLDER_DEFAULTS.items():
        assert all(re.fullmatch(r"[a-z_]+\.[a-z_.]+=[^=\s]+", item) for item in items), (name, items)


def test_the_guide_shows_every_networks_folder_settings():
    """docs/guide/own-folder.md's table, read back: the same settings for every zoo name."""
    cells = [line.split("|")[1:3] for line in GUIDE.read_text().splitlines() if line.startswith("| `")]
    rows = [(names, settings) for names, settings in cells if "=" in settings or settings.strip() == "none"]
    shown = {name: tuple(re.findall(r"`([^`]+)`", settings)) for names, settings in rows
             for name in re.findall(r"`([^`]+)`", names)}
    assert shown == FOLDER_DEFAULTS


@pytest.mark.parametrize("name,precise_bn,lr", [("resnet18", 10, 0.02), ("resnet20", 10, 0.05),
                                                ("convnext_tiny", 0, 0.001), ("mnist_cnn", 0, 0.05),
                                                ("efficientnet_b0", 10, 0.001)])
def test_a_folder_run_resolves_to_its_networks_settings_under_what_the_user_set(tmp_path, name, precise_bn, lr):
    (tmp_path / "train").mkdir()
    cfg, overrides, note = recipe_with_data(None, [f"model.name={name}"], str(tmp_path), choose_model=True)
    assert (cfg.train.precise_bn, cfg.optim.lr) == (precise_bn, lr)
    assert all(item in overrides for item in FOLDER_DEFAULTS[name])  # what a resume re-applies
    assert (f"{name}'s settings for a folder" in note) == bool(FOLDER_DEFAULTS[name])
    cfg, _, _ = recipe_with_data(None, [f"model.name={name}", "optim.lr=0.3", "train.precise_bn=0"], str(tmp_path),
                                 choose_model=True)
    assert (cfg.train.precise_bn, cfg.optim.lr) == (0, 0.3)
    cfg, _, _ = recipe_with_data("mnist-lenet", [f"model.name={name}"], str(tmp_path))  # a recipe keeps its own
    assert (cfg.train.precise_bn, cfg.optim.lr) == (0, 0.05)


def test_a_network_too_deep_for_the_images_is_one_line_before_the_run_folder(tmp_path, capsys):
    """ConvNeXt's unpadded 2x2 downsamplings leave nothing of a 28-px image: said in one line, not a traceback."""
    from PIL import Image

    for split in ("train", "val"):
        for k in range(2):
            (tmp_path / "d" / split / f"c{k}").mkdir(parents=True)
            Image.new("L", (28, 28), 80 * k).save(tmp_path / "d" / split / f"c{k}" / "0.png")
    assert main(["train", "--data", str(tmp_path / "d"), "--set", "model.name=convnext_tiny", "-o",
                 str(tmp_path / "run"), *QUIET]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "convnext_tiny needs images of at least 32 px" in err
    assert "data.image_size=32" in err
    assert not (tmp_path / "run").exists()


def test_torchboost_options_lists_every_networks_folder_settings(capsys):
    assert main(["options", "model.name"]) == 0
    said = capsys.readouterr().out.splitlines()
    for name, items in FOLDER_DEFAULTS.items():
        assert f"      {name}: {', '.join(items) or 'none'}" in said, name
    assert (f"      every network: data.batch_size from the folder's training images, {BATCH_WHY} (unless "
            "its own, below, names one)") in said
