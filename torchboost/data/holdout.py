"""A validation split carved from the training set (what a race selects on, so the test split stays unseen), and a
stratified subset of it (`data.train_subset`: a smaller task drawn from a large set, the same images for every run);
with a subset, a selection's held-out images come from outside it (`selection_split`).

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
        labels = labels_of(dataset)  # kept, so a holdout carved from a subset is stratified too
        self.labels = None if labels is None else labels[self.indices]

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


def _draw(dataset: Dataset, count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Sorted (the rest, `count` drawn) indices of `dataset`: stratified by class where the labels are known (each
    class its share, `builtin.stratified_split`), else uniformly; from `seed` alone."""
    labels = labels_of(dataset)
    if labels is not None and len(labels) == len(dataset):
        return stratified_split(labels, count, seed)
    order = np.random.default_rng(seed).permutation(len(dataset))
    return np.sort(order[count:]), np.sort(order[:count])


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
    keep, held = _draw(train, count, seed)
    return IndexSubset(train, keep), IndexSubset(plain, held)


def selection_split(train: Dataset, plain: Dataset, count: int, subset: int | None = None, seed: int = 0
                    ) -> tuple[IndexSubset, IndexSubset]:
    """(training images, held-out images) of a selection, so that it trains on as many images as the runs it
    chooses for: with `subset` (`data.train_subset`), the training images are that subset (`stratified_subset`'s
    draw, as a run on the subset trains on) and the `count` held out are drawn from the rest of the split;
    without, `count` are carved out of the training split (`holdout_split`) and a confirmation leaves the same
    ones out. `plain`: the training split unaugmented (what the held-out images are evaluated on)."""
    if not subset:
        return holdout_split(train, plain, count, seed)
    if len(plain) != len(train):
        raise ValueError(f"the augmented and plain training sets differ in length ({len(train)} vs {len(plain)})")
    kept = stratified_subset(train, subset, seed).indices
    rest = np.setdiff1d(np.arange(len(train)), kept)
    if not 0 < count <= len(rest):
        raise ConfigError(f"a holdout of {count} samples from the {len(rest)} outside data.train_subset={subset}",
                          f"hold out at most {len(rest)} (or lower data.train_subset)")
    _, held = _draw(IndexSubset(plain, rest), count, seed)
    return IndexSubset(train, kept), IndexSubset(plain, rest[held])


def stratified_subset(dataset: Dataset, count: int, seed: int = 0) -> IndexSubset:
    """`count` samples of `dataset`, stratified by class where the labels are known (the same number per class on a
    balanced set such as Fashion-MNIST's 6,000 a class), else drawn uniformly. The draw depends on `seed` only, never
    on a run's or a race's seed: every run on the subset trains on the same images, and the augmented and plain
    copies of one training split give the same subset."""
    if not 0 < count <= len(dataset):
        raise ConfigError(f"data.train_subset={count} but the training split holds {len(dataset)} samples",
                          f"use at most {len(dataset)} (or leave data.train_subset unset for all of them)")
    return IndexSubset(dataset, _draw(dataset, count, seed)[1])
