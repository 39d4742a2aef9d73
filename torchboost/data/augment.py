"""Photo augmentation policies and random erasing, with torchvision's definitions, on Pillow.

RandAugment (num_ops=2, magnitude=9 of 31 bins) and TrivialAugmentWide (one op, a random bin of 31, the
"wide" ranges) are torchvision's `transforms.autoaugment` classes: the same 14 operations in the same order,
the same magnitude tables (float32 `torch.linspace`, as torchvision computes them), the same signs (a signed
op is negated with probability 1/2), nearest-neighbour geometry with a black fill (fill=None), and for a PIL
image the same Pillow calls torchvision's functional API makes (`Image.transform` with torchvision's inverse
affine matrix, `Image.rotate`, `ImageEnhance`, `ImageOps`). What differs is where the randomness comes from:
the sample's numpy stream (`sampling.sample_rng`), not torch's global RNG, so a run is reproducible per seed
and resumes mid-epoch exactly.

`RandomErasing` is torchvision's (p=0.5, scale=(0.02, 0.33), ratio=(0.3, 3.3), value=0) on the uint8 crop,
before normalisation: the box is filled with the normalisation mean as a uint8 colour, which normalises to
(nearly) 0, torchvision's value=0 after Normalize. One code path, so a batch normalised on the device
(`data.normalize_on_device`) is erased exactly as one normalised in the loader.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
from PIL import Image, ImageEnhance, ImageOps

from torchboost.errors import ConfigError, suggest

NEAREST = Image.Resampling.NEAREST
NUM_BINS = 31  # torchvision's num_magnitude_bins for both policies
OPS = ("Identity", "ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate", "Brightness", "Color", "Contrast",
       "Sharpness", "Posterize", "Solarize", "AutoContrast", "Equalize")  # torchvision's order
SIGNED = frozenset(OPS[1:10])  # geometry and enhancements go both ways; the rest have one direction
POLICIES = ("none", "randaugment", "trivialaugment")


def magnitudes(policy: str, bins: int = NUM_BINS, height: int = 224, width: int = 224) -> dict[str, list[float]]:
    """torchvision's `_augmentation_space` of a policy: each op's magnitude per bin ([] for the ops without
    one), computed as torchvision does (float32 linspace; Posterize's bits rounded half to even)."""
    wide = policy == "trivialaugment"
    lin = lambda end: torch.linspace(0.0, end, bins).tolist()  # noqa: E731
    shear, enhance = lin(0.99 if wide else 0.3), lin(0.99 if wide else 0.9)
    posterize = (8 - (torch.arange(bins) / ((bins - 1) / (6 if wide else 4))).round().int()).tolist()
    return {"Identity": [], "ShearX": shear, "ShearY": shear,
            "TranslateX": lin(32.0 if wide else 150.0 / 331.0 * width),
            "TranslateY": lin(32.0 if wide else 150.0 / 331.0 * height),
            "Rotate": lin(135.0 if wide else 30.0), "Brightness": enhance, "Color": enhance, "Contrast": enhance,
            "Sharpness": enhance, "Posterize": [float(b) for b in posterize],
            "Solarize": torch.linspace(255.0, 0.0, bins).tolist(), "AutoContrast": [], "Equalize": []}


def inverse_affine(center: Sequence[float], angle: float, translate: Sequence[float], scale: float,
                   shear: Sequence[float]) -> list[float]:
    """torchvision's `_get_inverse_affine_matrix` (inverted=True): the output -> input matrix Pillow takes."""
    rot, sx, sy = math.radians(angle), math.radians(shear[0]), math.radians(shear[1])
    cx, cy = center
    tx, ty = translate
    a = math.cos(rot - sy) / math.cos(sy)
    b = -math.cos(rot - sy) * math.tan(sx) / math.cos(sy) - math.sin(rot)
    c = math.sin(rot - sy) / math.cos(sy)
    d = -math.sin(rot - sy) * math.tan(sx) / math.cos(sy) + math.cos(rot)
    m = [x / scale for x in (d, -b, 0.0, -c, a, 0.0)]
    m[2] += m[0] * (-cx - tx) + m[1] * (-cy - ty)
    m[5] += m[3] * (-cx - tx) + m[4] * (-cy - ty)
    m[2] += cx
    m[5] += cy
    return m


def _affine(img: Image.Image, fill: int | tuple, translate=(0, 0), shear=(0.0, 0.0), center=None) -> Image.Image:
    """torchvision's F.affine on a PIL image (angle 0, scale 1): its centre default and its matrix."""
    center = [img.width * 0.5, img.height * 0.5] if center is None else center
    matrix = inverse_affine(center, 0.0, translate, 1.0, shear)
    return img.transform(img.size, Image.Transform.AFFINE, matrix, NEAREST, fillcolor=fill)


def apply_op(img: Image.Image, name: str, magnitude: float) -> Image.Image:
    """torchvision's `_apply_op` for a PIL image, nearest-neighbour, fill 0."""
    fill = (0,) * len(img.getbands()) if len(img.getbands()) > 1 else 0
    if name in ("ShearX", "ShearY"):  # torchvision: shear angle atan(magnitude) about the top-left corner
        angle = math.degrees(math.atan(magnitude))
        return _affine(img, fill, shear=(angle, 0.0) if name == "ShearX" else (0.0, angle), center=[0, 0])
    if name in ("TranslateX", "TranslateY"):
        return _affine(img, fill, translate=(int(magnitude), 0) if name == "TranslateX" else (0, int(magnitude)))
    if name == "Rotate":
        return img.rotate(magnitude, NEAREST, expand=False, center=None, fillcolor=fill)
    enhancer = {"Brightness": ImageEnhance.Brightness, "Color": ImageEnhance.Color,
                "Contrast": ImageEnhance.Contrast, "Sharpness": ImageEnhance.Sharpness}.get(name)
    if enhancer is not None:
        return enhancer(img).enhance(1.0 + magnitude)
    if name == "Posterize":
        return ImageOps.posterize(img, int(magnitude))
    if name == "Solarize":
        return ImageOps.solarize(img, magnitude)
    if name == "AutoContrast":
        return ImageOps.autocontrast(img)
    if name == "Equalize":
        return ImageOps.equalize(img)
    if name == "Identity":
        return img
    raise ValueError(f"unknown augmentation op {name!r}")


class Policy:
    """RandAugment (`num_ops` ops at bin `magnitude`) or TrivialAugmentWide (one op at a random bin), called
    as `policy(img, rng)` on a PIL image; `draws(rng, height, width)` are the (op, magnitude) pairs it
    applies, drawn in torchvision's order: op, [bin (TrivialAugment)], [sign (signed ops)]."""

    def __init__(self, name: str, num_ops: int = 2, magnitude: int = 9, bins: int = NUM_BINS) -> None:
        if name not in POLICIES[1:]:
            raise ConfigError(f"unknown augmentation policy {name!r}", suggest(name, POLICIES[1:]))
        if name == "randaugment" and not (num_ops >= 1 and 0 <= magnitude < bins):
            raise ConfigError(f"RandAugment needs num_ops >= 1 and 0 <= magnitude < {bins}, got {num_ops} and "
                              f"{magnitude}", "use e.g. data.randaugment_ops=2, data.randaugment_magnitude=9")
        self.name, self.num_ops, self.magnitude, self.bins = name, num_ops, magnitude, bins
        self._spaces: dict[tuple[int, int], dict[str, list[float]]] = {}

    def space(self, height: int, width: int) -> dict[str, list[float]]:
        key = (height, width)
        if key not in self._spaces:  # one image size per transform: computed once
            self._spaces[key] = magnitudes(self.name, self.bins, height, width)
        return self._spaces[key]

    def draws(self, rng: np.random.Generator, height: int, width: int) -> list[tuple[str, float]]:
        space, out = self.space(height, width), []
        for _ in range(1 if self.name == "trivialaugment" else self.num_ops):
            name = OPS[int(rng.integers(len(OPS)))]
            table = space[name]
            if not table:
                magnitude = 0.0
            elif self.name == "trivialaugment":
                magnitude = table[int(rng.integers(len(table)))]
            else:
                magnitude = table[self.magnitude]
            if name in SIGNED and rng.integers(2):
                magnitude = -magnitude
            out.append((name, magnitude))
        return out

    def __call__(self, img: Image.Image, rng: np.random.Generator) -> Image.Image:
        for name, magnitude in self.draws(rng, img.height, img.width):
            img = apply_op(img, name, magnitude)
        return img

    def on_array(self, a: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """The policy on an H×W(×C) uint8 array (a one-channel H×W×1 array stays so)."""
        img = Image.fromarray(a[..., 0] if a.ndim == 3 and a.shape[2] == 1 else a)
        out = np.asarray(self(img, rng))
        return out.reshape(a.shape)

    def __repr__(self) -> str:
        extra = f", num_ops={self.num_ops}, magnitude={self.magnitude}" if self.name == "randaugment" else ""
        return f"Policy({self.name!r}{extra})"


class RandomErasing:
    """torchvision's RandomErasing on an H×W(×C) uint8 array: with probability p, a box of scale × the area
    and aspect (h / w) in ratio (log-uniform), up to 10 tries to fit, filled with `fill` (one value per channel)."""

    def __init__(self, p: float = 0.5, scale: tuple[float, float] = (0.02, 0.33),
                 ratio: tuple[float, float] = (0.3, 3.3), fill: Sequence[int] = (0,)) -> None:
        if not 0 <= p <= 1 or not 0 < scale[0] <= scale[1] <= 1 or not 0 < ratio[0] <= ratio[1]:
            raise ConfigError(f"random erasing p={p}, scale={scale}, ratio={ratio} are out of range",
                              "use a probability in [0, 1] such as data.random_erasing=0.25")
        self.p, self.scale, self.ratio, self.fill = p, tuple(scale), tuple(ratio), tuple(int(v) for v in fill)

    def box(self, height: int, width: int, rng: np.random.Generator) -> tuple[int, int, int, int] | None:
        """torchvision's get_params: (top, left, h, w) of the box, None when 10 tries found none."""
        area, log_ratio = height * width, (math.log(self.ratio[0]), math.log(self.ratio[1]))
        for _ in range(10):
            erase_area = area * rng.uniform(self.scale[0], self.scale[1])
            aspect = math.exp(rng.uniform(log_ratio[0], log_ratio[1]))
            h = int(round(math.sqrt(erase_area * aspect)))
            w = int(round(math.sqrt(erase_area / aspect)))
            if not (h < height and w < width):
                continue
            top = int(rng.integers(0, height - h + 1))
            left = int(rng.integers(0, width - w + 1))
            return top, left, h, w
        return None

    def __call__(self, a: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        if not rng.random() < self.p:
            return a
        box = self.box(a.shape[0], a.shape[1], rng)
        if box is None:
            return a
        top, left, h, w = box
        a = np.array(a)  # a writable copy (Pillow's arrays are read-only)
        a[top:top + h, left:left + w] = self.fill if a.ndim == 3 else self.fill[0]
        return a

    def __repr__(self) -> str:
        return f"RandomErasing(p={self.p}, scale={self.scale}, ratio={self.ratio}, fill={self.fill})"
