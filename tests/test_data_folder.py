"""Image folders: discovery, error paths, corrupt images, worker determinism, the exported mnist5k folder."""

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from torchboost.data import build_loader
from torchboost.data.builtin import load_builtin
from torchboost.data.export import export_folder
from torchboost.data.folder import ImageFolder, loader_skipped
from torchboost.data.transforms import IMAGENET_MEAN, IMAGENET_STD, eval_transform, train_transform
from torchboost.errors import DataError


def write_image(path: Path, seed: int, size=(60, 45)) -> np.ndarray:
    arr = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(arr).save(path, quality=90) if path.suffix.lower() in (".jpg", ".jpeg") else \
        Image.fromarray(arr).save(path)
    return arr


def make_folder(root: Path, per_class=3) -> Path:
    for c, name in enumerate(["dog", "cat", "ant"]):  # sorted order: ant, cat, dog
        for i in range(per_class):
            ext = [".jpg", ".PNG", ".JPEG"][i % 3]  # extensions are matched case-insensitively
            write_image(root / name / f"img{i}{ext}", 10 * c + i)
    (root / "cat" / "notes.txt").write_text("not an image")
    (root / ".hidden").mkdir()  # hidden folders are not classes
    return root


def test_classes_sorted_and_samples_listed(tmp_path):
    ds = ImageFolder(make_folder(tmp_path), eval_transform(32, IMAGENET_MEAN, IMAGENET_STD))
    assert ds.classes == ["ant", "cat", "dog"]
    assert len(ds) == 9 and [label for _, label in ds.samples] == [0] * 3 + [1] * 3 + [2] * 3
    assert all(Path(p).parent.name == ds.classes[label] for p, label in ds.samples)
    x, y = ds[4]
    assert x.shape == (3, 32, 32) and x.dtype == torch.float32 and y == 1


def test_png_pixels_round_trip_through_eval_transform(tmp_path):
    arr = write_image(tmp_path / "a" / "x.png", 0, size=(32, 32))
    ds = ImageFolder(tmp_path, eval_transform(32, IMAGENET_MEAN, IMAGENET_STD, crop_pct=1.0, uint8=True))
    np.testing.assert_array_equal(ds[0][0].permute(1, 2, 0).numpy(), arr)


@pytest.mark.parametrize("setup,match", [
    (lambda root: None, "does not exist"),
    (lambda root: root.write_text("x"), "is not a folder"),
    (lambda root: root.mkdir(), "no class folders"),
    (lambda root: (root / "a").mkdir(parents=True) or (root / "a" / "x.txt").write_text("x"),
     "no images in class folder .*a"),
])
def test_folder_errors_are_one_line_data_errors(tmp_path, setup, match):
    root = tmp_path / "data"
    setup(root)
    with pytest.raises(DataError, match=match) as e:
        ImageFolder(root, None)
    assert "\n" not in str(e.value) and e.value.fix


