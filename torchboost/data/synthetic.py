"""Synthetic images for throughput runs: deterministic, free to generate, no files."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

import numpy as np
import torch

from torchboost.data.tensors import TensorImageDataset
from torchboost.errors import DataError

UNIFORM_STD = math.sqrt((256**2 - 1) / 12) / 255  # std of uniform integers 0..255, on the 0..1 scale
MEMORY_SHARE = 0.25  # refuse a data set that would take more of physical memory: it is a typo, not a plan


def physical_memory() -> int:
    """Bytes of physical memory of this machine."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


class SyntheticImages(TensorImageDataset):
    """`n` random uint8 images with uniform random labels, all drawn from `seed`.

    Only a pool of min(n, pool) images is stored (sample i shows pool image i % pool), so a 1.28M-sample
    "ImageNet" costs a few MB; fetching a batch costs what it costs for any TensorImageDataset.
    """

    def __init__(self, n: int, num_classes: int, channels: int = 3, size: int = 224, seed: int = 0,
                 uint8: bool = False, pool: int = 64) -> None:
        need = min(n, pool) * channels * size * size + 8 * n  # uint8 pool + int64 labels
        if need > MEMORY_SHARE * physical_memory():
            raise DataError(f"{n} synthetic {channels}×{size}×{size} images with a pool of {min(n, pool)} need "
                            f"{need / 2**30:.1f} GiB, over {MEMORY_SHARE:.0%} of this machine's memory",
                            "lower the image size, the sample count or the pool")
        # numpy draws uint8 pixels ~4x faster than torch.randint (a 2048-px pool: 1 s, not 4)
        shape = (min(n, pool), channels, size, size)
        images = torch.from_numpy(np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8))
        labels = torch.randint(0, num_classes, (n,), generator=torch.Generator().manual_seed(seed))
        super().__init__(images, labels[: len(images)], [str(c) for c in range(num_classes)],
                         (0.5,) * channels, (UNIFORM_STD,) * channels, uint8)
        self.labels, self.n = labels, n

    def __len__(self) -> int:
        return self.n

    def __getitems__(self, indices: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        rows = np.asarray(indices, dtype=np.int64)
        return self._batch(rows % len(self.images), rows)
