"""Fashion-MNIST (data-set kind fashion_mnist) on small IDX files written here, never the Debian package, and
data.train_subset: a stratified subset of the training split, one fixed draw whatever the run's seed."""

import gzip

import numpy as np
import pytest
import torch

from torchboost.data.fashion_mnist import CLASSES, load_fashion_mnist
from torchboost.data.holdout import holdout_split, stratified_subset
from torchboost.errors import ConfigError, DataError
from torchboost.recipe import load_resolved
from torchboost.recipe.load import load_config

from test_data_mnist import idx_bytes


def write_fashion(root, per_class=6, test_per_class=2):
    """IDX files under MNIST's names, gzipped as Debian ships them: each image's pixels hold its label."""
    for prefix, n in (("train", per_class), ("t10k", test_per_class)):
        labels = np.repeat(np.arange(10, dtype=np.uint8), n)
        images = np.broadcast_to(labels[:, None, None] * 20, (len(labels), 28, 28)).astype(np.uint8)
        (root / f"{prefix}-images-idx3-ubyte.gz").write_bytes(gzip.compress(idx_bytes(images, 8)))
        (root / f"{prefix}-labels-idx1-ubyte.gz").write_bytes(gzip.compress(idx_bytes(labels, 8)))
    return root


def test_fashion_mnist_reads_the_idx_files_with_its_classes_and_statistics(tmp_path):
    ds = load_fashion_mnist(write_fashion(tmp_path), "train")
    assert len(ds) == 60 and ds.classes[0] == "T-shirt/top" and ds.classes[9] == "Ankle boot" and len(CLASSES) == 10
    x, y = ds[13]  # label 2 (Pullover): pixels 40/255, normalised with Fashion-MNIST's own statistics
    assert y == 2 and torch.allclose(x, torch.full_like(x, (40 / 255 - 0.2860) / 0.3530), atol=1e-5)
    assert len(load_fashion_mnist(tmp_path, "test")) == 20


def test_a_missing_folder_says_how_to_get_the_files(tmp_path):
    with pytest.raises(DataError, match="apt-get install dataset-fashion-mnist"):
        load_fashion_mnist(tmp_path / "nowhere", "train")


def test_a_stratified_subset_is_one_fixed_draw_with_each_class_alike(tmp_path):
    ds = load_fashion_mnist(write_fashion(tmp_path), "train")
    sub = stratified_subset(ds, 30)
    assert np.bincount(ds.labels.numpy()[sub.indices], minlength=10).tolist() == [3] * 10
    torch.manual_seed(123)  # a run's seed does not move the draw
    assert np.array_equal(stratified_subset(ds, 30).indices, sub.indices)
    assert len(stratified_subset(ds, 60)) == 60
    with pytest.raises(ConfigError, match="data.train_subset=61 but the training split holds 60"):
        stratified_subset(ds, 61)
    train, held = holdout_split(sub, sub, 10)  # a holdout carved from the subset is stratified too
    assert np.bincount(sub.labels[held.indices], minlength=10).tolist() == [1] * 10 and len(train) == 20


def test_train_subset_from_the_config_and_a_holdout_on_top(tmp_path):
    base = ["data.dataset=fashion_mnist", f"data.path={write_fashion(tmp_path)}", "model.name=mnist_cnn"]
    _, train_ds, eval_ds = load_resolved(None, [*base, "data.train_subset=40"])
    assert len(train_ds) == 40 and len(eval_ds) == 20  # the test split is whole
    cfg, train_ds, eval_ds = load_resolved(None, [*base, "data.train_subset=40"], holdout=10)
    assert (len(train_ds), len(eval_ds)) == (40, 10)  # held out of the 20 outside the subset: it trains on 40
    assert sorted(int(y) for _, y in (eval_ds[i] for i in range(10))) == list(range(10))  # one held out per class
    with pytest.raises(ConfigError, match="training split holds 60"):
        load_resolved(None, [*base, "data.train_subset=100"])


def test_train_subset_cannot_be_drawn_from_a_stream():
    with pytest.raises(ConfigError, match="cannot be drawn from streamed"):
        load_config(None, ["data.dataset=shards", "data.path=/tmp/x", "data.train_subset=10"])


@pytest.mark.parametrize("recipe", ["resnet20-fashion10k-thor", "fashion10k-lenet-thor"])
def test_the_fashion_recipes_race_10000_images_from_the_debian_folder(recipe):
    cfg = load_config(recipe)
    assert (cfg.data.dataset, cfg.data.train_subset) == ("fashion_mnist", 10000)
    assert cfg.data.path == "/usr/share/datasets/fashion-mnist"