def corrupt_folder(root: Path) -> Path:
    for i in range(4):
        write_image(root / "a" / f"{i}.jpg", i)
    (root / "a" / "1.jpg").write_bytes(b"\xff\xd8\xff\xe0 definitely not a jpeg")
    good = (root / "a" / "3.jpg").read_bytes()
    (root / "a" / "2.jpg").write_bytes(good[: len(good) // 2])  # truncated: the header parses, decoding fails
    return root


def test_corrupt_image_error_names_the_file(tmp_path):
    ds = ImageFolder(corrupt_folder(tmp_path), train_transform(16, IMAGENET_MEAN, IMAGENET_STD))
    ds[0]
    for i in (1, 2):
        with pytest.raises(DataError, match=f"corrupt image .*{i}.jpg.*skip_corrupt"):
            ds[i]


@pytest.mark.parametrize("workers", [0, 2])
def test_skip_corrupt_substitutes_next_valid_and_counts_each_file_once(tmp_path, workers, capfd):
    t = eval_transform(16, IMAGENET_MEAN, IMAGENET_STD, uint8=True)
    ds = ImageFolder(corrupt_folder(tmp_path), t, skip_corrupt=True)
    readable = {i: t(Image.open(tmp_path / "a" / f"{i}.jpg")) for i in (0, 3)}
    loader = build_loader(ds, 2, train=False, workers=workers, persistent_workers=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):  # two epochs meet the same two corrupt files again
            x = torch.cat([x for x, _ in loader])
            # 1.jpg and 2.jpg are corrupt: samples 1 and 2 both show the next readable one, 3.jpg.
            assert torch.equal(x, torch.stack([readable[0], readable[3], readable[3], readable[3]]))
            assert loader_skipped(loader) == ds.skipped == 2  # counted in the worker processes too
    assert [Path(f).name for f in ds.corrupt_files] == ["1.jpg", "2.jpg"]
    assert not caught  # one `note:` line per file (on stderr, from the worker processes too), no Python warning
    notes = [line for line in capfd.readouterr().err.splitlines() if line.startswith("note: skipping corrupt")]
    named = [Path(line.split()[4]).name for line in notes]
    # two workers may meet the same file at once; in one process each file is named exactly once
    assert (sorted(named) if workers == 0 else sorted(set(named))) == ["1.jpg", "2.jpg"]


def test_evaluation_drops_corrupt_images_instead_of_counting_a_substitute_twice(tmp_path):
    from torchboost.train.model import Model

    t = eval_transform(16, IMAGENET_MEAN, IMAGENET_STD)
    ds = ImageFolder(corrupt_folder(tmp_path), t, skip_corrupt=True, drop_corrupt=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert ds[1] is None and ds[2] is None and ds.skipped == 2
        for workers in (0, 2):
            batches = list(build_loader(ds, 1, train=False, workers=workers, persistent_workers=False))
            assert [b is None for b in batches] == [False, True, True, False]  # 1.jpg, 2.jpg are corrupt
            pairs = list(build_loader(ds, 2, train=False, workers=workers, persistent_workers=False))
            assert [len(y) for _, y in pairs] == [1, 1]
        net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 16 * 16, 2))
        res = Model(net, torch.nn.CrossEntropyLoss(), None).eval(build_loader(ds, 2, train=False))
    readable = torch.stack([ds[0][0], ds[3][0]])  # reference: the two readable images only
    want = (net(readable).argmax(1) == 0).float().mean().item()
    assert res["samples"] == 2 and res["top_1_accuracy"] == pytest.approx(want)


def test_augmentation_is_identical_for_any_number_of_workers(tmp_path):
    ds = ImageFolder(make_folder(tmp_path, per_class=4), train_transform(24, IMAGENET_MEAN, IMAGENET_STD))

    def epochs(workers):
        loader = build_loader(ds, 4, train=True, workers=workers, seed=7)
        out = []
        for epoch in range(2):
            loader.sampler.set_epoch(epoch)
            out.append(torch.cat([x for x, _ in loader]))
        return out

    serial, parallel = epochs(0), epochs(2)
    assert all(torch.equal(a, b) for a, b in zip(serial, parallel))
    assert serial[0].shape == (12, 3, 24, 24) and not torch.equal(serial[0], serial[1])


@pytest.mark.slow
def test_exported_mnist5k_folder_matches_builtin_tensors(tmp_path, monkeypatch):
    import os
    syncs = {"fsync": 0, "sync": 0}
    for name, real in (("fsync", os.fsync), ("sync", os.sync)):
        monkeypatch.setattr(os, name, lambda *a, name=name, real=real: (syncs.__setitem__(name, syncs[name] + 1),
                                                                         real(*a))[1])
    out = export_folder("mnist5k", tmp_path / "mnist", split="test")
    assert syncs == {"fsync": 0, "sync": 1}  # the 1,000 files reach the disk together, not one fsync each
    assert not list(out.rglob("*.tmp"))
    data = load_builtin("mnist5k", "test")
    ds = ImageFolder(out / "test", eval_transform(28, data.mean, data.std, crop_pct=1.0, uint8=True))
    assert ds.classes == [str(c) for c in range(10)] and len(ds) == 1000
    for k in range(0, 1000, 7):
        x, label = ds[k]
        i = int(Path(ds.samples[k][0]).stem)  # files are named by their index in the built-in split
        assert torch.equal(x, data.images[i]) and label == int(data.labels[i])


@pytest.mark.parametrize("transform,side", [
    (train_transform(8193, IMAGENET_MEAN, IMAGENET_STD), 8193),
    (eval_transform(1024, IMAGENET_MEAN, IMAGENET_STD, crop_pct=0.1), 10240),  # resize = 1024 / 0.1
])
def test_folder_refuses_transforms_with_absurd_sizes(tmp_path, transform, side):
    with pytest.raises(DataError, match=f"resizes images to {side} px per side"):
        ImageFolder(make_folder(tmp_path), transform)
    assert len(ImageFolder(tmp_path, train_transform(8192, IMAGENET_MEAN, IMAGENET_STD))) == 9  # the limit
