"""build_dataset (config -> data set). Moved verbatim from tests/test_data_{folder,loader,mnist}.py when
build_dataset moved to torchboost.recipe.data; the configs are still SimpleNamespaces to adapt to DataConfig."""

import types
from pathlib import Path

import pytest
import torch

from test_data_folder import make_folder
from test_data_mnist import write_paddle
from torchboost.data.builtin import load_builtin
from torchboost.data.export import export_folder
from torchboost.data.sampling import SampleIndex, sample_rng
from torchboost.errors import ConfigError, DataError
from torchboost.recipe.data import build_dataset


# From tests/test_data_folder.py::test_exported_mnist5k_folder_matches_builtin_tensors (its second half).
def test_exported_mnist5k_folder_through_build_dataset(tmp_path):
    out = export_folder("mnist5k", tmp_path / "mnist", split="test")
    data = load_builtin("mnist5k", "test")
    # Through build_dataset and the normalized path as well.
    cfg = types.SimpleNamespace(dataset="folder", path=str(out), image_size=28, channels=1, mean=data.mean,
                                std=data.std, crop_pct=1.0, skip_corrupt=False, num_classes=10)
    folder = build_dataset(cfg, "test")
    x, label = folder[5]
    i = int(Path(folder.samples[5][0]).stem)
    torch.testing.assert_close(x, data[i][0])
    assert label == data[i][1]


# From tests/test_data_folder.py.
def test_build_dataset_folder_needs_a_val_or_test_split(tmp_path):
    make_folder(tmp_path / "train")
    cfg = types.SimpleNamespace(dataset="folder", path=str(tmp_path), image_size=16)
    assert len(build_dataset(cfg, "train")) == 9
    with pytest.raises(DataError, match="no val/ or test/"):
        build_dataset(cfg, "test")
    make_folder(tmp_path / "val")
    assert build_dataset(cfg, "test")[0][0].shape == (3, 16, 16)


# From tests/test_data_mnist.py::test_load_paddle_json_detects_scale_and_splits (its last lines).
def test_build_dataset_paddle_json_valid_split(tmp_path):
    path = tmp_path / "mnist.json.gz"
    write_paddle(path, "0..1")
    cfg = types.SimpleNamespace(dataset="paddle_json", path=str(path), image_size=28, channels=1)
    assert len(build_dataset(cfg, "valid")) == 3


# From tests/test_data_loader.py.
def cfg(**kw):
    base = dict(dataset="mnist5k", path=None, image_size=28, channels=1, mean=None, std=None, crop_pct=0.875,
                skip_corrupt=False, num_classes=10, synthetic_size=256)
    return types.SimpleNamespace(**{**base, **kw})


def test_build_dataset_builtin_synthetic_and_overrides():
    assert len(build_dataset(cfg(), "train")) == 4000
    assert len(build_dataset(cfg(dataset="digits", image_size=8), "test")) == 360
    ds = build_dataset(cfg(dataset="digits", image_size=8, mean=[0.5], std=[0.5]), "test")
    torch.testing.assert_close(ds[0][0], ds.images[0].float() / 255 / 0.5 - 1)
    syn = build_dataset(cfg(dataset="synthetic", image_size=32, channels=3, num_classes=100), "train")
    assert len(syn) == 256 and syn[0][0].shape == (3, 32, 32)
    assert len(build_dataset(cfg(dataset="synthetic", image_size=32, channels=3), "test")) == 25


@pytest.mark.parametrize("overrides,error,match", [
    (dict(dataset="cifar"), ConfigError, "unknown data.dataset 'cifar'"),
    (dict(image_size=224), ConfigError, "data.image_size=28"),
    (dict(channels=3), ConfigError, "data.channels=1"),
    (dict(num_classes=5), ConfigError, "at least 10"),
    (dict(mean=[0.5, 0.5, 0.5], std=[0.2] * 3), ConfigError, "1 value"),
    (dict(dataset="mnist_idx"), ConfigError, "needs data.path"),
    (dict(dataset="folder", path="/nonexistent/x"), DataError, "/nonexistent/x does not exist"),
])
def test_build_dataset_errors(overrides, error, match):
    with pytest.raises(error, match=match):
        build_dataset(cfg(**overrides), "train")


def test_random_shift_translates_each_training_image_reproducibly():
    cfg = types.SimpleNamespace(dataset="digits", random_shift=2)
    train, test = build_dataset(cfg, "train"), build_dataset(cfg, "test")
    assert train.shift == 2 and test.shift == 0  # evaluation images are never shifted
    plain = load_builtin("digits", "train")
    idx = [SampleIndex(i, seed=5, epoch=e) for e in (0, 1) for i in range(40)]
    x, y = train.__getitems__(idx)
    ref_x, ref_y = plain.__getitems__([int(i) for i in idx])
    assert torch.equal(y, ref_y)
    background = float((0 - plain.mean[0]) / plain.std[0])
    moved = 0
    for k, i in enumerate(idx):  # independent reference: torch.roll, then blank the wrapped-around band
        dy, dx = (int(v) for v in sample_rng(i).integers(-2, 3, size=2))
        ref = torch.roll(ref_x[k], (dy, dx), dims=(1, 2))
        if dy > 0:
            ref[:, :dy] = background
        elif dy < 0:
            ref[:, dy:] = background
        if dx > 0:
            ref[:, :, :dx] = background
        elif dx < 0:
            ref[:, :, dx:] = background
        torch.testing.assert_close(x[k], ref)
        moved += (dy, dx) != (0, 0)
    assert moved > 30
    assert torch.equal(train.__getitems__(idx)[0], x)  # same (seed, epoch, index): same shift (exact resume)
    with pytest.raises(ConfigError, match="random_shift"):
        build_dataset(types.SimpleNamespace(dataset="synthetic", random_shift=2), "train")
