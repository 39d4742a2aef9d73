"""The resolved config of a run: the user's config with every inferred key filled in.

It is what `config.yaml` and every checkpoint record, so `eval`, `predict` and `--resume` rebuild the
exact run without the recipe. Resolving returns a new Config; the one passed in is never changed.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from torch.utils.data import Dataset

from torchboost.boost import BoostPlan
from torchboost.errors import ConfigError, DataError
from torchboost.models import has_batchnorm, smallest_input
from torchboost.optim.registry import get_optimizer
from torchboost.recipe.config import Config, DataConfig
from torchboost.recipe.data import small_stem
from torchboost.recipe.kinds import get_kind
from torchboost.recipe.optimizers import typed_section
from torchboost.train.metrics import resolve_metric


def resolve_config(cfg: Config, data: DataConfig, train_ds: Dataset, plan: BoostPlan | None) -> Config:
    """`cfg` with the data section `recipe.data.load_data` resolved, the model's classes and input
    channels taken from the data, the optimizer's momentum defaults, boost's gradient accumulation and
    the checkpoint prefix filled in (and every optimizer options section as its dataclass, defaults included).
    A value the user set that contradicts the data is an error, not silently replaced."""
    classes = len(train_ds.classes)
    if classes < 2 and get_kind(cfg.data.dataset).own_labels:
        raise DataError(f"the training data has {classes} class ({', '.join(map(str, train_ds.classes))}): a "
                        "classifier needs at least 2", "add a folder per class (train/<class>/*.png)")
    m = cfg.model
    if m.num_classes is not None and m.num_classes != classes and get_kind(cfg.data.dataset).own_labels:
        raise ConfigError(f"model.num_classes={m.num_classes} but the training data has {classes} classes",
                          "leave model.num_classes unset to use the data's class count")
    if m.in_chans is not None and m.in_chans != data.channels:
        raise ConfigError(f"model.in_chans={m.in_chans} but the images have {data.channels} channel(s)",
                          "leave model.in_chans unset (or set data.channels to convert the images)")
    least = smallest_input(m.name)
    if data.image_size is not None and data.image_size < least:
        raise ConfigError(f"{m.name} needs images of at least {least} px, and these are {data.image_size} px (its "
                          "downsampling leaves nothing of them)", f"set data.image_size={least} (upscaled), or "
                          "choose a network for small images: --set model.name=resnet20")
    small = small_stem(m.name, data.image_size)
    model = dataclasses.replace(m, num_classes=m.num_classes or classes, in_chans=data.channels,
                                small_input=small if m.small_input is None else m.small_input)
    train = cfg.train
    if train.monitor != "val_top_5_accuracy":
        train = dataclasses.replace(train, metrics=without_top5(train.metrics, model.num_classes))
    if plan is not None and plan.on("grad_accumulation"):
        if train.accumulation_steps not in (1, plan.grad_accumulation_step):
            raise ConfigError(f"train.accumulation_steps={train.accumulation_steps} and boost "
                              f"grad_accumulation_step={plan.grad_accumulation_step} disagree", "set only one of them")
        train = dataclasses.replace(train, accumulation_steps=plan.grad_accumulation_step)
    checkpoint = dataclasses.replace(cfg.checkpoint, prefix=cfg.checkpoint.prefix or m.name)
    entry = get_optimizer(cfg.optim.name)  # record the optimizer's own defaults for what the user left unset
    optim = dataclasses.replace(cfg.optim, momentum=entry.momentum if cfg.optim.momentum is None else cfg.optim.momentum,
                                nesterov=entry.nesterov if cfg.optim.nesterov is None else cfg.optim.nesterov,
                                options={k: typed_section(k, v) for k, v in cfg.optim.options.items()})
    return dataclasses.replace(cfg, model=model, data=data, optim=optim, train=train, checkpoint=checkpoint)


def without_top5(metrics: Sequence[str], num_classes: int) -> list[str]:
    """`metrics` without top-5 accuracy when there are 5 classes or fewer (it would always read 100%)."""
    return [m for m in metrics if num_classes > 5 or resolve_metric(m) != "top_5_accuracy"]


def fit_batch(cfg: Config, images: int, world_size: int, per_rank: int | None = None) -> tuple[Config, str | None]:
    """The training batch rule: each epoch drops its last partial batch, so every update averages a full
    batch (as the reference recipes do), unless the batch is larger than a process's share of the images:
    then each epoch is one batch of that share, and the returned note says so (data.batch_size is recorded
    as what ran, so lr scaling and a resume agree). Fewer than 2 images per process is an error: BatchNorm
    cannot normalise one. `per_rank`: a process's share when the data set decides it (shards are read whole
    by one process each: `ShardDataset.share`); else images // world_size."""
    per_rank = images // world_size if per_rank is None else per_rank
    if per_rank < 2:
        raise DataError(f"{images} training image(s) for {world_size} process(es): each process needs at least 2",
                        "add training images or launch fewer processes")
    if cfg.data.batch_size <= per_rank:
        return cfg, None
    note = (f"data.batch_size={cfg.data.batch_size} is larger than the {per_rank} training images "
            f"{'of each process' if world_size > 1 else 'there are'}: each epoch is one batch of {per_rank}")
    return dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, batch_size=per_rank)), note


# Fewer updates an epoch and an epoch's numbers reflect the first few steps (and the lr warm-up): a race cannot rank
# by them, and a run's BatchNorm statistics and lr schedule have little to work with.
MIN_UPDATES = 10
AIMED_UPDATES = 4 * MIN_UPDATES  # what advice (and a folder's batch, recipe.model_defaults) aims at
MIN_BN_BATCH = 16  # below it a BatchNorm network's batch statistics are noise: never advised for one


def power_of_two(n: int) -> int:
    """The largest power of two <= n (1 for n < 2)."""
    return 1 << (max(n, 1).bit_length() - 1)


def smallest_batch(model: str) -> int:
    """The smallest batch advised or chosen for `model`: MIN_BN_BATCH for a BatchNorm network, else 2."""
    return MIN_BN_BATCH if has_batchnorm(model) else 2


def more_updates(images: int, model: str, verb: str = "train") -> str:
    """How to get at least MIN_UPDATES updates an epoch: a smaller batch (a power of two, at least MIN_BN_BATCH
    for a BatchNorm network), or more images (`verb`: what to do on them)."""
    smallest = smallest_batch(model)
    batch = power_of_two(images // AIMED_UPDATES)  # aim at 40 updates, else at least 10
    if batch < smallest:
        batch = power_of_two(images // MIN_UPDATES)
    if batch < smallest:
        return (f"{images} training images are too few for {MIN_UPDATES} batches of {smallest} or more"
                + (" (BatchNorm needs them)" if smallest > 2 else "") + f": {verb} on more data")
    return f"use a smaller batch, e.g. -b {batch} ({images // batch} updates/epoch)"
