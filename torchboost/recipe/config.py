"""Recipes: YAML files -> config dataclasses, with `--set key=value` overrides.

Every key is checked as it is merged: an unknown key is an error that suggests the closest valid one (a
typo must never be ignored silently) and a value must have the field's type. The rules on values
(choices, ranges, combinations) are checked by `recipe.validate.validate`; `recipe.load.load_config`
runs both.
Keys left at None are inferred from the data when the run starts (see `recipe.resolve.resolve`).
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

import yaml

from torchboost.errors import ConfigError, suggest
from torchboost.models import list_models
from torchboost.optim.registry import DEFAULT_OPTIMIZER, ThorRecipeOptions, list_optimizers
from torchboost.recipe.kinds import DEFAULT_KIND, list_kinds
from torchboost.options import check_type, leaf_fields, opt
from torchboost.plaindata import MAX_BYTES, check_plain, load_yaml
from torchboost.train.metrics import METRIC_ALIASES, METRIC_NAMES

RECIPES_DIR = Path(__file__).parent / "recipes"
MODELS = tuple(list_models())


@dataclass
class ModelConfig:
    name: str = opt("mnist_cnn", choices=MODELS)
    num_classes: Optional[int] = opt(None, ge=1)  # None: the data's class count
    in_chans: Optional[int] = opt(None, ge=1)  # None: the data's channel count
    zero_init_last_bn: bool = opt(False)
    init: Optional[str] = opt(None, choices=("torchvision", "mindspore", "torch", "paddle"))  # None: the model's
    padding: str = opt("torch", choices=("torch", "same"))  # same: MindSpore's pad_mode='same' (ResNets)
    # ResNets: the 3x3 stride-1 stem without max-pool, for 8-64 px images; None: on for images <= 64 px
    small_input: Optional[bool] = opt(None)
    channels_last: bool = opt(False)
    compile: bool = opt(False)  # torch.compile: faster inference, slower CPU training here (see BENCHMARKS.md)


@dataclass
class DataConfig:
    dataset: str = opt(DEFAULT_KIND, choices=tuple(list_kinds()))  # torchboost.recipe.kinds
    path: Optional[str] = opt(None)
    image_size: Optional[int] = opt(None, ge=1, le=2048)  # None: native size (in-memory sets), 224 (folders)
    channels: Optional[int] = opt(None, choices=(1, 3))  # None: the data's own (1 for MNIST, 3 for folders)
    batch_size: int = opt(64, ge=1, le=2**31 - 1)  # per process
    eval_batch_size: int = opt(500, ge=1, le=2**31 - 1)
    workers: int = opt(0, ge=0, le=1024)
    pin_memory: bool = opt(False)
    skip_corrupt: bool = opt(False)
    mean: Optional[list[float]] = opt(None)
    std: Optional[list[float]] = opt(None, gt=0)
    crop_pct: float = opt(0.875, gt=0, le=1)
    synthetic_size: int = opt(1024, ge=1, le=10_000_000)
    # Ship uint8 batches and normalize on the device: 4x fewer bytes through workers and host-to-device copies.
    normalize_on_device: bool = opt(False)
    # Training augmentation. auto: imagenet for folders of photos for ResNets; otherwise shift when
    # random_shift > 0, else none. imagenet: RandomResizedCrop(rrc_scale) + flip; flip: resize + centre crop + flip;
    # shift: resize + random translation by up to random_shift px; none: the evaluation preprocessing.
    augment: str = opt("auto", choices=("auto", "imagenet", "flip", "shift", "none"))
    rrc_scale: list[float] = opt(factory=lambda: [0.08, 1.0], gt=0, le=1)
    random_shift: int = opt(0, ge=0, le=64)


@dataclass
class OptimConfig:
    name: str = opt(DEFAULT_OPTIMIZER, choices=tuple(list_optimizers()))  # torchboost.optim.registry
    lr: float = opt(0.05, gt=0)
    # When set, lr is for this global batch and is scaled linearly to the real one (lr 0.256 per 256).
    lr_reference_batch: Optional[int] = opt(None, ge=1)
    # None: the optimizer's own default (0.9 SGD/THOR, 0.95 + Nesterov Muon/THOR-Muon); an error for optimizers
    # without momentum (AdamW)
    momentum: Optional[float] = opt(None, ge=0, lt=1)
    nesterov: Optional[bool] = opt(None)
    weight_decay: float = opt(0.0, ge=0)
    decay_bn_and_bias: bool = opt(False)
    # Per-layer L2: {"layer4.*": 1e-4, "fc.*": 0.0} (fnmatch on parameter names, first match wins).
    weight_decay_groups: dict = opt(factory=dict)
    # THOR's options, for thor and thor_muon (Muon on THOR-preconditioned gradients); see ThorPreconditioner.
    thor: ThorRecipeOptions = dataclasses.field(default_factory=ThorRecipeOptions)


@dataclass
class ScheduleConfig:
    # constant | seed_cosine (the NVIDIA recipe's formula) | cosine (warmup + cosine) | step | poly | thor
    mode: str = opt("constant", choices=("constant", "seed_cosine", "cosine", "step", "poly", "thor"))
    warmup_epochs: float = opt(0.0, ge=0)
    lr_init: float = opt(0.0, ge=0)  # learning rate at the start of the warmup
    lr_end: float = opt(0.0, ge=0)
    milestones: list[float] = opt(factory=list, ge=0)  # epochs, for mode=step
    gamma: float = opt(0.1, gt=0)
    power: float = opt(2.0, gt=0)
    # THOR's lr generator (mode=thor): lr(i) = lr * (1 - e/lr_end_epoch)^lr_decay, halved after decay_epochs
    lr_decay: float = opt(5.0, ge=0)
    lr_end_epoch: float = opt(50.0, gt=0)
    decay_epochs: float = opt(100.0, gt=0)


@dataclass
class EmaConfig:
    enabled: bool = opt(False)
    decay: float = opt(0.9999, ge=0, lt=1)
    warmup: str = opt("timm", choices=("timm", "nvidia", "none"))
    warmup_gamma: float = opt(1.0, gt=0)
    warmup_power: float = opt(0.6666667, gt=0)
    buffers: str = opt("copy", choices=("copy", "average"))


@dataclass
class TrainConfig:
    epochs: int = opt(3, ge=1, le=1_000_000)
    seed: int = opt(0, ge=0, le=2**32 - 1)  # numpy's seed range
    device: str = opt("auto")  # auto | cpu | cuda | cuda:N
    amp_level: str = opt("O0", choices=("O0", "O1", "O2", "O3"))
    amp_dtype: str = opt("auto", choices=("auto", "bfloat16", "float16"))
    loss_scale: str = opt("none", choices=("none", "fixed", "dynamic"))
    loss_scale_value: float = opt(128.0, gt=0, le=2.0**64)  # applied in float32: must stay far below 3.4e38
    drop_overflow_update: bool = opt(False)
    clip_global_norm: Optional[float] = opt(None, gt=0)
    clip_value: Optional[float] = opt(None, gt=0)
    accumulation_steps: int = opt(1, ge=1)
    label_smoothing: float = opt(0.0, ge=0, lt=1)
    metrics: list[str] = opt(factory=lambda: list(METRIC_NAMES), choices=(*METRIC_NAMES, *METRIC_ALIASES))
    log_every: int = opt(50, ge=1)
    progress_bar: bool = opt(True)
    per_batch_accuracy: bool = opt(False)
    eval_every: int = opt(1, ge=1)
    # The metric that picks the best checkpoint and drives early stopping (val_ = on the evaluation data).
    monitor: str = opt("val_top_1_accuracy", choices=("val_top_1_accuracy", "val_top_5_accuracy", "val_loss"))
    early_stopping_patience: Optional[int] = opt(None, ge=1)
    restore_best: bool = opt(False)  # end with the best epoch's weights (by train.monitor)
    # A non-finite loss: stop at once, or skip the update and stop after max_nonfinite_steps in a row.
    nonfinite: str = opt("stop", choices=("stop", "skip"))
    max_nonfinite_steps: int = opt(10, ge=1)
    # Start from these weights only (fine-tuning, or a DimReduce second stage); --resume restores everything.
    init_weights: Optional[str] = opt(None)
    # Fine-tuning: train only the classifier head for this many epochs first (then the whole network).
    freeze_backbone_epochs: int = opt(0, ge=0, le=1_000_000)
    ema: EmaConfig = dataclasses.field(default_factory=EmaConfig)


@dataclass
class CheckpointSection:
    save_every_epochs: int = opt(1, ge=0)
    save_every_steps: int = opt(0, ge=0)
    keep_max: int = opt(5, ge=1)
    save_best: bool = opt(True)  # also keep PREFIX-best.pt, the best epoch by train.monitor
    prefix: Optional[str] = opt(None)  # None: the model name


@dataclass
class BoostSection:
    level: str = opt("O0", choices=("O0", "O1", "O2"))
    config: dict = opt(factory=dict)  # MindSpore's boost_config_dict: {"boost": {...}} or its inner dict


@dataclass
class DistSection:
    bucket_cap_mb: float = opt(25.0, gt=0)
    fusion_config: Optional[list[int]] = opt(None, ge=1)
    sync_bn: bool = opt(False)
    timeout_s: float = opt(300.0, gt=0)


@dataclass
class Config:
    name: str = opt("mnist-lenet")
    output: str = opt("runs/{name}")
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    optim: OptimConfig = dataclasses.field(default_factory=OptimConfig)
    schedule: ScheduleConfig = dataclasses.field(default_factory=ScheduleConfig)
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    checkpoint: CheckpointSection = dataclasses.field(default_factory=CheckpointSection)
    boost: BoostSection = dataclasses.field(default_factory=BoostSection)
    dist: DistSection = dataclasses.field(default_factory=DistSection)

    def to_dict(self) -> dict:
        return asdict(self)


def merge(obj: Any, data: Any, prefix: str = "") -> None:
    """Merge a nested dict into a config dataclass in place, checking every key and value type."""
    if not isinstance(data, dict):
        raise ConfigError(f"section '{prefix.rstrip('.') or 'root'}' must be a mapping, got {data!r}",
                          "check the recipe's indentation, or write KEY.SUBKEY=VALUE")
    fields = {f.name: f for f in dataclasses.fields(obj)}
    hints = typing.get_type_hints(type(obj))
    for key, value in data.items():
        where = f"{prefix}{key}"
        if key not in fields:
            raise ConfigError(f"unknown config key '{where}'", _suggest_key(where, key, obj, prefix))
        current = getattr(obj, key)
        if dataclasses.is_dataclass(current):
            merge(current, value, f"{where}.")
        elif isinstance(current, dict) and isinstance(value, dict):  # free-form sections merge key by key
            setattr(obj, key, _deep_merge(current, value))
        else:
            setattr(obj, key, check_type(value, hints[key], where))


def _suggest_key(where: str, key: str, obj: Any, prefix: str) -> str:
    """The same key in another section (data.num_classes -> model.num_classes), else the closest one here."""
    elsewhere = [k for k, *_ in leaf_fields(Config()) if k.rsplit(".", 1)[-1] == key]
    if elsewhere:
        return f"did you mean '{elsewhere[0]}'?"
    return suggest(where, [f"{prefix}{f.name}" for f in dataclasses.fields(obj)])


def _deep_merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for k, v in extra.items():
        out[k] = _deep_merge(out[k], v) if isinstance(out.get(k), dict) and isinstance(v, dict) else v
    return out


def resolve_recipe(name_or_path: str) -> Path:
    """A shipped recipe name (see `torchboost recipes`) or a path to a YAML file."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.exists():
        if not path.is_file():
            raise ConfigError(f"recipe file {path} not found", "check the path or run `torchboost recipes` for shipped ones")
        return path
    shipped = RECIPES_DIR / f"{name_or_path}.yaml"
    if not shipped.is_file():
        raise ConfigError(f"unknown recipe '{name_or_path}'", suggest(name_or_path, list_recipes()))
    return shipped


