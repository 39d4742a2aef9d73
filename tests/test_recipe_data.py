"""Config -> data sets (recipe.data) and the keys inferred from the data (recipe.resolve.resolve_config)."""

from pathlib import Path

import pytest
import torch
from PIL import Image

from test_data_folder import make_folder
from test_data_mnist import write_paddle
from torchboost.data.builtin import load_builtin
from torchboost.data.export import export_folder
from torchboost.data.sampling import SampleIndex
from torchboost.errors import ConfigError, DataError
from torchboost.recipe.config import Config, DataConfig, build_config
from torchboost.recipe.data import build_dataset, load_data
from torchboost.recipe.resolve import resolve_config
from torchboost.recipe.validation import validate


def test_exported_mnist5k_folder_through_build_dataset(tmp_path):
    out = export_folder("mnist5k", tmp_path / "mnist", split="test")
    data = load_builtin("mnist5k", "test")
    cfg = DataConfig(dataset="folder", path=str(out), image_size=28, channels=1, mean=list(data.mean),
                     std=list(data.std), crop_pct=1.0)
    folder = build_dataset(cfg, "test")
    x, label = folder[5]
    i = int(Path(folder.samples[5][0]).stem)
    torch.testing.assert_close(x, data[i][0])
    assert label == data[i][1]


def test_build_dataset_folder_needs_a_val_or_test_split(tmp_path):
    make_folder(tmp_path / "train")
    cfg = DataConfig(dataset="folder", path=str(tmp_path), image_size=16)
    assert len(build_dataset(cfg, "train")) == 9
    with pytest.raises(DataError, match="no val/ or test/"):
        build_dataset(cfg, "test")
    make_folder(tmp_path / "val")
    assert build_dataset(cfg, "test")[0][0].shape == (3, 16, 16)


def test_build_dataset_paddle_json_splits(tmp_path):
    path = tmp_path / "mnist.json.gz"
    write_paddle(path, "0..1")
    cfg = DataConfig(dataset="paddle_json", path=str(path))
    assert len(build_dataset(cfg, "valid")) == 3


def test_builtin_and_synthetic_sets():
    assert len(build_dataset(DataConfig(), "train")) == 4000
    assert len(build_dataset(DataConfig(dataset="digits"), "test")) == 360
    ds = build_dataset(DataConfig(dataset="digits", mean=[0.5], std=[0.5]), "test")
    torch.testing.assert_close(ds[0][0], ds.images[0].float() / 255 / 0.5 - 1)
    syn = build_dataset(DataConfig(dataset="synthetic", image_size=32, synthetic_size=256), "train", num_classes=100)
    assert len(syn) == 256 and syn[0][0].shape == (3, 32, 32) and len(syn.classes) == 100


@pytest.mark.parametrize("data,error,match", [
    (dict(dataset="digits", image_size=224), ConfigError, "digits images are 8×8 but data.image_size=224"),
    (dict(dataset="digits", channels=3), ConfigError, "data.channels=3"),
    (dict(dataset="digits", mean=[0.5] * 3, std=[0.2] * 3), ConfigError, "1 value"),
    (dict(dataset="folder", path="/nonexistent/x"), DataError, "/nonexistent/x does not exist"),
])
def test_build_dataset_errors(data, error, match):
    with pytest.raises(error, match=match):
        build_dataset(DataConfig(**data), "train")


@pytest.mark.parametrize("data,match", [
    (dict(dataset="mnist_idx"), "needs a data path"),
    (dict(dataset="mnist5k", path="/x"), "built in"),
    (dict(dataset="synthetic", random_shift=2), "random_shift"),
    (dict(dataset="digits", augment="imagenet"), "does not apply to data.dataset=digits"),
    (dict(dataset="synthetic", augment="shift"), "does not apply to data.dataset=synthetic"),
    (dict(dataset="synthetic", augment="imagenet"), "does not apply to data.dataset=synthetic"),  # never applied
    (dict(dataset="digits", augment="shift"), "needs data.random_shift"),
    (dict(mean=[0.5]), "together"),
])
def test_data_combinations_are_refused_by_validation(data, match):
    with pytest.raises(ConfigError, match=match):
        validate(build_config({"data": data}))


def test_random_shift_reaches_the_training_set_only():
    d, train, test = load_data(build_config({"data": {"dataset": "digits", "random_shift": 2}}))
    assert (train.shift, test.shift, d.augment) == (2, 0, "shift")
    idx = [SampleIndex(i, seed=5, epoch=0) for i in range(40)]
    assert not torch.equal(train.__getitems__(idx)[0], test.__getitems__(list(range(40)))[0])


def _gray_folder(root: Path, classes=("a", "b", "c"), size=12) -> Path:
    for split in ("train", "val"):
        for c in classes:
            (root / split / c).mkdir(parents=True)
            for i in range(3):
                Image.new("L", (size, size), color=40 * i).save(root / split / c / f"{i}.png")
    return root


def test_folder_keys_are_inferred_from_the_images_and_the_model(tmp_path):
    root = _gray_folder(tmp_path / "imgs")
    cfg = build_config({"data": {"dataset": "folder", "path": str(root)}})
    d, train, _ = load_data(cfg)
    assert (d.channels, d.image_size, d.augment, d.mean, d.std) == (1, 28, "none", [0.5], [0.5])  # digits: no crops
    run = resolve_config(cfg, d, train, None)
    assert (run.model.num_classes, run.model.in_chans, run.checkpoint.prefix) == (3, 1, "mnist_cnn")
    assert cfg.model.num_classes is None and cfg.data.channels is None  # the input config is unchanged
    resnet = build_config({"model": {"name": "resnet18"}, "data": {"dataset": "folder", "path": str(root)}})
    small = load_data(resnet)[0]  # 12-px images keep their size: shifts, not ImageNet crops
    assert (small.image_size, small.augment, small.random_shift) == (12, "shift", 1)
    big = build_config({"model": {"name": "resnet18"}, "data": {"dataset": "folder", "path": str(root),
                                                                 "image_size": 224}})
    assert load_data(big)[0].augment == "imagenet"


def test_a_num_classes_that_contradicts_the_data_is_an_error(tmp_path):
    root = _gray_folder(tmp_path / "imgs")
    cfg = build_config({"model": {"num_classes": 1000}, "data": {"dataset": "folder", "path": str(root)}})
    d, train, _ = load_data(cfg)
    with pytest.raises(ConfigError, match="model.num_classes=1000 but the training data has 3 classes"):
        resolve_config(cfg, d, train, None)
    cfg = build_config({"model": {"in_chans": 3}, "data": {"dataset": "folder", "path": str(root)}})
    d, train, _ = load_data(cfg)
    with pytest.raises(ConfigError, match="model.in_chans=3 but the images have 1 channel"):
        resolve_config(cfg, d, train, None)


def test_python_configs_resolve_like_yaml_ones():
    cfg = Config()
    d, train, _ = load_data(cfg)
    run = resolve_config(cfg, d, train, None)
    assert (run.model.num_classes, run.model.in_chans, run.data.image_size) == (10, 1, 28)
