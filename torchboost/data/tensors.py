"""In-memory image data set (built-in sets, MNIST files, synthetic data) with batched fetching."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

from torchboost.data.sampling import sample_flips, sample_shifts
from torchboost.data.transforms import norm_coeffs
from torchboost.errors import DataError


class TensorImageDataset(Dataset):
    """uint8 images (N×C×H×W) + int64 labels, returned normalized as float32 (or as uint8 with uint8=True,
    for normalizing on the device with `transforms.normalize_batch`).

    `__getitems__` fetches a whole batch with one gather and one normalize, and returns the collated pair
    (images B×C×H×W, labels B): a DataLoader over it needs `collate_fn=passthrough_collate`, which
    `build_loader` passes (it checks the `batched` flag).
    """

    batched = True  # __getitems__ returns an already collated batch

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, classes: Sequence[str],
                 mean: Sequence[float], std: Sequence[float], uint8: bool = False, shift: int = 0,
                 flip: str = "none") -> None:
        if images.dtype != torch.uint8 or images.ndim != 4:
            raise DataError(f"images must be a uint8 N×C×H×W tensor, got {images.dtype} {tuple(images.shape)}",
                            "convert the images to uint8 0..255 with a channel axis")
        if labels.shape != (len(images),):
            raise DataError(f"{len(labels)} labels for {len(images)} images", "give one label per image")
        if len(labels) and not 0 <= int(labels.min()) <= int(labels.max()) < len(classes):
            raise DataError(f"labels span {int(labels.min())}..{int(labels.max())} but there are "
                            f"{len(classes)} classes", "labels must be class indices 0..num_classes-1")
        self.images, self.labels = images.contiguous(), labels.to(torch.int64)
        self.classes, self.uint8 = list(classes), uint8
        # shift > 0: translate each image by its own random (dy, dx) in [-shift, shift], filling with 0 (the
        # background of MNIST-like sets): the augmentation small sets need (mnist5k's 4,000 images overfit).
        self.shift = shift
        self.flip = flip  # none, random or alternate (`sampling.sample_flips`): left-right mirrors of training images
        self.set_stats(mean, std)

    def set_stats(self, mean: Sequence[float], std: Sequence[float]) -> None:
        """Normalize with these per-channel statistics (0..1 scale) from now on, e.g. a recipe's."""
        channels = self.images.shape[1]
        if len(mean) != channels or len(std) != channels:
            raise DataError(f"mean/std have {len(mean)}/{len(std)} values for {channels} channels",
                            "give one mean and one std per channel")
        self.mean, self.std = tuple(mean), tuple(std)
        self._scale, self._shift = norm_coeffs(mean, std)

    def __len__(self) -> int:
        return len(self.images)

    def _batch(self, image_rows: np.ndarray, label_rows: np.ndarray, indices: Sequence[int] = ()
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Gather, shift (`indices` are the sampler's, which carry the augmentation seed) and normalize."""
        # numpy, not torch: a batch (~10^5 values) is above torch's parallel grain size, and each OpenMP
        # region waits for a free core: on a busy machine each op then costs a scheduling wait, not compute.
        x = self.images.numpy()[image_rows]
        if self.shift:
            x = translate_each(x, sample_shifts(indices, self.shift))
        if self.flip != "none":
            mirrored = sample_flips(indices, self.flip)
            x[mirrored] = x[mirrored][..., ::-1]
        if not self.uint8:
            x = x.astype(np.float32)
            x *= self._scale.numpy()
            x -= self._shift.numpy()
        return torch.from_numpy(x), torch.from_numpy(self.labels.numpy()[label_rows])

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        x, y = self.__getitems__([index])
        return x[0], int(y[0])

    def __getitems__(self, indices: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        rows = np.asarray(indices, dtype=np.int64)
        return self._batch(rows, rows, indices)


def translate_each(x: np.ndarray, shifts: np.ndarray) -> np.ndarray:
    """Image i of the N×C×H×W batch `x` moved by shifts[i] = (dy, dx) (down, right), zeros moving in: what
    `transforms.translate` does to one image, done once per distinct shift (at most (2s+1)² slices a batch)."""
    n, _, h, w = x.shape
    s = int(np.abs(shifts).max(initial=0))
    padded = np.zeros((n, x.shape[1], h + 2 * s, w + 2 * s), x.dtype)
    padded[:, :, s:s + h, s:s + w] = x
    out = np.empty_like(x)
    pairs, which = np.unique(shifts, axis=0, return_inverse=True)
    for k, (dy, dx) in enumerate(pairs):
        rows = np.flatnonzero(which.ravel() == k)
        out[rows] = padded[rows, :, s - dy:s - dy + h, s - dx:s - dx + w]
    return out


def passthrough_collate(batch):
    """collate_fn for data sets whose `__getitems__` already returns a collated batch."""
    return batch
