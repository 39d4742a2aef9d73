"""ImageNet-style folders: root/<class>/**/<image>; class index = rank of the folder name in sorted order.

Corrupt images are found lazily, when a sample is loaded (scanning a million files up front would cost
minutes). By default the first one raises a DataError naming the file. With skip_corrupt=True a training
set replaces it by the next readable sample in index order (wrapping around): batches stay full and shapes
stay static, which BatchNorm, DDP and compiled steps expect. An evaluation set (drop_corrupt=True) returns
None instead, and `drop_missing_collate` leaves it out of the batch, so metrics cover exactly the readable
images. `skipped` counts the corrupt samples met in every process; each file is warned about once per process.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from PIL import Image
from torch.utils.data import Dataset, default_collate, get_worker_info

from torchboost.data.sampling import sample_rng
from torchboost.errors import DataError

IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp")
# What Pillow raises for an unreadable file: OSError (UnidentifiedImageError, truncated data), SyntaxError
# and ValueError (malformed headers or chunks), DecompressionBombError (absurd declared sizes).
IMAGE_ERRORS = (OSError, SyntaxError, ValueError, Image.DecompressionBombError)
_SLOTS = 257  # skip counters: slot 0 for the main process, one per worker id, so no two writers race


def find_samples(root: str | Path) -> tuple[list[str], list[tuple[str, int]]]:
    """(sorted class names, [(image path, class index)]) of an image folder; hidden folders are ignored."""
    root = Path(root)
    layout = f"put each class's images in its own sub-folder: {root}/<class>/<image>.jpg"
    if not root.exists():
        raise DataError(f"data folder {root} does not exist", f"check the path; {layout}")
    if not root.is_dir():
        raise DataError(f"data path {root} is not a folder", layout)
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith("."))
    if not classes:
        raise DataError(f"no class folders in {root}", layout)
    samples: list[tuple[str, int]] = []
    for index, name in enumerate(classes):
        files = sorted(os.path.join(d, f) for d, _, names in os.walk(root / name, followlinks=True)
                       for f in names if f.lower().endswith(IMG_EXTENSIONS))
        if not files:
            raise DataError(f"no images in class folder {root / name}",
                            "put .jpg/.jpeg/.png/.bmp/.webp files in it or remove the folder")
        samples += [(f, index) for f in files]
    return classes, samples


def drop_missing_collate(batch: list[Any]) -> Any:
    """default_collate without the samples a dataset dropped (None); None when none is left."""
    kept = [b for b in batch if b is not None]
    return default_collate(kept) if kept else None


def read_image(path: str | Path, transform: Callable[..., Any]) -> Any:
    """One image file through an evaluation transform; an unreadable file raises a one-line DataError."""
    try:
        with Image.open(path) as img:
            return transform(img)
    except FileNotFoundError:
        raise DataError(f"image {path} does not exist", "check the path") from None
    except IMAGE_ERRORS as e:
        raise DataError(f"corrupt image {path} ({type(e).__name__}: {e})", "pass a readable image file") from None


class ImageFolder(Dataset):
    """Images of `root`'s class folders, returned as (transform(image, rng), class index).

    `transform(img, rng)` receives the opened, not yet decoded image (so it can pick a JPEG draft size) and
    the sample's random stream; transform=None returns the decoded PIL image.
    """

    def __init__(self, root: str | Path, transform: Callable[..., Any] | None, skip_corrupt: bool = False,
                 drop_corrupt: bool = False) -> None:
        self.root, self.transform, self.skip_corrupt = Path(root), transform, skip_corrupt
        self.drop_corrupt = drop_corrupt  # with skip_corrupt: None instead of a substitute (evaluation)
        self.classes, self.samples = find_samples(root)
        self._skipped = torch.zeros(_SLOTS, dtype=torch.int64).share_memory_()  # seen by every worker

    @property
    def skipped(self) -> int:
        """Corrupt samples replaced or dropped so far, summed over the main process and all workers."""
        return int(self._skipped.sum())

    def __len__(self) -> int:
        return len(self.samples)

    def _load(self, path: str, index: int) -> Any:
        with Image.open(path) as img:
            if self.transform is None:
                img.load()
                return img
            return self.transform(img, sample_rng(index))

    def __getitem__(self, index: int) -> tuple[Any, int] | None:
        n = len(self.samples)
        for offset in range(n if self.skip_corrupt else 1):
            path, label = self.samples[(int(index) + offset) % n]
            try:
                return self._load(path, index), label  # a substitute keeps the original's random draw
            except IMAGE_ERRORS as e:
                if not self.skip_corrupt:
                    raise DataError(f"corrupt image {path} ({type(e).__name__}: {e})",
                                    "replace or delete it, or set data.skip_corrupt=true to skip such images"
                                    ) from None
                worker = get_worker_info()
                self._skipped[0 if worker is None else 1 + worker.id % (_SLOTS - 1)] += 1
                warnings.warn(f"skipping corrupt image {path} ({type(e).__name__}: {e})", stacklevel=2)
                if self.drop_corrupt:
                    return None
        raise DataError(f"no readable image in {self.root}", "every image failed to decode; check the files")
