"""Transforms: geometry against hand-computed boxes, draft decoding against full decoding, normalization."""

import io

import numpy as np
import pytest
import torch
from PIL import Image

from torchboost.data.transforms import (IMAGENET_MEAN, IMAGENET_STD, EvalTransform, TrainTransform, decode,
                                        draft_scale, eval_transform, normalize_batch, resize_region,
                                        resize_uint8, rrc_params, train_transform)
from torchboost.errors import ConfigError


def gradient(w: int, h: int) -> np.ndarray:
    """RGB image whose pixels encode their position (R = x, G = y, B = smooth mix), H×W×3 uint8."""
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float64)
    rgb = np.stack([255 * xx / (w - 1), 255 * yy / (h - 1), 128 + 100 * np.sin(xx / 37) * np.cos(yy / 53)], -1)
    return np.clip(np.round(rgb), 0, 255).astype(np.uint8)


def encoded(arr: np.ndarray, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, fmt, **kw)
    return buf.getvalue()


def hwc(x: torch.Tensor) -> np.ndarray:
    return x.permute(1, 2, 0).numpy()


def assert_pillow_equal(got: np.ndarray, ref: np.ndarray) -> None:
    """Torch's uint8 antialiased resize is a port of Pillow's whose rounding differs by one level on a few
    pixels (< 1% even on noise): equal up to that."""
    diff = np.abs(got.astype(int) - ref.astype(int))
    assert got.shape == ref.shape and diff.max() <= 1 and (diff > 0).mean() < 0.02, (diff.max(), diff.mean())


class Scripted:
    """A stand-in random generator returning scripted values, to pin RandomResizedCrop's draws."""

    def __init__(self, uniforms, ints=(), randoms=()):
        self.u, self.i, self.r = list(uniforms), list(ints), list(randoms)

    def uniform(self, lo, hi):
        return self.u.pop(0) if self.u else hi  # exhausted: always the upper bound

    def integers(self, lo, hi):
        assert self.i[0] < hi
        return self.i.pop(0)

    def random(self):
        return self.r.pop(0)


def test_rrc_params_scripted_draw_matches_hand_computation():
    # area 187,500 × scale 0.5 = 93,750; ratio e^0 = 1 -> w = h = round(306.19) = 306; then top 10, left 20.
    assert rrc_params(500, 375, Scripted([0.5, 0.0], ints=[10, 20])) == (10, 20, 306, 306)
    # scale 0.08, log-ratio log(4/3): w = round(sqrt(15000·4/3)) = 141, h = round(sqrt(15000·3/4)) = 106.
    assert rrc_params(500, 375, Scripted([0.08, np.log(4 / 3)], ints=[0, 359])) == (0, 359, 106, 141)


def test_rrc_params_fallback_is_ratio_clamped_centre_crop():
    # Upper bounds every attempt (scale 1, ratio 4/3): h = 274 > 100 never fits -> centre crop, ratio 4/3.
    assert rrc_params(1000, 100, Scripted([])) == (0, 433, 100, 133)  # w = round(100·4/3), (1000-133)//2
    assert rrc_params(100, 1000, Scripted([])) == (433, 0, 133, 100)  # h = round(100 / (3/4)) = 133
    assert rrc_params(120, 100, Scripted([])) == (0, 0, 100, 120)  # ratio 1.2 is allowed: whole image


def test_rrc_params_stay_inside_bounds():
    rng = np.random.default_rng(0)
    for _ in range(300):
        top, left, h, w = rrc_params(500, 375, rng)
        assert 0 <= top and top + h <= 375 and 0 <= left and left + w <= 500
        assert 0.08 * 0.98 <= h * w / (500 * 375) <= 1.0  # rounding of w, h moves the area by < 2%
        assert 3 / 4 * 0.98 <= w / h <= 4 / 3 * 1.02


