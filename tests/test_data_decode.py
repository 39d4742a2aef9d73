"""Image modes: 16-bit, 1-bit and palette images decode to 8-bit L/RGB; channel conversion; sample_folder (channels by majority)."""

import io
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from torchboost.data.folder import ImageFolder, sample_folder
from torchboost.data.transforms import decode, eval_transform
from torchboost.errors import DataError

RAMP = np.linspace(0, 65535, 64 * 64).round().astype(np.uint16).reshape(64, 64)  # full 16-bit range


def reopened(img: Image.Image, fmt: str = "PNG") -> Image.Image:
    buf = io.BytesIO()
    img.save(buf, fmt)
    return Image.open(io.BytesIO(buf.getvalue()))


def luma(rgb: np.ndarray) -> np.ndarray:
    """ITU-R 601-2 luma (what Pillow's RGB -> L computes), in float."""
    return rgb[..., 0] * 0.299 + rgb[..., 1] * 0.587 + rgb[..., 2] * 0.114


@pytest.mark.parametrize("make", [
    lambda: reopened(Image.fromarray(RAMP)),                                     # 16-bit PNG: "I;16"
    lambda: Image.frombytes("I;16B", (64, 64), RAMP.astype(">u2").tobytes()),    # big-endian 16-bit
    lambda: Image.fromarray(RAMP.astype(np.int32)),                              # "I" (32-bit)
])
def test_16_bit_images_keep_their_high_byte(make):
    img = make()
    assert img.mode in ("I;16", "I;16B", "I")
    gray, _ = decode(img, "L")
    got = np.asarray(gray)
    np.testing.assert_array_equal(got, RAMP // 256)
    assert got.min() == 0 and got.max() == 255 and np.all(np.diff(got.ravel().astype(int)) >= 0)
    assert len(np.unique(got)) == 256 and (got == 255).mean() < 0.01  # Pillow's convert saturates 99.6%
    rgb, _ = decode(make(), "RGB")
    np.testing.assert_array_equal(np.asarray(rgb), np.repeat((RAMP // 256)[..., None], 3, -1))


def test_8_bit_data_stored_as_16_bit_comes_back_exactly():
    v = np.arange(256, dtype=np.uint16).reshape(16, 16)
    gray, _ = decode(reopened(Image.fromarray(v * 257)), "L")  # the usual 8 -> 16 bit scaling
    np.testing.assert_array_equal(np.asarray(gray), v)


def test_1_bit_and_palette_images_decode_to_l_and_rgb():
    bits = np.random.default_rng(0).random((20, 30)) < 0.5
    one = reopened(Image.fromarray(bits))
    assert one.mode == "1"
    np.testing.assert_array_equal(np.asarray(decode(one, "L")[0]), np.where(bits, 255, 0))
    np.testing.assert_array_equal(np.asarray(decode(reopened(Image.fromarray(bits)), "RGB")[0]),
                                  np.repeat(np.where(bits, 255, 0)[..., None], 3, -1))
    colours = np.array([[255, 0, 0], [0, 255, 0], [0, 0, 255], [200, 100, 50]], np.uint8)
    index = np.random.default_rng(1).integers(0, 4, (20, 30)).astype(np.uint8)
    pal = Image.fromarray(index, "P")
    pal.putpalette(colours.ravel().tolist())
    pal = reopened(pal)
    assert pal.mode == "P"
    np.testing.assert_array_equal(np.asarray(decode(pal, "RGB")[0]), colours[index])
    gray = np.asarray(decode(reopened(pal), "L")[0]).astype(int)
    assert np.abs(gray - luma(colours[index].astype(float))).max() <= 1


def test_rgb_folder_read_as_one_channel_and_gray_as_three(tmp_path):
    rgb = np.random.default_rng(2).integers(0, 256, (16, 16, 3), dtype=np.uint8)
    gray = np.random.default_rng(3).integers(0, 256, (16, 16), dtype=np.uint8)
    for name, arr in (("rgb", rgb), ("gray", gray)):
        (tmp_path / name / "c").mkdir(parents=True)
        Image.fromarray(arr).save(tmp_path / name / "c" / "x.png")
    as_gray = ImageFolder(tmp_path / "rgb", eval_transform(16, (0.5,), (0.5,), crop_pct=1.0, uint8=True))[0][0]
    assert as_gray.shape == (1, 16, 16)
    assert np.abs(as_gray[0].numpy().astype(int) - luma(rgb.astype(float))).max() <= 1
    as_rgb = ImageFolder(tmp_path / "gray", eval_transform(16, (0.5,) * 3, (0.5,) * 3, crop_pct=1.0, uint8=True))
    assert torch.equal(as_rgb[0][0], torch.from_numpy(gray).expand(3, 16, 16))


@pytest.mark.parametrize("first,channels", [
    (lambda p: Image.fromarray(np.zeros((8, 8), np.uint8)).save(p), 1),             # L
    (lambda p: Image.fromarray(RAMP).save(p), 1),                                    # I;16
    (lambda p: Image.fromarray(np.zeros((8, 8), bool)).save(p), 1),                  # 1
    (lambda p: Image.new("LA", (8, 8)).save(p), 1),                                  # gray + alpha
    (lambda p: Image.new("RGB", (8, 8)).save(p), 3),
    (lambda p: Image.new("RGBA", (8, 8)).save(p), 3),
    (lambda p: Image.new("P", (8, 8)).save(p), 3),                                   # palette: colour
])
def test_folder_channels_follow_the_majority_of_a_sample_across_classes(tmp_path, first, channels):
    """Each mode counts as its channels; one odd file sorting first does not decide for the whole set."""
    for c in ("a", "b"):
        (tmp_path / c).mkdir()
        for i in range(3):
            first(tmp_path / c / f"{i}.png")
    Image.new("RGB" if channels == 1 else "L", (8, 8)).save(tmp_path / "a" / "00-odd.png")  # sorts first
    sample = sample_folder(tmp_path)
    assert sample.channels == channels and (sample.gray, sample.color) == ((6, 1) if channels == 1 else (1, 6))


def test_sample_folder_reads_the_header_only(tmp_path):
    (tmp_path / "a").mkdir()
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (64, 64), dtype=np.uint8)).save(tmp_path / "a" / "x.jpg")
    data = (tmp_path / "a" / "x.jpg").read_bytes()
    (tmp_path / "a" / "x.jpg").write_bytes(data[: len(data) // 2])  # header intact, pixel data cut
    with pytest.raises(OSError):
        Image.open(tmp_path / "a" / "x.jpg").load()  # a decode would fail
    assert sample_folder(tmp_path).channels == 1
    (tmp_path / "a" / "x.jpg").write_bytes(b"not an image")
    with pytest.raises(DataError, match="corrupt image .*x.jpg"):
        sample_folder(tmp_path)
    with pytest.raises(DataError, match="does not exist"):
        sample_folder(tmp_path / "missing")
