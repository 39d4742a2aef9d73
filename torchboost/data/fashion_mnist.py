"""Fashion-MNIST (Xiao, Rasul and Vollgraf 2017): 70,000 28×28 grey photos of clothing in 10 classes, stored in
MNIST's IDX format under MNIST's file names, so `mnist.load_mnist_idx` reads them; only the class names and the
statistics differ. Debian ships the four files (`apt-get install dataset-fashion-mnist`) in DEBIAN_PATH.
"""

from __future__ import annotations

from pathlib import Path

from torchboost.data.mnist import load_mnist_idx
from torchboost.data.tensors import TensorImageDataset
from torchboost.errors import DataError

DEBIAN_PATH = "/usr/share/datasets/fashion-mnist"  # where `apt-get install dataset-fashion-mnist` puts the files
INSTALL = f"apt-get install dataset-fashion-mnist (it puts the files in {DEBIAN_PATH})"
CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot")
# mean and std of the 60,000 training images' pixels on [0, 1], as the MNIST constants are MNIST's
MEAN, STD = (0.2860,), (0.3530,)


def load_fashion_mnist(root: str | Path, split: str) -> TensorImageDataset:
    """Fashion-MNIST "train" (60,000) or "test" (10,000) from `root` holding the IDX files (raw or `.gz`),
    with its class names and statistics."""
    root = Path(root)
    if not root.is_dir():  # the usual first error: the files were never installed
        raise DataError(f"no Fashion-MNIST folder {root}", f"{INSTALL}, or give the folder holding "
                        "train-images-idx3-ubyte.gz etc. with --data DIR")
    ds = load_mnist_idx(root, split)
    return TensorImageDataset(ds.images, ds.labels, CLASSES, MEAN, STD)
