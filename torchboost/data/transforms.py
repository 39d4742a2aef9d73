"""Training and evaluation transforms with Pillow + torch (torchvision is not required: its wheels are CUDA builds).

Geometry follows torchvision: RandomResizedCrop's sampling, Resize of the shorter side, centre crop, and
Pillow's antialiased bilinear resize (run by torch's faster uint8 port of it where the box is whole
pixels). JPEGs are decoded in Pillow's draft mode at the largest 1/2, 1/4 or 1/8 reduction whose crop
region still covers the output size, so large photos skip most decode work. Every image becomes 8-bit L
(one channel) or RGB (three): 16-bit grayscale keeps its high byte, 1-bit, palette and alpha images are
converted by Pillow.

Training augmentations (`train_transform(augment=...)`): "imagenet" (RandomResizedCrop + flip), "flip"
(the evaluation resize + centre crop, then flip), "shift" (whole image resized, then translated by a few
pixels, as `TensorImageDataset(shift=...)` does for in-memory sets) and "none" (the evaluation transform).
Then, optionally and in torchvision's order (`augment.py`): a photo policy (`auto_augment`: RandAugment or
TrivialAugmentWide) on the flipped crop, at the output size, and random erasing of the uint8 crop, before
normalisation. Neither draws anything when off, so a transform without them draws what it always drew.

A transform is called as `transform(img, rng)` with an opened but not yet decoded PIL image (draft mode
only works before decoding) and the sample's random stream (see `sampling.sample_rng`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from torchboost.data.augment import POLICIES, Policy, RandomErasing
from torchboost.data.sampling import index_of, sample_shifts
from torchboost.errors import ConfigError, suggest

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
BILINEAR = Image.Resampling.BILINEAR
AUGMENTS = ("imagenet", "flip", "shift", "none")
SIXTEEN_BIT = ("I", "I;16", "I;16L", "I;16B", "I;16N")  # "I" (32-bit) is how older Pillows open 16-bit PNGs
# What Pillow raises for an unreadable file: OSError (UnidentifiedImageError, truncated data), SyntaxError
# and ValueError (malformed headers or chunks), DecompressionBombError (absurd declared sizes).
IMAGE_ERRORS = (OSError, SyntaxError, ValueError, Image.DecompressionBombError)


def norm_coeffs(mean: Sequence[float], std: Sequence[float], device: torch.device | str | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale, shift), each C×1×1, such that x_uint8 * scale - shift == (x / 255 - mean) / std."""
    m = torch.tensor(mean, dtype=torch.float64).view(-1, 1, 1)
    s = torch.tensor(std, dtype=torch.float64).view(-1, 1, 1)
    return (1 / (255 * s)).float().to(device), (m / s).float().to(device)


def normalize_batch(x: torch.Tensor, mean: Sequence[float], std: Sequence[float],
                    dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Normalize a uint8 N×C×H×W batch on its own device: workers then ship 4× fewer bytes than float32."""
    scale, shift = norm_coeffs(mean, std, x.device)
    return x.float().mul_(scale).sub_(shift).to(dtype)  # float32 math, then cast (bf16 would lose bits)


def rrc_params(width: int, height: int, rng: np.random.Generator, scale: tuple[float, float] = (0.08, 1.0),
               ratio: tuple[float, float] = (3 / 4, 4 / 3)) -> tuple[int, int, int, int]:
    """torchvision's RandomResizedCrop.get_params: (top, left, height, width) of the crop box."""
    area = width * height
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target_area = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(log_ratio[0], log_ratio[1]))
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top = int(rng.integers(0, height - h + 1))
            left = int(rng.integers(0, width - w + 1))
            return top, left, h, w
    # Fallback: the whole image, cut to the nearest allowed aspect ratio, centred.
    in_ratio = width / height
    if in_ratio < min(ratio):
        w, h = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
        w, h = int(round(height * max(ratio))), height
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def draft_scale(region_w: float, region_h: float, out_w: int, out_h: int) -> int:
    """Largest JPEG reduction (8, 4, 2 or 1) that keeps a region_w × region_h region ≥ out_w × out_h."""
    limit = min(region_w / out_w, region_h / out_h)
    return next((s for s in (8, 4, 2) if s <= limit), 1)


