"""Config -> data sets: which `torchboost.data` constructor a `DataConfig` names, with what arguments.

The data library takes explicit arguments; the defaults that depend on the kind of data (a folder's 3
channels and 224 px, an in-memory set's native size) are decided here, in one place.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable

from torch.utils.data import Dataset

from torchboost.data import (IMAGENET_MEAN, IMAGENET_STD, DeviceDecode, EvalTransform, ImageFolder, SyntheticImages,
                             TensorImageDataset, eval_transform, train_transform)
from torchboost.data.device_decode import nvjpeg
from torchboost.data.folder import find_classes, sample_folder
from torchboost.data.holdout import selection_split, stratified_subset
from torchboost.data.mixup import MixedBatches, Mixup
from torchboost.splits import EVAL_SPLITS, SPLITS
from torchboost.errors import ConfigError, DataError
from torchboost.recipe.config import Config, DataConfig
from torchboost.recipe.kinds import get_kind
from torchboost.train.device import resolve_device

# Folder and synthetic image size when data.image_size is not set: what each model is designed for.
DEFAULT_SIZE = {"mnist_cnn": 28}
FOLDER_SIZE = 224
SMALL_IMAGE = 64  # images this small: a ResNet with its small_input stem, a shift augmentation (larger: native to 224)
DEFAULT_STATS = {3: (IMAGENET_MEAN, IMAGENET_STD), 1: ((0.5,), (0.5,))}  # folders without data.mean




def _split_dir(root: Path, split: str, exact: bool = False) -> Path:
    """The folder of `split` under `root`: train/, or for "val"/"test" the run's evaluation split (val/, else
    test/), or with `exact` the folder of that name, refused (saying what there is) when missing."""
    if not root.is_dir():
        raise DataError(f"data folder {root} does not exist", "check data.path (or --data DIR)")
    if split not in SPLITS:  # never a path: "../../x" must not fall back to test/
        raise DataError(f"unknown split {split!r} for an image folder", "use train, val or test")
    names = (split,) if split == "train" or exact else EVAL_SPLITS
    for name in names:
        if (root / name).is_dir():
            return root / name
    if exact:
        raise _no_split(split, str(root), [n for n in SPLITS if (root / n).is_dir()])
    raise DataError(f"no {'/ or '.join(names)}/ folder in {root}",
                    "a folder data set holds train/ and val/ (or test/), each with one sub-folder per class")


def _no_split(split: str, where: str, have: list[str]) -> DataError:
    options = [n for n in have if n != "train"] or have  # an evaluation split first
    return DataError(f"{where} has no {split} split (it has: {', '.join(have) or 'none'})",
                     f"use {' or '.join(f'--split {n}' for n in options)}" if have else
                     "check data.path (or --data DIR)")


def _kind_split(cfg: DataConfig, split: str, exact: bool) -> str:
    """The split a kind with its own storage (shards) reads for `split`, picked as `_split_dir` picks a folder's
    from the splits the kind says it holds."""
    kind = get_kind(cfg.dataset)
    if kind.splits is None:
        return split
    have = kind.splits(cfg)
    if exact and split not in have:
        raise _no_split(split, f"{cfg.path} ({cfg.dataset})", have)
    names = (split,) if split == "train" or exact else EVAL_SPLITS
    return next((n for n in names if n in have), split)  # none: the kind's reader says what is missing


def folder_geometry(cfg: DataConfig) -> tuple[int, int, tuple, tuple]:
    """(channels, image size, mean, std) of a folder or synthetic set: the config's, else defaults.
    (A run fills channels and image_size in `load_data` first, from the images and the model.)"""
    channels, size = cfg.channels or 3, cfg.image_size or FOLDER_SIZE
    default_mean, default_std = DEFAULT_STATS.get(channels, ((), ()))
    mean = tuple(cfg.mean) if cfg.mean is not None else default_mean
    std = tuple(cfg.std) if cfg.std is not None else default_std
    if len(mean) != channels or len(std) != channels:
        raise ConfigError(f"data.channels={channels} needs data.mean and data.std with {channels} values each",
                          "set data.channels to 1 or 3 and matching data.mean / data.std")
    return channels, size, mean, std


ZOOM_CROP = 0.875  # the ImageNet convention for photos larger than the input: resize to size / 0.875, crop


def eval_crop(cfg: DataConfig, largest_side: int | None = None) -> float:
    """The evaluation centre crop (`data.crop_pct`), derived from how training saw the images when unset: 1.0
    (the whole image, never zoomed) for in-memory sets (stored at their native size), the shift augmentation
    (which trains on whole images) and images no larger than the input (`largest_side`, from a sample); else
    ZOOM_CROP. The one rule, for the run's validation, `eval`, `predict`, the best checkpoint and export."""
    if cfg.crop_pct is not None:
        return cfg.crop_pct
    small = largest_side is not None and cfg.image_size is not None and largest_side <= cfg.image_size
    whole = get_kind(cfg.dataset).in_memory or cfg.augment == "shift" or small
    return 1.0 if whole else ZOOM_CROP


