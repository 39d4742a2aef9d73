"""A validation split carved from the training set: what a race selects on, so the test split stays unseen.

torch's `Subset` would hand the wrapped set plain ints, and a `SampleIndex` (the sampler's index that carries the
seed and epoch of the sample's augmentation stream) would lose its stream: `IndexSubset` maps the index and
keeps the stream, and passes batched fetches (`__getitems__`) through, so an in-memory set keeps its one-gather
batches.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from torch.utils.data import Dataset

from torchboost.data.builtin import stratified_split
from torchboost.data.sampling import SampleIndex
from torchboost.errors import ConfigError


class IndexSubset(Dataset):
    """The samples `indices` of `dataset`, in that order; a SampleIndex keeps its (seed, epoch)."""

    def __init__(self, dataset: Dataset, indices: Sequence[int]) -> None:
        self.dataset, self.indices = dataset, np.asarray(indices, dtype=np.int64)
        self.classes = getattr(dataset, "classes", None)
        self.batched = getattr(dataset, "batched", False)

    def _map(self, i: int) -> int:
        j = int(self.indices[int(i)])
        return SampleIndex(j, i.seed, i.epoch) if isinstance(i, SampleIndex) else j

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> Any:
        return self.dataset[self._map(i)]

    def __getitems__(self, indices: Sequence[int]) -> Any:
        mapped = [self._map(i) for i in indices]
        if hasattr(self.dataset, "__getitems__"):
            return self.dataset.__getitems__(mapped)
        return [self.dataset[i] for i in mapped]


def labels_of(dataset: Dataset) -> np.ndarray | None:
    """Every sample's label without decoding an image (in-memory sets, image folders); None if unknown."""
    labels = getattr(dataset, "labels", None)
    if labels is not None:
        return np.asarray(labels)
    samples = getattr(dataset, "samples", None)
    if samples is not None:
        return np.asarray([label for _, label in samples])
    return None


def holdout_split(train: Dataset, plain: Dataset, count: int, seed: int = 0) -> tuple[IndexSubset, IndexSubset]:
    """(training part of `train`, validation part of `plain`): `count` samples held out, stratified by class
    where the labels are known (as the built-in sets' test splits are), else drawn uniformly. `plain` is the
    same training split without augmentation (what the held-out samples are evaluated on). The split depends
    on `seed` only, not on a race's seeds: every run of a selection sees the same validation set."""
    n = len(train)
    if len(plain) != n:
        raise ValueError(f"the augmented and plain training sets differ in length ({n} vs {len(plain)})")
    if not 0 < count < n:
        raise ConfigError(f"a holdout of {count} samples from a training set of {n}",
                          f"hold out between 1 and {n - 1} samples (e.g. {max(1, n // 5)})")
    labels = labels_of(train)
    if labels is not None and len(labels) == n:
        keep, held = stratified_split(labels, count, seed)
    else:
        order = np.random.default_rng(seed).permutation(n)
        keep, held = np.sort(order[count:]), np.sort(order[:count])
    return IndexSubset(train, keep), IndexSubset(plain, held)