def list_recipes() -> list[str]:
    return sorted(p.stem for p in RECIPES_DIR.glob("*.yaml"))


def read_yaml(path: Path) -> dict:
    """A YAML mapping from a file, with one-line errors for unreadable, non-UTF-8 or invalid files."""
    try:
        if path.stat().st_size > MAX_BYTES:  # before reading it whole
            raise ConfigError(f"{path} is {path.stat().st_size >> 10} kB", "a recipe is a few kB of YAML")
        data = load_yaml(path.read_text(encoding="utf-8"), str(path))
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path} is not UTF-8 text (byte {e.start})", "save the file as UTF-8") from None
    except OSError as e:
        raise ConfigError(f"cannot read {path}: {e.strerror}", "check the path and its permissions") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path} holds a {type(data).__name__}, not a mapping of config sections",
                          "a recipe maps section names (model, data, optim, ...) to their keys")
    return data


def parse_override(item: str) -> dict:
    """`a.b.c=value` -> {"a": {"b": {"c": value}}}, the value parsed as YAML (0.1 a float, [1,2] a list)."""
    if "=" not in item:
        raise ConfigError(f"override '{item}' is not key=value", "write e.g. --set train.epochs=5")
    key, raw = item.split("=", 1)
    try:
        value = load_yaml(raw, f"--set {key}") if raw != "" else ""
    except ConfigError:
        if any(c in raw for c in "*&{}[]"):  # YAML structure that did not parse (or an alias): say so
            raise
        value = raw  # a plain string that YAML reads oddly, e.g. "a: b"
    if isinstance(value, dict) and not raw.lstrip().startswith("{"):
        value = raw  # "?" or "a: b" is YAML block-mapping syntax; on a command line it is the text typed
    nested: Any = value
    for k in reversed(key.strip().split(".")):
        nested = {k: nested}
    return nested


def build_config(source: dict | None = None, overrides: Sequence[str] = ()) -> Config:
    """Defaults <- a recipe's mapping <- `--set` overrides, keys and types checked (values not yet)."""
    cfg = Config()
    if source:
        check_plain(source, "the config")  # a checkpoint's saved config is untrusted data too
        merge(cfg, source)
    for item in overrides:
        merge(cfg, parse_override(item))
    return cfg


def dump_config(cfg: Config) -> str:
    """The resolved config as YAML (saved next to the checkpoints so a run can be reproduced)."""
    return yaml.safe_dump(cfg.to_dict(), sort_keys=False)