def eval_preprocess(cfg: DataConfig) -> EvalTransform:
    """A run's evaluation preprocessing of an image (a folder's or shard's evaluation split, and every file
    `predict` reads): its resize + centre crop (`eval_crop`) and statistics. An in-memory set (MNIST, digits)
    is stored at its native size: a file is resized to that size, whole, with the set's statistics."""
    if cfg.image_size is None and get_kind(cfg.dataset).in_memory:  # a config not resolved from its data
        ds = build_dataset(cfg, "test")
        cfg = dataclasses.replace(cfg, image_size=ds.images.shape[-1], mean=list(ds.mean), std=list(ds.std),
                                  channels=ds.images.shape[1])
    _, size, mean, std = folder_geometry(cfg)
    return eval_transform(size, mean, std, eval_crop(cfg), uint8=cfg.normalize_on_device)


def _check_tensor_set(cfg: DataConfig, ds: TensorImageDataset) -> None:
    """In-memory sets come at their native size: say so instead of silently resizing."""
    _, c, h, _ = ds.images.shape
    if cfg.image_size not in (None, h):
        raise ConfigError(f"{cfg.dataset} images are {h}×{h} but data.image_size={cfg.image_size}",
                          f"set data.image_size={h} (or leave it unset)")
    if cfg.channels not in (None, c):
        raise ConfigError(f"{cfg.dataset} images have {c} channel(s) but data.channels={cfg.channels}",
                          f"set data.channels={c} (or leave it unset)")
    if cfg.mean is not None or cfg.std is not None:
        mean, std = cfg.mean or ds.mean, cfg.std or ds.std
        if len(mean) != c or len(std) != c:
            raise ConfigError(f"data.mean/std need {c} value(s) for {cfg.dataset}", "give one per channel")
        ds.set_stats(mean, std)


def resolve_augment(cfg: DataConfig, model_name: str) -> str:
    """What `data.augment: auto` stands for: ImageNet's crops suit photos for the ImageNet-style networks (every
    one but the MNIST CNN), not 28-px digits; otherwise shifts when random_shift > 0, else none. The one rule,
    for every caller."""
    if cfg.augment != "auto":
        return cfg.augment
    small = cfg.image_size is not None and cfg.image_size <= SMALL_IMAGE
    if get_kind(cfg.dataset).decoded and model_name != "mnist_cnn" and not small:
        return "imagenet"
    return "shift" if cfg.random_shift else "none"


def folder_train_transform(cfg: DataConfig, model_name: str) -> Any:
    """The training transform of a decoded-per-sample set: size, statistics and the augmentation `auto`
    stands for (what `train` and `bench` use)."""
    _, size, mean, std = folder_geometry(cfg)
    augment = resolve_augment(cfg, model_name)
    return train_transform(size, mean, std, uint8=cfg.normalize_on_device, augment=augment,
                           rrc_scale=tuple(cfg.rrc_scale), crop_pct=eval_crop(cfg),
                           shift=cfg.random_shift if augment == "shift" else 0, auto_augment=cfg.auto_augment,
                           randaugment_ops=cfg.randaugment_ops, randaugment_magnitude=cfg.randaugment_magnitude,
                           random_erasing=cfg.random_erasing)


def host_augments(d: DataConfig) -> list[str]:
    """The augmentations `d` asks for that need the decoded image in the loader, as `key=value`: decoding on the
    device cannot apply them (a policy or erasing on each crop, shifts, mixing in the loader's batches)."""
    off = {"auto_augment": "none", "random_erasing": 0.0, "mixup_alpha": 0.0, "cutmix_alpha": 0.0}
    found = [f"data.{k}={getattr(d, k)}" for k, v in off.items() if getattr(d, k) != v]
    return found + (["data.augment=shift"] if d.augment == "shift" else [])


