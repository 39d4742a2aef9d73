"""Data sets (built-in, image folders, MNIST files, synthetic), transforms, sharded sampling and loaders."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from torchboost.data.builtin import load_builtin
from torchboost.data.export import export_folder
from torchboost.data.folder import ImageFolder, drop_missing_collate, read_image
from torchboost.data.mnist import load_mnist_idx, load_paddle_json, read_idx
from torchboost.data.sampling import SampleIndex, ShardSampler, sample_rng
from torchboost.data.synthetic import SyntheticImages
from torchboost.data.tensors import TensorImageDataset, passthrough_collate
from torchboost.data.transforms import (IMAGENET_MEAN, IMAGENET_STD, EvalTransform, TrainTransform,
                                        eval_transform, normalize_batch, train_transform)
from torchboost.errors import ConfigError, DataError

__all__ = [
    "build_dataset", "build_loader", "eval_preprocess", "read_image", "load_builtin", "export_folder", "ImageFolder", "read_idx",
    "load_mnist_idx", "load_paddle_json", "SampleIndex", "ShardSampler", "sample_rng", "SyntheticImages",
    "TensorImageDataset", "passthrough_collate", "TrainTransform", "EvalTransform", "train_transform",
    "eval_transform", "normalize_batch", "IMAGENET_MEAN", "IMAGENET_STD",
]

DATASETS = ("mnist5k", "digits", "folder", "mnist_idx", "paddle_json", "synthetic")
DEFAULT_STATS = {3: (IMAGENET_MEAN, IMAGENET_STD), 1: ((0.5,), (0.5,))}  # for folders without data.mean


def _get(cfg: Any, name: str, default: Any = None) -> Any:
    value = getattr(cfg, name, None)
    return default if value is None else value


def _path(cfg: Any) -> Path:
    if _get(cfg, "path") is None:
        raise ConfigError(f"data.dataset={cfg.dataset} needs data.path", "set data.path (or pass --data DIR)")
    return Path(cfg.path)


def _split_dir(root: Path, split: str) -> Path:
    if not root.is_dir():
        raise DataError(f"data folder {root} does not exist", "check data.path (or --data DIR)")
    names = ("train",) if split == "train" else ("val", "test")
    for name in names:
        if (root / name).is_dir():
            return root / name
    raise DataError(f"no {'/ or '.join(names)}/ folder in {root}",
                    "a folder data set holds train/ and val/ (or test/), each with one sub-folder per class")


def _folder_stats(cfg: Any) -> tuple[int, tuple, tuple]:
    """(image size, mean, std) of a folder data set: the config's, or defaults for its channel count."""
    channels, size = _get(cfg, "channels", 3), _get(cfg, "image_size", 224)
    default_mean, default_std = DEFAULT_STATS.get(channels, ((), ()))
    mean, std = _get(cfg, "mean", default_mean), _get(cfg, "std", default_std)
    if len(mean) != channels or len(std) != channels:
        raise ConfigError(f"data.channels={channels} needs data.mean and data.std with {channels} values each",
                          "set data.channels to 1 or 3 and matching data.mean / data.std")
    return size, mean, std


def _folder(cfg: Any, split: str) -> ImageFolder:
    if split == "train":
        size, mean, std = _folder_stats(cfg)
        transform: Any = train_transform(size, mean, std, uint8=bool(_get(cfg, "normalize_on_device", False)))
    else:
        transform = eval_preprocess(cfg)
    return ImageFolder(_split_dir(_path(cfg), split), transform, bool(_get(cfg, "skip_corrupt", False)),
                       drop_corrupt=split != "train")


def eval_preprocess(cfg: Any) -> EvalTransform:
    """A run's evaluation preprocessing for single image files (what `predict` feeds the model).

    Folder runs: their resize + centre crop and statistics. In-memory sets (MNIST, digits) are stored at
    their native size: a file is resized to that size, whole (no crop), with the set's statistics."""
    uint8 = bool(_get(cfg, "normalize_on_device", False))
    if _get(cfg, "dataset") in ("folder", "synthetic"):
        size, mean, std = _folder_stats(cfg)
        return eval_transform(size, mean, std, _get(cfg, "crop_pct", 0.875), uint8=uint8)
    ds = build_dataset(cfg, "test")
    return eval_transform(ds.images.shape[-1], ds.mean, ds.std, crop_pct=1.0, uint8=uint8)