def test_train_transform_equals_hand_crop_resize_flip():
    arr = gradient(200, 150)
    for seed in range(4):
        draws = np.random.default_rng(seed)
        top, left, h, w = rrc_params(200, 150, draws)
        flip = draws.random() < 0.5
        hand = Image.fromarray(arr).crop((left, top, left + w, top + h)).resize((64, 64), Image.BILINEAR)
        hand = np.asarray(hand.transpose(Image.Transpose.FLIP_LEFT_RIGHT) if flip else hand)
        t = TrainTransform(64, IMAGENET_MEAN, IMAGENET_STD, uint8=True)
        got = t(Image.open(io.BytesIO(encoded(arr, "PNG"))), np.random.default_rng(seed))
        assert got.dtype == torch.uint8 and got.shape == (3, 64, 64)
        assert_pillow_equal(hwc(got), hand)
        # The float path is (x/255 - mean)/std of the same pixels.
        x = train_transform(64, IMAGENET_MEAN, IMAGENET_STD)(Image.fromarray(arr), np.random.default_rng(seed))
        np.testing.assert_allclose(hwc(x), (hwc(got) / 255.0 - np.array(IMAGENET_MEAN)) / np.array(IMAGENET_STD),
                                   atol=1e-5)


def test_flip_mirrors_the_crop():
    arr = gradient(120, 90)
    t = TrainTransform(32, IMAGENET_MEAN, IMAGENET_STD, uint8=True, flip_p=1.0)
    u = TrainTransform(32, IMAGENET_MEAN, IMAGENET_STD, uint8=True, flip_p=0.0)
    a, b = t(Image.fromarray(arr), np.random.default_rng(3)), u(Image.fromarray(arr), np.random.default_rng(3))
    assert torch.equal(a, b.flip(-1))
    assert a[0, 0, 0] > a[0, 0, -1]  # red grows with x: after a flip the left edge is the brighter one


@pytest.mark.parametrize("w,h,size,crop_pct,resized,box", [
    (500, 375, 224, 0.875, (341, 256), (58, 16, 282, 240)),   # 256·500/375 = 341.3; round(58.5) = 58
    (375, 500, 224, 0.875, (256, 341), (16, 58, 240, 282)),
    (100, 60, 32, 0.5, (106, 64), (37, 16, 69, 48)),          # resize 64; 64·100/60 = 106.7 -> 106
    (28, 28, 28, 1.0, (28, 28), (0, 0, 28, 28)),
])
def test_eval_geometry_and_pixels_match_hand_pipeline(w, h, size, crop_pct, resized, box):
    t = EvalTransform(size, IMAGENET_MEAN, IMAGENET_STD, crop_pct, uint8=True)
    assert t.geometry(w, h) == (resized, box)
    arr = gradient(w, h)
    hand = np.asarray(Image.fromarray(arr).resize(resized, Image.BILINEAR).crop(box))
    assert_pillow_equal(hwc(t(Image.open(io.BytesIO(encoded(arr, "PNG"))))), hand)


def test_eval_transform_rejects_bad_crop_pct():
    with pytest.raises(ConfigError, match="crop_pct"):
        eval_transform(224, IMAGENET_MEAN, IMAGENET_STD, crop_pct=1.2)


def test_draft_scale_keeps_region_at_least_output():
    assert draft_scale(2000, 1000, 224, 224) == 4   # 1000/224 = 4.46
    assert draft_scale(447, 447, 224, 224) == 1     # 447/2 < 224: a 2× reduction would upsample
    assert draft_scale(448, 900, 224, 224) == 2
    assert draft_scale(5000, 5000, 224, 224) == 8   # Pillow's largest reduction
    for s in (1, 2, 4, 8):
        w, h = 3 * 224 * s // 2, 224 * s
        assert w / draft_scale(w, h, 224, 224) >= 224 and h / draft_scale(w, h, 224, 224) >= 224


def test_decode_reduces_jpeg_only():
    jpeg = Image.open(io.BytesIO(encoded(gradient(1000, 750), "JPEG", quality=90)))
    img, s = decode(jpeg, "RGB", 4)
    assert s == 4 and img.size == (250, 188)  # ceil(750/4): Pillow keeps the partial last block
    png = Image.open(io.BytesIO(encoded(gradient(100, 80), "PNG")))
    img, s = decode(png, "L", 2)
    assert s == 1 and img.size == (100, 80) and img.mode == "L"