def resolve_decode(d: DataConfig, device: str) -> str:
    """What `data.decode: auto` stands for: device when the run trains on CUDA, torchvision's nvJPEG imports,
    the kind decodes image files and no augmentation needs the decoded image in the loader; else cpu. An
    explicit `device` with an augmentation only `auto` resolved (shift, for small images) is refused."""
    if d.decode == "cpu" or not get_kind(d.dataset).decoded:
        return "cpu"
    if d.decode == "device":
        found = host_augments(d)
        if found:  # validation refused those set by hand: this is what `augment: auto` gave small images
            raise ConfigError(f"data.decode=device cannot apply {found[0]}, which needs the decoded image in the "
                              "loader", "set data.decode=cpu (data.augment=auto shifts small images, cheap to decode)")
        return "device"
    if host_augments(d) or resolve_device(device).type != "cuda":
        return "cpu"
    try:
        nvjpeg(3)
    except ConfigError:
        return "cpu"
    return "device"


def uint8_batches(d: DataConfig) -> bool:
    """Batches leave the loader as uint8 and are normalised on the device: data.normalize_on_device, or
    data.decode=device (the images are made there)."""
    return d.normalize_on_device or d.decode == "device"


def input_norm(d: DataConfig) -> tuple[list[float], list[float]] | None:
    """The (mean, std) a step normalises uint8 batches with (`uint8_batches`); None for float batches."""
    return (d.mean, d.std) if uint8_batches(d) else None


def mixed(cfg: Config, d: DataConfig, train_ds: Dataset) -> Dataset:
    """The training set with mixup/cutmix on its batches when data.mixup_alpha or cutmix_alpha is set (the
    classes: model.num_classes, else the data's; targets smoothed by train.label_smoothing, timm's way)."""
    if not (d.mixup_alpha > 0 or d.cutmix_alpha > 0):
        return train_ds
    mixup = Mixup(cfg.model.num_classes or len(train_ds.classes), d.mixup_alpha, d.cutmix_alpha, d.mixup_prob,
                  d.mixup_switch_prob, cfg.train.label_smoothing)
    return MixedBatches(train_ds, mixup)


SMALL_MODEL, PHOTO_MODEL = "resnet20", "resnet18"  # what `train --data DIR` trains when no model is chosen


def model_for_data(cfg: DataConfig) -> tuple[str, str]:
    """(model name, why) for data a user brought without choosing a model: a sample of the training images
    decides. Small images (<= SMALL_IMAGE px): the CIFAR-style ResNet-20 at their native size; larger ones
    (photos): ResNet-18 at their native size up to FOLDER_SIZE px. Both have BatchNorm, which trains from the default recipe's lr
    on any image statistics (the MNIST CNN does not: at chance on small colour images)."""
    kind = get_kind(cfg.dataset)
    sample = kind.source.sample(cfg) if kind.source.sample else sample_folder(_split_dir(Path(cfg.path), "train"))
    colour = f"{sample.channels} channel(s) ({sample.gray} grey / {sample.color} colour sampled)"
    if sample.largest_side <= SMALL_IMAGE:
        return SMALL_MODEL, (f"the sampled images are at most {sample.largest_side} px, {colour}: {SMALL_MODEL}, "
                             f"a ResNet for small images, at their native {sample.largest_side} px")
    size = min(sample.largest_side, FOLDER_SIZE)
    return PHOTO_MODEL, (f"the sampled images reach {sample.largest_side} px, {colour}: {PHOTO_MODEL} at {size} px, "
                         + ("the ImageNet input" if size == FOLDER_SIZE else "their native size"))


def small_stem(model_name: str, image_size: int | None) -> bool:
    """A ResNet's 7x7/2 stem + max-pool would leave 1-2 pixels of a small image: the 3x3 stride-1 stem then."""
    return model_name.startswith("resnet") and (image_size or 0) <= SMALL_IMAGE


