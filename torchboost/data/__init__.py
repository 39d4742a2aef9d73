"""Data sets (built-in, image folders, MNIST and Fashion-MNIST files, synthetic), transforms, sharded sampling
and loaders.

WebDataset shards (`shards`, `shardfiles`, `shardoffsets`, `braces`) and the exporters (`export`) are imported
when first used (`_EXPORTS` names what comes from them): a run on a built-in set or a folder never loads them.
"""

from __future__ import annotations


import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

from torchboost.data.augment import Policy, RandomErasing
from torchboost.data.builtin import load_builtin
from torchboost.data.device_decode import DeviceBatch, DeviceDecode
from torchboost.data.fashion_mnist import load_fashion_mnist
from torchboost.data.folder import ImageFolder, drop_missing_collate, loader_skipped, read_image, sample_folder
from torchboost.data.mixup import MixedBatches, Mixup
from torchboost.data.mnist import load_mnist_idx, load_paddle_json, read_idx
from torchboost.data.sampling import SampleIndex, ShardSampler, sample_rng, set_epoch
from torchboost.data.synthetic import SyntheticImages
from torchboost.data.tensors import TensorImageDataset, passthrough_collate
from torchboost.lazy import lazy_exports
from torchboost.data.transforms import (AUGMENTS, IMAGENET_MEAN, IMAGENET_STD, EvalTransform, FlipTransform,
                                        ImageTransform, ShiftTransform, TrainTransform, eval_transform,
                                        normalize_batch, train_transform)

# public name -> the module it is imported from on first use
_EXPORTS = {"export_folder": "torchboost.data.export", "export_shards": "torchboost.data.export",
            "ShardDataset": "torchboost.data.shards", "ShardLoader": "torchboost.data.shards",
            "open_shards": "torchboost.data.shards"}

__all__ = [
    "build_loader", "read_image", "load_builtin", *_EXPORTS, "set_epoch", "ImageFolder", "sample_folder",
    "loader_skipped", "read_idx", "load_mnist_idx", "load_fashion_mnist", "load_paddle_json", "SampleIndex",
    "ShardSampler", "sample_rng", "SyntheticImages", "TensorImageDataset", "passthrough_collate", "ImageTransform",
    "TrainTransform", "EvalTransform", "FlipTransform", "ShiftTransform", "AUGMENTS", "train_transform",
    "eval_transform", "normalize_batch", "IMAGENET_MEAN", "IMAGENET_STD", "Policy", "RandomErasing", "Mixup",
    "MixedBatches", "DeviceDecode", "DeviceBatch",
]


def build_loader(dataset: Dataset, batch_size: int, train: bool, *, workers: int = 0, pin_memory: bool = False,
                 seed: int = 0, rank: int = 0, world_size: int = 1, persistent_workers: bool = True,
                 prefetch_factor: int = 2) -> DataLoader:
    """DataLoader over this rank's shard. Training: shuffled per epoch, drop_last (global and per batch);
    evaluation: in order, every sample once across ranks. Each new iteration is the next epoch;
    `set_epoch(loader, epoch, skip)` selects one explicitly (resume). Worker processes'
    python/numpy/torch RNGs are seeded by torch from the loader's generator (seeded here from seed and
    rank); augmentation uses `sample_rng`, independent of workers. A ShardDataset gets a `ShardLoader`
    (see `torchboost.data.shards` for how shards are split)."""
    if isinstance(dataset, IterableDataset):  # a ShardDataset streams (the shard modules load only for one)
        from torchboost.data.shards import ShardDataset, shard_loader

        if isinstance(dataset, ShardDataset):
            return shard_loader(dataset, batch_size, train, workers=workers, pin_memory=pin_memory, seed=seed,
                                rank=rank, world_size=world_size, persistent_workers=persistent_workers,
                                prefetch_factor=prefetch_factor)
    sampler = ShardSampler(len(dataset), rank, world_size, shuffle=train, seed=seed, drop_last=train)
    generator = torch.Generator().manual_seed(int(np.random.SeedSequence([seed, rank]).generate_state(1)[0]))
    return DataLoader(
        dataset, batch_size=batch_size, sampler=sampler, drop_last=train, num_workers=workers,
        collate_fn=passthrough_collate if getattr(dataset, "batched", False) else drop_missing_collate,
        pin_memory=pin_memory, generator=generator, persistent_workers=persistent_workers and workers > 0,
        prefetch_factor=prefetch_factor if workers > 0 else None)


__getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)
