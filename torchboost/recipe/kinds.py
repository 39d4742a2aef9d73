"""The data-set kind registry: every `data.dataset` value, defined once.

An entry holds everything about one kind of data: how to load a split from a `DataConfig`, whether it
reads a path, whether its images live in memory at their native size (MNIST files, the built-in sets) or
are decoded and resized per sample (folders, synthetic photos-like images), which training augmentations
apply, and its one-line help. Validation, `recipe.data`, the CLI (`--data`, `export-folder`, help) and the
docs read this table; nothing else lists the kinds. The built-in sets come from `torchboost.data.builtin`'s
own catalogue, so shipping another one there adds its kind here by itself.

It lives in `recipe/` (not in `data/`) because an entry maps a config section to data-library calls.
Adding a kind: write its loader in `torchboost.data`, add one `register(DataKind(...))` line here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from torch.utils.data import Dataset

from torchboost.data import load_builtin, load_fashion_mnist, load_mnist_idx, load_paddle_json
from torchboost.data.builtin import BUILTIN_SETS
from torchboost.data.fashion_mnist import DEBIAN_PATH
from torchboost.data.folder import FolderSample
from torchboost.data.transforms import AUGMENTS
from torchboost.errors import ConfigError, suggest

# (data config, split, num_classes) -> data set; num_classes only matters to kinds without their own labels
Loader = Callable[[object, str, "int | None"], Dataset]
TENSOR_AUGMENTS = ("auto", "shift", "none")  # in-memory sets: translations only (crops/flips suit photos)


@dataclass(frozen=True)
class DataKind:
    name: str
    help: str
    load: Loader | None  # None: decoded per sample by recipe.data (folders, synthetic)
    needs_path: bool = False
    in_memory: bool = True  # whole set in memory at its native size, statistics from its train split
    augments: tuple[str, ...] = TENSOR_AUGMENTS  # data.augment values that apply
    shift: bool = True  # data.random_shift applies
    own_labels: bool = True  # False: labels are drawn, the class count comes from model.num_classes
    photos: bool = False  # `augment: auto` gives ResNets ImageNet-style crops
    # data.auto_augment / data.random_erasing apply: images decoded per sample through a training transform
    # (in-memory sets and synthetic images skip the transforms)
    photo_augments: bool = False
    mixing: bool = True  # data.mixup_alpha / cutmix_alpha apply: a map-style set, batches drawn by the sampler
    # Decoded per sample from something other than an image folder: (data config, split, transform) -> data
    # set, and the header sample `load_data` infers channels and native size from (a folder's: sample_folder).
    open_split: Callable[[object, str, object], Dataset] | None = None
    sample: Callable[[object], FolderSample] | None = None
    splits: Callable[[object], list[str]] | None = None  # the split names it holds (eval's --split is exact)
    streamed: bool = False  # read as a stream of shards: data.shuffle_buffer / train_shards / eval_shards apply
    device_decode: bool = False  # encoded image files, decoded per sample: data.decode=device applies


DATA_KINDS: dict[str, DataKind] = {}
FOLDER = "folder"  # what `--data DIR` trains on when the recipe's data set reads no path
DEFAULT_KIND = "mnist5k"  # the default job's data


def register(kind: DataKind) -> DataKind:
    if kind.name in DATA_KINDS:
        raise ValueError(f"data-set kind {kind.name!r} is registered twice")
    DATA_KINDS[kind.name] = kind
    return kind


def get_kind(name: str) -> DataKind:
    if name not in DATA_KINDS:
        raise ConfigError(f"unknown data.dataset '{name}'", suggest(str(name), list(DATA_KINDS)))
    return DATA_KINDS[name]


def list_kinds() -> list[str]:
    return list(DATA_KINDS)


def _builtin(name: str) -> Loader:
    return lambda cfg, split, num_classes: load_builtin(name, split)


for _name, _set in BUILTIN_SETS.items():
    register(DataKind(_name, f"built in: {_set.description}", _builtin(_name)))
register(DataKind(FOLDER, "an image folder: PATH/train/<class>/*.jpg|png and PATH/val/ (or test/)", None,
                  needs_path=True, in_memory=False, augments=("auto", *AUGMENTS), photos=True, photo_augments=True,
                  device_decode=True))


def _open_shards(cfg, split: str, transform: Callable) -> Dataset:  # the shard readers load only for shards
    from torchboost.data.shards import open_shards

    return open_shards(cfg.path, split, transform, cfg.train_shards if split == "train" else cfg.eval_shards,
                       cfg.shuffle_buffer)


def _shard_index(cfg):
    from torchboost.data.shardfiles import read_index

    return read_index(cfg.path)


register(DataKind("shards", "WebDataset tar shards ({key}.jpg|png + {key}.cls) and their _info.json index in PATH "
                  "(written by torchboost export-shards)", None, needs_path=True, in_memory=False,
                  augments=("auto", *AUGMENTS), photos=True, photo_augments=True, mixing=False, streamed=True,
                  device_decode=True, open_split=_open_shards,
                  sample=lambda cfg: _shard_index(cfg).sample, splits=lambda cfg: list(_shard_index(cfg).splits)))
register(DataKind("mnist_idx", "MNIST IDX files (train-images-idx3-ubyte[.gz], ...) in PATH",
                  lambda cfg, split, n: load_mnist_idx(Path(cfg.path), split), needs_path=True))
register(DataKind("fashion_mnist", "Fashion-MNIST's IDX files (MNIST's names: train-images-idx3-ubyte[.gz], ...) in "
                  f"PATH, 10 clothing classes (apt-get install dataset-fashion-mnist puts them in {DEBIAN_PATH})",
                  lambda cfg, split, n: load_fashion_mnist(Path(cfg.path), split), needs_path=True))
register(DataKind("paddle_json", "PaddlePaddle's mnist.json.gz ([train, valid, eval] lists) at PATH",
                  lambda cfg, split, n: load_paddle_json(Path(cfg.path), split), needs_path=True))
# synthetic images are generated as tensors, past any transform: only `none` (what `auto` gives) is true of them
register(DataKind("synthetic", "random images of drawn classes (speed tests; no path)", None, in_memory=False,
                  augments=("auto", "none"), shift=False, own_labels=False))
