"""train_transform's augmentation modes against independent references (Pillow pipelines, torch.roll)."""

import io
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from test_data_transforms import assert_pillow_equal, encoded, gradient, hwc
from torchboost.data.builtin import load_builtin
from torchboost.data.export import export_folder
from torchboost.data.folder import ImageFolder
from torchboost.data.sampling import SampleIndex, sample_rng, sample_shifts
from torchboost.data.tensors import TensorImageDataset
from torchboost.data.transforms import IMAGENET_MEAN, IMAGENET_STD, EvalTransform, rrc_params, train_transform
from torchboost.errors import ConfigError

MEAN, STD = IMAGENET_MEAN, IMAGENET_STD


def png(arr: np.ndarray) -> Image.Image:
    return Image.open(io.BytesIO(encoded(arr, "PNG")))


def test_imagenet_mode_uses_rrc_scale():
    arr = gradient(200, 150)
    for seed in range(4):
        draws = np.random.default_rng(seed)
        top, left, h, w = rrc_params(200, 150, draws, scale=(0.5, 0.6))
        assert 0.5 * 0.98 <= h * w / (200 * 150) <= 0.6 * 1.02
        flip = draws.random() < 0.5
        hand = Image.fromarray(arr).crop((left, top, left + w, top + h)).resize((48, 48), Image.BILINEAR)
        hand = np.asarray(hand.transpose(Image.Transpose.FLIP_LEFT_RIGHT) if flip else hand)
        t = train_transform(48, MEAN, STD, uint8=True, augment="imagenet", rrc_scale=(0.5, 0.6))
        assert_pillow_equal(hwc(t(png(arr), np.random.default_rng(seed))), hand)
        old = train_transform(48, MEAN, STD, uint8=True, scale=(0.5, 0.6))  # the former keyword still works
        assert torch.equal(old(png(arr), np.random.default_rng(seed)), t(png(arr), np.random.default_rng(seed)))


def test_flip_mode_is_eval_crop_then_random_flip():
    arr = gradient(100, 60)
    # Eval geometry at size 32, crop_pct 0.5: shorter side to 64 -> 106×64, centre box (37, 16, 69, 48).
    crop = np.asarray(Image.fromarray(arr).resize((106, 64), Image.BILINEAR).crop((37, 16, 69, 48)))
    t = train_transform(32, MEAN, STD, uint8=True, augment="flip", crop_pct=0.5)
    flips = []
    for seed in range(8):
        flip = np.random.default_rng(seed).random() < 0.5
        flips.append(flip)
        assert_pillow_equal(hwc(t(png(arr), np.random.default_rng(seed))), crop[:, ::-1] if flip else crop)
    assert 0 < sum(flips) < 8  # both branches were checked


def shift_reference(x: torch.Tensor, dy: int, dx: int, fill: float) -> torch.Tensor:
    """torch.roll, then blank the band that wrapped around."""
    ref = torch.roll(x, (dy, dx), dims=(1, 2))
    if dy > 0:
        ref[:, :dy] = fill
    elif dy < 0:
        ref[:, dy:] = fill
    if dx > 0:
        ref[:, :, :dx] = fill
    elif dx < 0:
        ref[:, :, dx:] = fill
    return ref


def test_shift_mode_resizes_whole_image_then_translates():
    arr = gradient(40, 30)  # 30 rows × 40 columns
    # evaluation's geometry at crop_pct 1: the shorter side to 20 (26×20), the centre 20×20 (columns 3..23)
    whole = torch.from_numpy(np.asarray(Image.fromarray(arr).resize((26, 20), Image.BILINEAR))[:, 3:23].copy())
    whole = whole.permute(2, 0, 1)
    t = train_transform(20, MEAN, STD, uint8=True, augment="shift", shift=3)
    moved = 0
    for index in range(12):
        i = SampleIndex(index, seed=1, epoch=0)
        dy, dx = (int(v) for v in sample_shifts([i], 3)[0])
        got = t(png(arr), sample_rng(i))
        ref = shift_reference(whole, dy, dx, 0)
        diff = (got.int() - ref.int()).abs()
        assert diff.max() <= 1 and (diff > 0).float().mean() < 0.02  # torch's resize vs Pillow's, as elsewhere
        moved += (dy, dx) != (0, 0)
    assert moved >= 9
    # Normalized output: the moved-in band is the normalized zero pixel.
    x = train_transform(20, MEAN, STD, augment="shift", shift=3)(png(arr), sample_rng(SampleIndex(5, 1, 0)))
    dy, dx = sample_shifts([SampleIndex(5, 1, 0)], 3)[0]
    assert (dy, dx) != (0, 0)
    band = x[:, :dy] if dy > 0 else x[:, dy:] if dy < 0 else x[:, :, :dx] if dx > 0 else x[:, :, dx:]
    torch.testing.assert_close(band, (-torch.tensor(MEAN) / torch.tensor(STD)).view(3, 1, 1).expand_as(band))


def test_shift_on_an_exported_folder_equals_the_in_memory_random_shift(tmp_path):
    out = export_folder("digits", tmp_path, split="test")
    folder_ds = ImageFolder(out / "test", None)
    builtin = load_builtin("digits", "test")
    stems = [int(Path(path).stem) for path, _ in folder_ds.samples]  # file i.png is built-in sample i
    # The in-memory set in the folder's sample order, shifted by TensorImageDataset's own code.
    mem = TensorImageDataset(builtin.images[stems], builtin.labels[stems], builtin.classes, builtin.mean,
                             builtin.std, shift=2)
    folder = ImageFolder(out / "test", train_transform(8, mem.mean, mem.std, augment="shift", shift=2))
    idx = [SampleIndex(k, seed=4, epoch=e) for e in (0, 1) for k in range(0, 360, 9)]
    want, labels = mem.__getitems__(idx)
    for k, i in enumerate(idx):
        x, y = folder[i]
        torch.testing.assert_close(x, want[k])
        assert y == int(labels[k])


def test_none_mode_is_exactly_the_evaluation_transform():
    arr = gradient(90, 70)
    t = train_transform(32, MEAN, STD, augment="none", crop_pct=0.8)
    ref = EvalTransform(32, MEAN, STD, crop_pct=0.8)(png(arr))
    for seed in range(3):
        assert torch.equal(t(png(arr), np.random.default_rng(seed)), ref)


@pytest.mark.parametrize("kw,match", [
    (dict(augment="flipp"), "unknown augmentation 'flipp' — did you mean 'flip'"),
    (dict(augment="random"), "valid: imagenet, flip, shift, none"),
    (dict(augment="imagenet", shift=2), "only applies to the 'shift' augmentation"),
    (dict(augment="shift"), "at least 1 pixel"),
    (dict(rrc_scale=(0.0, 1.0)), "0 < min <= max <= 1"),
    (dict(rrc_scale=(0.9, 0.5)), "0 < min <= max <= 1"),
])
def test_bad_augmentation_options_are_config_errors(kw, match):
    with pytest.raises(ConfigError, match=match) as e:
        train_transform(32, MEAN, STD, **kw)
    assert "\n" not in str(e.value)