def to_8bit(img: Image.Image) -> Image.Image:
    """A 16-bit grayscale image (SIXTEEN_BIT modes) as 8-bit L: value >> 8, the high byte, which maps
    0..65535 onto 0..255 monotonically and an 8-bit image stored as v·257 back to v exactly (libpng's
    strip_16, and what Pillow itself does to 16-bit RGB PNGs). Pillow's own convert("L") clips at 255."""
    return Image.fromarray((np.asarray(img).clip(0, 65535) >> 8).astype(np.uint8))


def decode(img: Image.Image, mode: str, scale: int = 1) -> tuple[Image.Image, int]:
    """Decode `img` in `mode` ("L" or "RGB"), reduced by `scale` where the format allows it (JPEG); returns
    (image, scale actually applied). Full-size coordinates map to the result by dividing by that scale."""
    w, h = img.size
    # Asking for (w // s, h // s) makes Pillow pick exactly s (it takes the largest s ≤ w // request).
    drafted = img.draft(mode, (w // scale, h // scale) if scale > 1 else None)
    applied = 1 if drafted is None else round(w / drafted[1][2])
    if img.mode in SIXTEEN_BIT:
        img = to_8bit(img)
    return (img if img.mode == mode else img.convert(mode)), applied


def translate(a: np.ndarray, dy: int, dx: int, axes: tuple[int, int] = (0, 1)) -> np.ndarray:
    """`a` moved by dy along axes[0] (down) and dx along axes[1] (right); the pixels moved in are 0."""
    out = np.zeros_like(a)
    src, dst = [slice(None)] * a.ndim, [slice(None)] * a.ndim
    for axis, d in zip(axes, (dy, dx)):
        n = a.shape[axis]
        d = max(-n, min(n, d))  # a shift past the edge leaves nothing
        src[axis], dst[axis] = slice(max(0, -d), n - max(0, d)), slice(max(0, d), n - max(0, -d))
    out[tuple(dst)] = a[tuple(src)]
    return out


def resize_region(img: Image.Image, box: tuple[float, float, float, float], size: tuple[int, int]
                  ) -> np.ndarray:
    """Crop then resize a (possibly fractional) box to size (w, h), like torchvision's crop + resize, as an
    H×W(×C) uint8 array: cropping first keeps pixels outside the box out of the filter."""
    left, top, right, bottom = box
    crop = (int(left), int(top), math.ceil(right), math.ceil(bottom))
    region = img.crop(crop)
    if crop == box:  # always so without a draft reduction (e.g. ImageNet's 500×375 at 224)
        return resize_uint8(np.array(region), size)  # a writable copy: torch warns on read-only arrays
    # Torch's kernel has no sub-pixel offset, so a fractional box stays with Pillow's resize box.
    sub = (left - crop[0], top - crop[1], right - crop[0], bottom - crop[1])
    return np.asarray(region.resize(size, BILINEAR, box=sub))


def resize_uint8(a: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """Antialiased bilinear resize of an H×W(×C) uint8 array to size (w, h) with torch's uint8 kernel: a port
    of Pillow's (within 1/255), faster with AVX2, and serial per image (no OpenMP region)."""
    x = torch.from_numpy(a if a.ndim == 3 else a[..., None]).permute(2, 0, 1)[None]  # channels-last view
    y = F.interpolate(x, size=(size[1], size[0]), mode="bilinear", antialias=True, align_corners=False)
    return y[0].permute(1, 2, 0).numpy()


class ImageTransform:
    """Base of the transforms: output size, normalization and the uint8 → tensor step, with the optional
    training steps on the crop (`policy`, `erasing`: see `finish`)."""

    policy: Policy | None = None  # RandAugment / TrivialAugmentWide on the crop
    erasing: RandomErasing | None = None  # random erasing of the uint8 crop

    def __init__(self, size: int, mean: Sequence[float], std: Sequence[float], uint8: bool) -> None:
        if len(mean) != len(std) or len(mean) not in (1, 3):
            raise ConfigError(f"mean {tuple(mean)} and std {tuple(std)} must both have 1 or 3 values",
                              "give one value per image channel")
        self.size, self.mean, self.std, self.uint8 = size, tuple(mean), tuple(std), uint8
        self.mode = "L" if len(mean) == 1 else "RGB"
        self._scale, self._shift = norm_coeffs(mean, std)

    @property
    def max_side(self) -> int:
        """The largest side (pixels) an image is resized to on its way to the output."""
        return self.size

    def to_tensor(self, a: np.ndarray, flip: bool = False) -> torch.Tensor:
        """C×H×W uint8 (uint8=True) or normalized float32 from an H×W(×C) uint8 array, mirrored if `flip`."""
        # numpy: its HWC -> CHW copy is ~2x faster than torch's permute().contiguous() on uint8, and it never
        # opens an OpenMP region (which waits for a free core on a busy machine; see tensors.py). The flip
        # rides along in the same copy as a negative stride.
        a = a if a.ndim == 3 else a[..., None]
        x = np.array((a[:, ::-1] if flip else a).transpose(2, 0, 1), order="C")
        if not self.uint8:
            x = x.astype(np.float32)
            x *= self._scale.numpy()
            x -= self._shift.numpy()
        return torch.from_numpy(x)

    def finish(self, a: np.ndarray, rng: np.random.Generator | None, flip: bool = False) -> torch.Tensor:
        """The crop's last steps, in torchvision's (and timm's) order: flip, the policy, erasing, then the
        tensor (normalized unless uint8). Without a policy or erasing: `to_tensor(a, flip)`, nothing drawn."""
        if self.policy is None and self.erasing is None:
            return self.to_tensor(a, flip)
        rng = np.random.default_rng() if rng is None else rng
        a = a[:, ::-1] if flip else a
        if self.policy is not None:
            a = self.policy.on_array(np.ascontiguousarray(a), rng)
        if self.erasing is not None:
            a = self.erasing(a, rng)
        return self.to_tensor(a)


class TrainTransform(ImageTransform):
    """RandomResizedCrop(size, scale, ratio) + horizontal flip + normalize, drawn from the sample's rng."""

    def __init__(self, size: int, mean: Sequence[float], std: Sequence[float],
                 scale: tuple[float, float] = (0.08, 1.0), ratio: tuple[float, float] = (3 / 4, 4 / 3),
                 flip_p: float = 0.5, uint8: bool = False) -> None:
        super().__init__(size, mean, std, uint8)
        self.scale, self.ratio, self.flip_p = scale, ratio, flip_p

    def draw(self, width: int, height: int, rng: np.random.Generator) -> tuple[tuple[int, int, int, int], bool]:
        """The crop box (top, left, height, width) and flip of one sample, from its stream: the one draw, which
        the device decoder (`device_decode`) makes too, so both paths crop alike."""
        box = rrc_params(width, height, rng, self.scale, self.ratio)
        return box, rng.random() < self.flip_p  # the flip after the crop, like torchvision's Compose order

    def __call__(self, img: Image.Image, rng: np.random.Generator | None = None) -> torch.Tensor:
        rng = np.random.default_rng() if rng is None else rng
        (top, left, h, w), flip = self.draw(img.width, img.height, rng)
        img, s = decode(img, self.mode, draft_scale(w, h, self.size, self.size))
        out = resize_region(img, (left / s, top / s, (left + w) / s, (top + h) / s), (self.size, self.size))
        return self.finish(out, rng, flip)


MAX_ASPECT = 64  # longest side over shortest an image may have (panoramas are ~4:1)


class EvalTransform(ImageTransform):
    """Resize the shorter side to int(size / crop_pct), centre-crop size × size, normalize."""

    def __init__(self, size: int, mean: Sequence[float], std: Sequence[float], crop_pct: float = 0.875,
                 uint8: bool = False) -> None:
        if not 0 < crop_pct <= 1:
            raise ConfigError(f"crop_pct {crop_pct} is outside (0, 1]", "use e.g. data.crop_pct=0.875")
        super().__init__(size, mean, std, uint8)
        self.resize = int(size / crop_pct)

    def geometry(self, width: int, height: int) -> tuple[tuple[int, int], tuple[int, int, int, int]]:
        """(resized width, height) and the centre-crop box (left, top, right, bottom), as torchvision. An image
        so long that its resized long side would pass MAX_ASPECT × the resize is refused (ValueError, as a
        corrupt image): a 99,000,000×1 strip would otherwise ask for gigabytes here."""
        short, long = min(width, height), max(width, height)
        if long > MAX_ASPECT * short:
            raise ValueError(f"{width}×{height} pixels is longer than {MAX_ASPECT}:1, not a picture to classify")
        new_long = int(self.resize * long / short)
        nw, nh = (self.resize, new_long) if width <= height else (new_long, self.resize)
        left, top = int(round((nw - self.size) / 2.0)), int(round((nh - self.size) / 2.0))
        return (nw, nh), (left, top, left + self.size, top + self.size)

    @property
    def max_side(self) -> int:
        """The shorter side after the resize (size / crop_pct); the longer one follows the image's aspect."""
        return self.resize

    def describe(self) -> str:
        """The geometry in words, for the lines that name what an accuracy was computed on."""
        crop = "the centre" if self.resize == self.size else "a centre crop of"
        return f"shorter side resized to {self.resize} px, {crop} {self.size}×{self.size}"

    def crop(self, img: Image.Image) -> np.ndarray:
        """The resized and centre-cropped image as an H×W(×C) uint8 array."""
        (nw, nh), (left, top, right, bottom) = self.geometry(img.width, img.height)
        full_w, full_h = img.size
        img, s = decode(img, self.mode, draft_scale(full_w, full_h, nw, nh))
        return resize_region(img, (0, 0, full_w / s, full_h / s), (nw, nh))[top:bottom, left:right]

    def __call__(self, img: Image.Image, rng: np.random.Generator | None = None) -> torch.Tensor:
        return self.finish(self.crop(img), rng)


class FlipTransform(EvalTransform):
    """The evaluation resize + centre crop, then a horizontal flip with probability flip_p, + normalize."""

    def __init__(self, size: int, mean: Sequence[float], std: Sequence[float], crop_pct: float = 0.875,
                 flip_p: float = 0.5, uint8: bool = False) -> None:
        super().__init__(size, mean, std, crop_pct, uint8)
        self.flip_p = flip_p

    def draw_flip(self, rng: np.random.Generator) -> bool:
        """The flip of one sample, from its stream (the device decoder draws it with this too)."""
        return rng.random() < self.flip_p

    def __call__(self, img: Image.Image, rng: np.random.Generator | None = None) -> torch.Tensor:
        rng = np.random.default_rng() if rng is None else rng
        return self.finish(self.crop(img), rng, self.draw_flip(rng))


class ShiftTransform(ImageTransform):
    """The evaluation geometry at crop_pct 1 (shorter side resized to size, centre crop: a square image
    whole), translated by (dy, dx) drawn uniformly from [-shift, shift]² (zeros move in: the background of
    MNIST-like images), normalize. The same draw as `TensorImageDataset(shift=...)` (`sampling.sample_shifts`),
    so a folder of exported digits is augmented identically; at shift 0 it is EvalTransform(size, crop_pct=1)."""

    def __init__(self, size: int, mean: Sequence[float], std: Sequence[float], shift: int,
                 uint8: bool = False) -> None:
        if shift < 1:
            raise ConfigError(f"the shift augmentation needs a shift of at least 1 pixel, got {shift}",
                              "set data.random_shift to a pixel count such as 2, or use augment 'none'")
        super().__init__(size, mean, std, uint8)
        self.shift = shift
        self.whole = EvalTransform(size, mean, std, 1.0, uint8)  # what evaluation sees: one geometry for both

    def __call__(self, img: Image.Image, rng: np.random.Generator | None = None) -> torch.Tensor:
        rng = np.random.default_rng() if rng is None else rng
        dy, dx = sample_shifts([index_of(rng)], self.shift)[0]
        return self.finish(translate(self.whole.crop(img), int(dy), int(dx)), rng)


def train_transform(size: int, mean: Sequence[float], std: Sequence[float], *, uint8: bool = False,
                    augment: str = "imagenet", rrc_scale: tuple[float, float] = (0.08, 1.0), shift: int = 0,
                    crop_pct: float = 0.875, ratio: tuple[float, float] = (3 / 4, 4 / 3), flip_p: float = 0.5,
                    scale: tuple[float, float] | None = None, auto_augment: str = "none", randaugment_ops: int = 2,
                    randaugment_magnitude: int = 9, random_erasing: float = 0.0) -> ImageTransform:
    """The training transform of an image folder (see AUGMENTS and the module docstring): "imagenet" uses
    rrc_scale and ratio, "flip" and "none" crop_pct, "shift" shift; flip_p is the flip probability.
    `scale` is the former name of rrc_scale. Then `auto_augment` (POLICIES: RandAugment with
    randaugment_ops ops at bin randaugment_magnitude of 31, or TrivialAugmentWide) and, with probability
    `random_erasing`, torchvision's RandomErasing, filled with the mean colour."""
    if auto_augment not in POLICIES:
        raise ConfigError(f"unknown augmentation policy {auto_augment!r}", suggest(auto_augment, POLICIES))
    t = _geometry_transform(size, mean, std, uint8, augment, tuple(rrc_scale if scale is None else scale), shift,
                            crop_pct, ratio, flip_p)
    if auto_augment != "none":
        t.policy = Policy(auto_augment, randaugment_ops, randaugment_magnitude)
    if random_erasing > 0:
        t.erasing = RandomErasing(random_erasing, fill=[round(m * 255) for m in mean])
    return t


def _geometry_transform(size: int, mean: Sequence[float], std: Sequence[float], uint8: bool, augment: str,
                        rrc_scale: tuple[float, float], shift: int, crop_pct: float, ratio: tuple[float, float],
                        flip_p: float) -> ImageTransform:
    if not 0 < rrc_scale[0] <= rrc_scale[1] <= 1:
        raise ConfigError(f"RandomResizedCrop scale {rrc_scale} is not 0 < min <= max <= 1",
                          "use e.g. data.rrc_scale=[0.08, 1.0]")
    if augment not in AUGMENTS:
        raise ConfigError(f"unknown augmentation {augment!r}", suggest(augment, AUGMENTS))
    if shift and augment != "shift":
        raise ConfigError(f"a shift of {shift} px only applies to the 'shift' augmentation, not {augment!r}",
                          "set augment to 'shift' or the shift to 0")
    if augment == "imagenet":
        return TrainTransform(size, mean, std, rrc_scale, ratio, flip_p, uint8)
    if augment == "flip":
        return FlipTransform(size, mean, std, crop_pct, flip_p, uint8)
    if augment == "shift":
        return ShiftTransform(size, mean, std, shift, uint8)
    return EvalTransform(size, mean, std, crop_pct, uint8)


def eval_transform(size: int, mean: Sequence[float], std: Sequence[float], crop_pct: float = 0.875,
                   **kw) -> EvalTransform:
    """Resize shorter side to size / crop_pct, centre crop, normalize (see EvalTransform)."""
    return EvalTransform(size, mean, std, crop_pct, **kw)
