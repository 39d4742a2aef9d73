"""ImageNet-style folders: root/<class>/**/<image>; class index = rank of the folder name in sorted order.

Corrupt images are found lazily, when a sample is loaded (scanning a million files up front would cost
minutes). By default the first one raises a DataError naming the file. With skip_corrupt=True a training
set replaces it by the next readable sample in index order (wrapping around): batches stay full and shapes
stay static, which BatchNorm, DDP and compiled steps expect. An evaluation set (drop_corrupt=True) returns
None instead, and `drop_missing_collate` leaves it out of the batch, so metrics cover exactly the readable
images. Corrupt files are marked in a table shared with the DataLoader's worker processes: `skipped` (and
`loader_skipped(loader)`) counts the distinct files met so far, each named once in a `note:` line on stderr.
Warnings Pillow or torch raise while decoding become such a line too (once per message and process), not
Python warnings pointing at a line of the loader's source.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import torch
from PIL import Image
from torch.utils.data import Dataset

from torchboost.data.device_decode import DeviceDecode, collate, read_encoded
from torchboost.data.sampling import sample_rng
from torchboost.data.transforms import IMAGE_ERRORS, ImageTransform
from torchboost.errors import DataError, printable
from torchboost.fileio import open_regular, within

IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp")
# Pillow modes of one-channel images (bilevel, 8/16/32-bit gray, gray + alpha); palette images count as colour.
GRAY_MODES = ("1", "L", "LA", "La", "I", "I;16", "I;16L", "I;16B", "I;16N", "F")
MAX_SIDE = 8192  # a transform working at more pixels per side is a typo (one image would take > 200 MB)
MAX_PIXELS = 100_000_000  # checked from the header, before decoding: a 1 kB PNG can claim 10^10 pixels
MAX_IMAGE_SIDE = 32_768  # and each side: a 99,000,000×1 PNG is under MAX_PIXELS, yet no photo is that long


@contextmanager
def open_image(path: str | Path | BinaryIO) -> Iterator[Image.Image]:
    """Image.open of a file (only a regular one: a FIFO named x.png must not block the loader) or of bytes
    in memory, refusing (ValueError, one of IMAGE_ERRORS) a size over MAX_PIXELS before any decoding."""
    with (nullcontext(path) if hasattr(path, "read") else open_regular(path)) as f, Image.open(f) as img:
        w, h = img.size
        if w * h > MAX_PIXELS:
            raise ValueError(f"{w}×{h} pixels is over the {MAX_PIXELS:,}-pixel limit")
        if max(w, h) > MAX_IMAGE_SIDE:
            raise ValueError(f"{w}×{h} pixels has a side over the {MAX_IMAGE_SIDE:,}-pixel limit")
        yield img


def check_transform(transform: Callable[..., Any] | None) -> None:
    """Refuse a transform that would resize images past MAX_SIDE pixels per side (a typo, not a plan)."""
    if isinstance(transform, (ImageTransform, DeviceDecode)) and transform.max_side > MAX_SIDE:
        raise DataError(f"the transform resizes images to {transform.max_side} px per side (limit {MAX_SIDE})",
                        "use an image size such as 224 (and a crop_pct near 0.875)")


def find_classes(root: str | Path) -> list[str]:
    """Sorted class folder names of an image folder; hidden folders are ignored."""
    root = Path(root)
    layout = f"put each class's images in its own sub-folder: {root}/<class>/<image>.jpg"
    if not root.exists():
        raise DataError(f"data folder {root} does not exist", f"check the path; {layout}")
    if not root.is_dir():
        raise DataError(f"data path {root} is not a folder", layout)
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith("."))
    if not classes:
        raise DataError(f"no class folders in {root}", layout)
    return classes


def class_files(folder: Path) -> list[str]:
    """Sorted image paths under one class folder (recursively, following links, each real folder once: a
    link back into the class must not multiply it); at least one. A linked folder that holds other classes'
    images (the split folder or one above it, or another class folder of the split) is refused: following
    it would give those images this folder's label."""
    files, seen = [], set()
    top, split = os.path.realpath(folder), os.path.realpath(Path(folder).parent)
    for d, dirs, names in os.walk(folder, followlinks=True):
        real = os.path.realpath(d)
        if real in seen:
            dirs[:] = []
            continue
        if not within(real, top) and (within(split, real) or within(real, split)):
            raise DataError(f"{d} in class folder {folder} links to {real}, which holds other classes' images "
                            f"(they would be labelled {Path(folder).name})",
                            "remove the link, or link to a folder outside the data set")
        seen.add(real)
        files += [os.path.join(d, f) for f in names if f.lower().endswith(IMG_EXTENSIONS)]
    files.sort()
    if not files:
        raise DataError(f"no images in class folder {folder}",
                        "put .jpg/.jpeg/.png/.bmp/.webp files in it or remove the folder")
    return files


def find_samples(root: str | Path) -> tuple[list[str], list[tuple[str, int]]]:
    """(sorted class names, [(image path, class index)]) of an image folder; hidden folders are ignored."""
    classes = find_classes(root)
    samples = [(f, index) for index, name in enumerate(classes) for f in class_files(Path(root) / name)]
    return classes, samples


@dataclass(frozen=True)
class FolderSample:
    """What a sample of a folder's images looks like (headers only, a few files from every class)."""

    gray: int  # images in one-channel modes (GRAY_MODES)
    color: int
    largest_side: int

    @property
    def channels(self) -> int:
        """The majority's channels (ties: colour, which keeps the information)."""
        return 1 if self.gray > self.color else 3