def test_draft_decode_matches_full_decode():
    arr = gradient(1024, 768)
    data = encoded(arr, "JPEG", quality=90)
    full = Image.open(io.BytesIO(data)).convert("RGB")
    t = TrainTransform(224, IMAGENET_MEAN, IMAGENET_STD, uint8=True, flip_p=0.0)
    reduced = 0
    for seed in range(8):
        top, left, h, w = rrc_params(1024, 768, np.random.default_rng(seed))
        reduced += draft_scale(w, h, 224, 224) > 1
        ref = np.asarray(full.crop((left, top, left + w, top + h)).resize((224, 224), Image.BILINEAR), float)
        got = hwc(t(Image.open(io.BytesIO(data)), np.random.default_rng(seed))).astype(float)
        assert np.abs(got - ref).mean() < 6, seed
    assert reduced >= 3  # the comparison exercised real draft reductions
    e = EvalTransform(224, IMAGENET_MEAN, IMAGENET_STD, uint8=True)  # resize 256: 768 // 256 -> 2× draft
    (nw, nh), box = e.geometry(1024, 768)
    ref = np.asarray(full.resize((nw, nh), Image.BILINEAR).crop(box), float)
    assert np.abs(hwc(e(Image.open(io.BytesIO(data)))).astype(float) - ref).mean() < 6


def test_grayscale_transforms_give_one_channel():
    gray = Image.fromarray(gradient(64, 48)).convert("L")
    x = eval_transform(32, (0.5,), (0.25,), crop_pct=1.0)(Image.open(io.BytesIO(encoded(np.asarray(gray), "PNG"))))
    ref = np.asarray(gray.resize((42, 32), Image.BILINEAR).crop((5, 0, 37, 32))) / 255.0
    np.testing.assert_allclose(x[0].numpy(), (ref - 0.5) / 0.25, atol=1e-5)
    y = train_transform(16, (0.5,), (0.25,))(Image.fromarray(gradient(64, 48)), np.random.default_rng(0))
    assert y.shape == (1, 16, 16)


def test_normalize_batch_matches_formula_and_dtype():
    x = torch.randint(0, 256, (4, 3, 8, 8), dtype=torch.uint8)
    ref = (x.double() / 255 - torch.tensor(IMAGENET_MEAN).double().view(3, 1, 1)) / torch.tensor(
        IMAGENET_STD).double().view(3, 1, 1)
    np.testing.assert_allclose(normalize_batch(x, IMAGENET_MEAN, IMAGENET_STD).numpy(), ref.numpy(), atol=1e-5)
    y = normalize_batch(x, IMAGENET_MEAN, IMAGENET_STD, torch.bfloat16)
    assert y.dtype == torch.bfloat16 and torch.allclose(y.double(), ref, atol=2e-2)


def test_mean_std_length_is_checked():
    with pytest.raises(ConfigError, match="1 or 3"):
        train_transform(32, (0.5, 0.5), (0.2, 0.2))


@pytest.mark.parametrize("shape,size", [
    ((375, 500, 3), (224, 224)),   # 500×375 ImageNet photo -> RandomResizedCrop output (unequal factors)
    ((300, 301, 3), (224, 224)),   # odd width, factor ~1.34 (what a draft-reduced crop leaves)
    ((150, 200, 3), (341, 256)),   # upscale, as Resize(256) of a small photo
    ((480, 640), (57, 43)),        # grayscale, large reduction
])
def test_resize_uint8_matches_pillow(shape, size):
    a = np.random.default_rng(0).integers(0, 256, shape, dtype=np.uint8)  # noise: every weight shows
    got = resize_uint8(a, size)
    ref = np.asarray(Image.fromarray(a).resize(size, Image.BILINEAR))
    assert_pillow_equal(got if a.ndim == 3 else got[..., 0], ref)


def test_resize_region_integral_and_fractional_boxes_match_pillow():
    img = Image.fromarray(np.random.default_rng(1).integers(0, 256, (200, 260, 3), dtype=np.uint8))
    whole = (10, 20, 250, 190)  # integral: torch's kernel on the crop
    ref = img.crop(whole).resize((96, 80), Image.BILINEAR)
    assert_pillow_equal(resize_region(img, whole, (96, 80)), np.asarray(ref))
    frac = (10.5, 20.25, 249.5, 189.75)  # fractional: Pillow's resize box over the enclosing crop
    ref = img.crop((10, 20, 250, 190)).resize((96, 80), Image.BILINEAR, box=(0.5, 0.25, 239.5, 169.75))
    np.testing.assert_array_equal(resize_region(img, frac, (96, 80)), np.asarray(ref))
