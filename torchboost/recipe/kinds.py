"""The data-set kind registry: every `data.dataset` value, defined once.

A kind is its name, its help and where its images come from — one of three small objects, each of which
says what the kind can do:

- `InMemory(load)`: the whole set as tensors at its native size (MNIST files, the built-in sets). Statistics
  from its train split; translations only (crops and flips suit photos); held out and resumed mid-epoch by
  sample index.
- `ImageFiles(...)`: encoded images decoded per sample through a training transform (photo crops, flips,
  RandAugment, erasing), on the device too (`data.decode=device`). An image folder by default; a kind with its
  own storage gives `open_split`, `sample` and `splits`. `streamed` (shards): read as a stream — shard lists
  and a shuffle buffer apply; nothing is carved from it (holdout, train_subset), batches are not mixed.
- `Drawn()`: random images of drawn classes, generated as tensors past any transform (speed tests): no labels
  of its own, no augmentation, no split to test on.

Validation, `recipe.data`, the CLI (`--data`, `export-folder`, help) and the docs ask a kind these questions
(its properties); nothing else lists the kinds. The built-in sets come from `torchboost.data.builtin`'s own
catalogue, so shipping another one there adds its kind here by itself.

It lives in `recipe/` (not in `data/`) because an entry maps a config section to data-library calls.
Adding a kind: write its loader, add one `register(DataKind(NAME, HELP, InMemory(loader)))` line (a test
registers a throwaway kind and trains, resumes and races on it).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Union

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
class InMemory:
    """The whole set as a `TensorImageDataset` at its native size, from `load(data config, split, classes)`;
    `reads_path`: from files at data.path (False: built into the package)."""

    load: Loader
    reads_path: bool = True


@dataclass(frozen=True)
class ImageFiles:
    """Encoded images decoded per sample. `open_split(data config, split, transform)`: the kind's own reader
    (None: an image folder, PATH/train/<class>/*); `sample(data config)`: the header sample channels and size
    are inferred from; `splits(data config)`: the split names it holds (eval's --split is exact)."""

    open_split: Callable[[object, str, object], Dataset] | None = None
    sample: Callable[[object], FolderSample] | None = None
    splits: Callable[[object], list[str]] | None = None
    streamed: bool = False


@dataclass(frozen=True)
class Drawn:
    """Random images of drawn classes (the class count from model.num_classes), no path."""


Source = Union[InMemory, ImageFiles, Drawn]


@dataclass(frozen=True)
class DataKind:
    name: str
    help: str
    source: Source

    @property
    def in_memory(self) -> bool:
        return isinstance(self.source, InMemory)

    @property
    def decoded(self) -> bool:
        """Encoded image files decoded per sample: photo augmentations, device decoding, a sample to infer from."""
        return isinstance(self.source, ImageFiles)

    @property
    def folder(self) -> bool:
        """An image folder (PATH/train/<class>/...): the files are the storage."""
        return self.decoded and self.source.open_split is None

    @property
    def drawn(self) -> bool:
        return isinstance(self.source, Drawn)

    @property
    def needs_path(self) -> bool:
        return self.decoded or (self.in_memory and self.source.reads_path)

    @property
    def streamed(self) -> bool:
        return self.decoded and self.source.streamed

    @property
    def own_labels(self) -> bool:
        return not self.drawn

    @property
    def augments(self) -> tuple[str, ...]:
        """The data.augment values that apply: synthetic images are generated past any transform."""
        return ("auto", *AUGMENTS) if self.decoded else TENSOR_AUGMENTS if self.in_memory else ("auto", "none")

    @property
    def shift(self) -> bool:  # data.random_shift applies
        return not self.drawn

    @property
    def mixing(self) -> bool:  # mixup/cutmix: a map-style set whose batches the sampler draws
        return not self.streamed

    @property
    def carvable(self) -> bool:  # a holdout or a train_subset can be drawn from it (a stream is read in order)
        return not self.streamed

    @property
    def splits(self) -> Callable[[object], list[str]] | None:
        return self.source.splits if self.decoded else None


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
    register(DataKind(_name, f"built in: {_set.description}", InMemory(_builtin(_name), reads_path=False)))
register(DataKind(FOLDER, "an image folder: PATH/train/<class>/*.jpg|png and PATH/val/ (or test/)", ImageFiles()))


def _open_shards(cfg, split: str, transform: Callable) -> Dataset:  # the shard readers load only for shards
    from torchboost.data.shards import open_shards

    return open_shards(cfg.path, split, transform, cfg.train_shards if split == "train" else cfg.eval_shards,
                       cfg.shuffle_buffer)


def _shard_index(cfg):
    from torchboost.data.shardfiles import read_index

    return read_index(cfg.path)


register(DataKind("shards", "WebDataset tar shards ({key}.jpg|png + {key}.cls) and their _info.json index in PATH "
                  "(written by torchboost export-shards)",
                  ImageFiles(open_split=_open_shards, sample=lambda cfg: _shard_index(cfg).sample,
                             splits=lambda cfg: list(_shard_index(cfg).splits), streamed=True)))
register(DataKind("mnist_idx", "MNIST IDX files (train-images-idx3-ubyte[.gz], ...) in PATH",
                  InMemory(lambda cfg, split, n: load_mnist_idx(Path(cfg.path), split))))
register(DataKind("fashion_mnist", "Fashion-MNIST's IDX files (MNIST's names: train-images-idx3-ubyte[.gz], ...) in "
                  f"PATH, 10 clothing classes (apt-get install dataset-fashion-mnist puts them in {DEBIAN_PATH})",
                  InMemory(lambda cfg, split, n: load_fashion_mnist(Path(cfg.path), split))))
register(DataKind("paddle_json", "PaddlePaddle's mnist.json.gz ([train, valid, eval] lists) at PATH",
                  InMemory(lambda cfg, split, n: load_paddle_json(Path(cfg.path), split))))
register(DataKind("synthetic", "random images of drawn classes (speed tests; no path)", Drawn()))