def sample_folder(root: str | Path, per_class: int = 4) -> FolderSample:
    """Read the headers of up to `per_class` images of every class, spread over each class's files (not just
    the first file, which decides nothing about the rest)."""
    gray = color = side = 0
    for name in find_classes(root):
        files = class_files(Path(root) / name)
        for path in files[:: max(1, len(files) // per_class)][:per_class]:
            try:
                with open_image(path) as img:
                    gray, color = gray + (img.mode in GRAY_MODES), color + (img.mode not in GRAY_MODES)
                    side = max(side, *img.size)
            except IMAGE_ERRORS as e:
                raise DataError(f"corrupt image {path} ({type(e).__name__}: {e})",
                                "replace or delete it, or set data.skip_corrupt=true") from None
    return FolderSample(gray, color, side)


def note(message: str) -> None:
    """One `note:` line on stderr (file names in it made printable): a loader's worker processes have no log
    of the run to write to."""
    print(f"note: {printable(message)}", file=sys.stderr, flush=True)


_NOTED: set[str] = set()  # decoding warnings this process has noted (each message once, as Python would)


def _note_warnings(path: str, caught: list[warnings.WarningMessage]) -> None:
    for w in caught:
        text = str(w.message)
        if text not in _NOTED:
            _NOTED.add(text)
            note(f"{path}: {text}")


def loader_skipped(loader: Any) -> int:
    """Corrupt images a loader's data set skipped so far, counted in its worker processes too (0 for data
    sets that never skip)."""
    return int(getattr(getattr(loader, "dataset", None), "skipped", 0))


def drop_missing_collate(batch: list[Any]) -> Any:
    """default_collate without the samples a dataset dropped (None); None when none is left. Samples of a
    DeviceDecode transform become a DeviceBatch (`device_decode.collate`)."""
    kept = [b for b in batch if b is not None]
    return collate(kept) if kept else None


def read_image(path: str | Path, transform: Callable[..., Any]) -> Any:
    """One image file through an evaluation transform; an unreadable file raises a one-line DataError."""
    try:
        with open_image(path) as img:
            return transform(img)
    except FileNotFoundError:
        raise DataError(f"image {path} does not exist", "check the path") from None
    except IMAGE_ERRORS as e:
        raise DataError(f"corrupt image {path} ({type(e).__name__}: {e})", "pass a readable image file") from None


class ImageFolder(Dataset):
    """Images of `root`'s class folders, returned as (transform(image, rng), class index).

    `transform(img, rng)` receives the opened, not yet decoded image (so it can pick a JPEG draft size) and
    the sample's random stream; transform=None returns the decoded PIL image. A `DeviceDecode` transform gets
    the file's bytes too and returns them with the crop, for the device to decode (`device_decode`).
    """

    def __init__(self, root: str | Path, transform: Callable[..., Any] | None, skip_corrupt: bool = False,
                 drop_corrupt: bool = False) -> None:
        check_transform(transform)
        self.root, self.transform, self.skip_corrupt = Path(root), transform, skip_corrupt
        self.drop_corrupt = drop_corrupt  # with skip_corrupt: None instead of a substitute (evaluation)
        self.classes, self.samples = find_samples(root)
        # 1 = unreadable. Shared memory, so marks made in worker processes reach the main process; setting
        # a byte to 1 is idempotent, so concurrent writers need no lock.
        self._corrupt = torch.zeros(len(self.samples), dtype=torch.uint8).share_memory_()

    @property
    def skipped(self) -> int:
        """Distinct corrupt files met so far (replaced or dropped), in the main process and all workers."""
        return int(self._corrupt.sum())

    @property
    def corrupt_files(self) -> list[str]:
        """Paths of the corrupt files met so far, in sample order."""
        return [self.samples[k][0] for k in self._corrupt.nonzero().flatten().tolist()]

    def __len__(self) -> int:
        return len(self.samples)

    def _load(self, path: str, index: int) -> Any:
        with warnings.catch_warnings(record=True) as caught:  # Pillow's/torch's, as one note line each
            warnings.simplefilter("always")
            if isinstance(self.transform, DeviceDecode):
                with open_regular(path) as f:
                    data = read_encoded(f)
                    with open_image(f) as img:
                        out = self.transform.encode(img, sample_rng(index), data, path)
            else:
                with open_image(path) as img:
                    if self.transform is None:
                        img.load()
                        out = img
                    else:
                        out = self.transform(img, sample_rng(index))
        _note_warnings(path, caught)  # an image that fails says why in its own note instead
        return out

    def __getitem__(self, index: int) -> tuple[Any, int] | None:
        n = len(self.samples)
        for offset in range(n if self.skip_corrupt else 1):
            k = (int(index) + offset) % n
            path, label = self.samples[k]
            try:
                return self._load(path, index), label  # a substitute keeps the original's random draw
            except IMAGE_ERRORS as e:
                if not self.skip_corrupt:
                    raise DataError(f"corrupt image {path} ({type(e).__name__}: {e})",
                                    "replace or delete it, or set data.skip_corrupt=true to skip such images"
                                    ) from None
                if not self._corrupt[k]:
                    self._corrupt[k] = 1
                    note(f"skipping corrupt image {path} ({type(e).__name__}: {e})")
                if self.drop_corrupt:
                    return None
        raise DataError(f"no readable image in {self.root}", "every image failed to decode; check the files")