def _check_tensor_set(cfg: Any, ds: TensorImageDataset) -> None:
    """In-memory sets come at their native size: say so instead of silently resizing."""
    _, c, h, _ = ds.images.shape
    if _get(cfg, "image_size", h) != h:
        raise ConfigError(f"{cfg.dataset} images are {h}×{h} but data.image_size={cfg.image_size}",
                          f"set data.image_size={h}")
    if _get(cfg, "channels", c) != c:
        raise ConfigError(f"{cfg.dataset} images have {c} channel(s) but data.channels={cfg.channels}",
                          f"set data.channels={c}")
    if _get(cfg, "mean") is not None or _get(cfg, "std") is not None:
        mean, std = _get(cfg, "mean", ds.mean), _get(cfg, "std", ds.std)
        if len(mean) != c or len(std) != c:
            raise ConfigError(f"data.mean/std need {c} value(s) for {cfg.dataset}", "give one per channel")
        ds.set_stats(mean, std)


def build_dataset(cfg: Any, split: str) -> Dataset:
    """The `split` ("train" or "test"; "valid" for paddle_json) of the data set described by a DataConfig
    (any object with its attributes; unset ones may be None). Reads dataset, path, image_size, channels,
    mean, std, crop_pct, skip_corrupt, num_classes, synthetic_size, normalize_on_device (uint8 batches that
    the trainer normalizes on its device with the dataset's mean/std), random_shift (in-memory training sets)."""
    kind = _get(cfg, "dataset")
    shift = int(_get(cfg, "random_shift", 0) or 0)
    if shift < 0:
        raise ConfigError(f"data.random_shift must be >= 0, got {shift}", "use a pixel count such as 2")
    if shift and kind in ("folder", "synthetic"):
        raise ConfigError(f"data.random_shift applies to in-memory sets, not {kind!r}",
                          "drop data.random_shift (folders are augmented by RandomResizedCrop)")
    if kind == "folder":
        ds: Any = _folder(cfg, split)
    elif kind == "synthetic":
        n = _get(cfg, "synthetic_size", 1024)
        ds = SyntheticImages(n if split == "train" else max(1, n // 10), _get(cfg, "num_classes", 1000),
                             _get(cfg, "channels", 3), _get(cfg, "image_size", 224), seed=int(split != "train"),
                             uint8=bool(_get(cfg, "normalize_on_device", False)))
    elif kind in ("mnist5k", "digits", "mnist_idx", "paddle_json"):
        if kind == "mnist_idx":
            ds = load_mnist_idx(_path(cfg), split)
        elif kind == "paddle_json":
            ds = load_paddle_json(_path(cfg), split)
        else:
            ds = load_builtin(kind, split)
        _check_tensor_set(cfg, ds)
        ds.uint8 = bool(_get(cfg, "normalize_on_device", False))
        ds.shift = shift if split == "train" else 0
    else:
        raise ConfigError(f"unknown data.dataset {kind!r}", f"use one of {', '.join(DATASETS)}")
    if _get(cfg, "num_classes", len(ds.classes)) < len(ds.classes):
        raise ConfigError(f"data.num_classes={cfg.num_classes} but the data has {len(ds.classes)} classes",
                          f"set data.num_classes to at least {len(ds.classes)}")
    return ds


def build_loader(dataset: Dataset, batch_size: int, train: bool, *, workers: int = 0, pin_memory: bool = False,
                 seed: int = 0, rank: int = 0, world_size: int = 1, persistent_workers: bool = True,
                 prefetch_factor: int = 2) -> DataLoader:
    """DataLoader over this rank's shard. Training: shuffled per epoch, drop_last (global and per batch);
    evaluation: in order, every sample once across ranks. Call `loader.sampler.set_epoch(epoch, skip)`
    before each epoch. Worker processes' python/numpy/torch RNGs are seeded by torch from the loader's
    generator (seeded here from seed and rank); augmentation uses `sample_rng`, independent of workers."""
    sampler = ShardSampler(len(dataset), rank, world_size, shuffle=train, seed=seed, drop_last=train)
    generator = torch.Generator().manual_seed(int(np.random.SeedSequence([seed, rank]).generate_state(1)[0]))
    return DataLoader(
        dataset, batch_size=batch_size, sampler=sampler, drop_last=train, num_workers=workers,
        collate_fn=passthrough_collate if getattr(dataset, "batched", False) else drop_missing_collate,
        pin_memory=pin_memory, generator=generator, persistent_workers=persistent_workers and workers > 0,
        prefetch_factor=prefetch_factor if workers > 0 else None)