def build_dataset(cfg: DataConfig, split: str, num_classes: int | None = None, model_name: str = "",
                  exact: bool = False, augment: bool | None = None) -> Dataset:
    """The `split` ("train" or "test"; "valid" for paddle_json) of the data set `cfg` describes. For a folder or
    shards, "test" (or "val") is the run's evaluation split: val, else test; with `exact`, the split of that
    name (what `eval --split` reads). `num_classes` only sets the label range of a kind without its own
    labels (synthetic). `augment`: the training augmentation (default: for the train split only; False reads
    the train split as evaluation reads, for a validation split carved from it)."""
    uint8 = cfg.normalize_on_device
    kind = get_kind(cfg.dataset)
    augment = split == "train" if augment is None else augment
    if kind.decoded:  # an image folder or shards, decoded per sample
        transform = folder_train_transform(cfg, model_name) if augment else eval_preprocess(cfg)
        if cfg.decode == "device":  # workers ship the encoded JPEGs and their crops (data.device_decode)
            transform = DeviceDecode(transform)
        if not kind.folder:
            return kind.source.open_split(cfg, _kind_split(cfg, split, exact), transform)
        return ImageFolder(_split_dir(Path(cfg.path), split, exact), transform, cfg.skip_corrupt,
                           drop_corrupt=split != "train")
    if kind.drawn:  # synthetic images of drawn classes
        channels, size, _, _ = folder_geometry(cfg)
        n = cfg.synthetic_size if split == "train" else max(1, cfg.synthetic_size // 10)
        return SyntheticImages(n, num_classes or 1000, channels, size, seed=int(split != "train"), uint8=uint8)
    ds = kind.source.load(cfg, split, num_classes)
    _check_tensor_set(cfg, ds)
    ds.uint8 = uint8
    ds.shift = cfg.random_shift if augment else 0
    ds.flip = cfg.flip if augment else "none"
    return ds


def has_test_split(cfg: DataConfig) -> bool:
    """Whether the data holds a test split besides the split a run evaluates each epoch (a folder or shards
    with val and test): one no choice of the run has seen. An in-memory set evaluates on its test split."""
    kind = get_kind(cfg.dataset)
    if not kind.decoded:
        return False
    if kind.splits is not None:
        return set(EVAL_SPLITS) <= set(kind.splits(cfg))
    root = Path(cfg.path)
    return all((root / name).is_dir() for name in EVAL_SPLITS)


def eval_split_name(cfg: DataConfig) -> str:
    """The name of the split a run evaluates each epoch: a folder's val (else test), a kind's own, else test."""
    kind = get_kind(cfg.dataset)
    if kind.decoded:
        return _kind_split(cfg, "test", False) if kind.splits else _split_dir(Path(cfg.path), "test").name
    return "test"


def split_source(cfg: DataConfig, split: str, exact: bool = False) -> str:
    """What `build_dataset(cfg, split, exact=exact)` reads, for people: a folder's split folder, else the data
    set and the split's name."""
    kind = get_kind(cfg.dataset)
    if split != "train" and cfg.holdout and not exact:  # `train` with data.holdout evaluates on held-out images
        return f"{cfg.holdout} images held out of {split_source(cfg, 'train')}"
    if kind.folder:
        return f"{_split_dir(Path(cfg.path), split, exact)} ({cfg.dataset})"
    name = _kind_split(cfg, split, exact) if kind.decoded else split
    return f"{cfg.path} ({cfg.dataset}), split {name}" if cfg.path else f"{cfg.dataset}, split {name}"


def train_classes(cfg: DataConfig) -> list[str]:
    """The class names of the training split, from a folder's class folders alone where it is one (no image
    is listed or read)."""
    kind = get_kind(cfg.dataset)
    if kind.folder:
        return find_classes(_split_dir(Path(cfg.path), "train"))
    return list(build_dataset(cfg, "train").classes)


def infer_data(cfg: Config, log: Callable[[str], None] = print, train_root: Path | None = None) -> DataConfig:
    """`cfg.data` with what a decoded-per-sample set leaves unset filled in from a sample of its training
    images (under `train_root`, default the train/ split of data.path) and the model: channels (the
    majority), image size (images smaller than FOLDER_SIZE keep their native size, never upscaled; larger ones
    what the model is built for),
    statistics, a small shift for small images with a ResNet, the augmentation `auto` stands for and where
    images are decoded (`resolve_decode`)."""
    d = cfg.data
    kind = get_kind(d.dataset)
    largest = None  # the sampled images' largest side: evaluation never zooms images this small (eval_crop)
    if not kind.in_memory:
        channels, size = d.channels or 3, d.image_size or DEFAULT_SIZE.get(cfg.model.name, FOLDER_SIZE)
        if kind.needs_path and (d.channels is None or d.image_size is None or d.crop_pct is None):
            sample = kind.source.sample(d) if kind.source.sample else sample_folder(train_root or _split_dir(Path(d.path), "train"))
            largest = sample.largest_side
            if d.channels is None:
                channels = sample.channels
                if sample.gray and sample.color:
                    log(f"note: sampled images are mixed ({sample.gray} grayscale, {sample.color} colour): training "
                        f"as {channels} channel(s), the majority; set data.channels=1 or 3 to choose")
            if d.image_size is None and sample.largest_side < FOLDER_SIZE:
                size = DEFAULT_SIZE.get(cfg.model.name, sample.largest_side)  # native: never blown up to 224
        d = dataclasses.replace(d, channels=channels, image_size=size)
        _, _, mean, std = folder_geometry(d)
        d = dataclasses.replace(d, mean=list(mean), std=list(std))
    if d.augment == "auto" and kind.decoded and not d.random_shift and d.image_size <= SMALL_IMAGE \
            and cfg.model.name != "mnist_cnn":
        d = dataclasses.replace(d, random_shift=max(1, round(d.image_size / 14)))  # small images: +-2 px at 28
    augment = resolve_augment(d, cfg.model.name)
    # a shift `auto` did not choose (a recipe's for digits, on a photo folder) is recorded as none: a resumed
    # run's config must pass validation, which refuses random_shift beside another augmentation
    d = dataclasses.replace(d, augment=augment, random_shift=d.random_shift if augment == "shift" else 0)
    d = dataclasses.replace(d, crop_pct=eval_crop(d, largest))
    return dataclasses.replace(d, decode=resolve_decode(d, cfg.train.device))


def load_data(cfg: Config, log: Callable[[str], None] = print, holdout: int = 0, exact_split: str | None = None,
              leave_out: int = 0) -> tuple[DataConfig, Dataset, Dataset]:
    """(data config with every inferred key filled in, training set, evaluation set) of a run.

    Inferred: a folder's channels (the majority of a sample across classes) and image size (small images
    keep their native size; larger ones what the model is built for), the augmentation `auto` stands for,
    and an in-memory set's size, channels and statistics. The evaluation split must have the training
    split's classes. With data.mixup_alpha or cutmix_alpha the training set comes out in mixed batches
    (`mixed`). `data.train_subset`: the training split is that stratified subset of it (a fixed draw).
    `holdout` > 0: the evaluation set is that many training samples (stratified, unaugmented) — a validation
    split, so a selection never sees the test split — drawn from outside `data.train_subset` when one is set
    (training uses the subset), else carved from the training split (training uses the rest; `selection_split`).
    `leave_out` > 0: training leaves out the samples a holdout of that size holds (a confirmation trains on its
    selection's training images), the evaluation set unchanged. `exact_split`:
    the evaluation set is the split of that name (a folder without it is refused), not the run's val-else-test
    (a confirmation race reads the test split, never val/)."""
    d = infer_data(cfg, log)
    kind = get_kind(d.dataset)
    if holdout and not kind.carvable:
        raise ConfigError(f"a validation split cannot be carved from streamed {d.dataset} data",
                          "select on a folder or an in-memory set, or export a validation split as shards")
    train_ds = build_dataset(d, "train", cfg.model.num_classes, cfg.model.name)
    # a holdout evaluates on training images: the evaluation split is not even read
    eval_ds = None if holdout else build_dataset(d, exact_split or "test", cfg.model.num_classes,
                                                 exact=exact_split is not None)
    if eval_ds is not None and kind.own_labels and list(eval_ds.classes) != list(train_ds.classes):
        missing = sorted(set(train_ds.classes) - set(eval_ds.classes))
        extra = sorted(set(eval_ds.classes) - set(train_ds.classes))
        raise DataError("the evaluation split's classes differ from the training split's (" + "; ".join(
            part for part in (f"missing: {', '.join(missing[:5])}" if missing else "",
                              f"extra: {', '.join(extra[:5])}" if extra else "") if part) + ")",
                        "give the evaluation split one folder per training class (labels are class indices)")
    if isinstance(train_ds, TensorImageDataset) and kind.in_memory:
        _, c, h, _ = train_ds.images.shape
        d = dataclasses.replace(d, channels=c, image_size=h, mean=[float(v) for v in train_ds.mean],
                                std=[float(v) for v in train_ds.std])
    if holdout or leave_out:  # after the statistics (in `d`): the whole training split's, as without a holdout
        plain = build_dataset(d, "train", cfg.model.num_classes, cfg.model.name, augment=False)
        train_ds, held = selection_split(train_ds, plain, holdout or leave_out, d.train_subset)
        eval_ds = held if holdout else eval_ds
    elif d.train_subset:  # after the statistics too (`stratified_subset`: the draw a selection trains on too)
        train_ds = stratified_subset(train_ds, d.train_subset)
    train_ds = mixed(cfg, d, train_ds)
    if d.random_shift and d.image_size and 2 * d.random_shift >= d.image_size:
        raise ConfigError(f"data.random_shift={d.random_shift} is at least half the {d.image_size}-px images: the "
                          "digits/objects would be moved out of view", f"use at most {max(1, d.image_size // 4)}")
    return d, train_ds, eval_ds
