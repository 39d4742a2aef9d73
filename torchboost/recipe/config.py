"""Recipes: YAML files -> validated dataclasses, with `--set key=value` overrides.

Every key is checked: an unknown key is an error that suggests the closest valid one (a typo must never
be ignored silently), and values are checked against the field's type.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Optional, Union

import yaml

from torchboost.errors import ConfigError, suggest

RECIPES_DIR = Path(__file__).parent / "recipes"


@dataclass
class ModelConfig:
    name: str = "mnist_cnn"
    num_classes: int = 10
    in_chans: int = 1
    zero_init_last_bn: bool = False
    init: str = "torchvision"
    small_input: bool = False
    channels_last: bool = False
    compile: bool = False  # torch.compile: faster inference, slower CPU training here (see BENCHMARKS.md)


@dataclass
class DataConfig:
    dataset: str = "mnist5k"  # mnist5k | digits | folder | mnist_idx | paddle_json | synthetic
    path: Optional[str] = None
    image_size: int = 28
    batch_size: int = 64  # per process
    eval_batch_size: int = 500
    workers: int = 0
    pin_memory: bool = False
    skip_corrupt: bool = False
    mean: Optional[list[float]] = None
    std: Optional[list[float]] = None
    crop_pct: float = 0.875
    channels: int = 1
    num_classes: int = 10
    synthetic_size: int = 1024
    # Ship uint8 batches and normalize on the device: 4x fewer bytes through workers and host-to-device copies.
    normalize_on_device: bool = False
    # In-memory sets (MNIST, digits): translate training images by up to this many pixels (0 = off).
    random_shift: int = 0


@dataclass
class OptimConfig:
    name: str = "sgd"  # sgd | thor | adamw
    lr: float = 0.05
    # When set, lr is for this global batch and is scaled linearly to the real one (lr 0.256 per 256).
    lr_reference_batch: Optional[int] = None
    momentum: float = 0.9
    nesterov: bool = False
    weight_decay: float = 0.0
    decay_bn_and_bias: bool = False
    # Per-layer L2: {"layer4.*": 1e-4, "fc.*": 0.0} (fnmatch on parameter names, first match wins).
    weight_decay_groups: dict = field(default_factory=dict)
    # Extra keyword arguments for THOR (frequency, split_dim, damping, ...); see torchboost.optim.thor.
    thor: dict = field(default_factory=dict)


@dataclass
class ScheduleConfig:
    # constant | seed_cosine (the seed's formula) | cosine (warmup + cosine) | step | poly | thor
    mode: str = "constant"
    warmup_epochs: float = 0.0
    lr_init: float = 0.0  # learning rate at the start of the warmup
    lr_end: float = 0.0
    milestones: list[float] = field(default_factory=list)  # epochs, for mode=step
    gamma: float = 0.1
    power: float = 2.0
    # THOR's lr generator (mode=thor): lr(i) = lr * (1 - e/lr_end_epoch)^lr_decay, halved after decay_epochs
    lr_decay: float = 5.0
    lr_end_epoch: float = 50.0
    decay_epochs: float = 100.0


@dataclass
class EmaConfig:
    enabled: bool = False
    decay: float = 0.9999
    warmup: Optional[str] = "timm"  # timm | nvidia | none
    warmup_gamma: float = 1.0
    warmup_power: float = 0.6666667
    buffers: str = "copy"  # copy | average


@dataclass
class TrainConfig:
    epochs: int = 3
    seed: int = 0
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    amp_level: str = "O0"  # O0 | O1 | O2 | O3
    amp_dtype: str = "auto"  # auto | bfloat16 | float16
    loss_scale: str = "none"  # none | fixed | dynamic
    loss_scale_value: float = 128.0
    drop_overflow_update: bool = False
    clip_global_norm: Optional[float] = None
    clip_value: Optional[float] = None
    accumulation_steps: int = 1
    label_smoothing: float = 0.0
    log_every: int = 50
    progress_bar: bool = True
    per_batch_accuracy: bool = False
    eval_every: int = 1
    early_stopping_patience: Optional[int] = None
    # Start from these weights only (fine-tuning, or a DimReduce second stage); --resume restores everything.
    init_weights: Optional[str] = None
    ema: EmaConfig = field(default_factory=EmaConfig)


@dataclass
class CheckpointSection:
    save_every_epochs: int = 1
    save_every_steps: int = 0
    keep_max: int = 5
    prefix: str = "checkpoint"


@dataclass
class BoostSection:
    level: str = "O0"
    config: dict = field(default_factory=dict)


@dataclass
class DistSection:
    bucket_cap_mb: float = 25.0
    fusion_config: Optional[list[int]] = None
    sync_bn: bool = False
    timeout_s: float = 300.0


@dataclass
class Config:
    name: str = "mnist-lenet"
    output: str = "runs/{name}"
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    checkpoint: CheckpointSection = field(default_factory=CheckpointSection)
    boost: BoostSection = field(default_factory=BoostSection)
    dist: DistSection = field(default_factory=DistSection)

    def to_dict(self) -> dict:
        return asdict(self)


def _check_value(value: Any, tp: Any, where: str) -> Any:
    """Check `value` against a field type (the few shapes our dataclasses use); coerce int -> float."""
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _check_value(value, arg, where)
            except ConfigError as e:
                errors.append(e)
        raise errors[0]
    if origin is list:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where} must be a list, got {value!r}", f"write e.g. {where}=[1, 2]")
        (item_tp,) = typing.get_args(tp) or (Any,)
        return [_check_value(v, item_tp, f"{where}[{i}]") for i, v in enumerate(value)]
    if tp is Any:
        return value
    if tp is dict or origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where} must be a mapping, got {value!r}", f"write e.g. {where}={{key: value}}")
        return value
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    # bool is a subclass of int: `epochs: true` must not pass as 1.
    if not isinstance(value, tp) or (tp is int and isinstance(value, bool)):
        raise ConfigError(
            f"{where} must be {tp.__name__}, got {type(value).__name__} {value!r}",
            f"give a {tp.__name__} value",
        )
    return value


def _merge(obj: Any, data: dict, prefix: str = "") -> None:
    """Merge a nested dict into a dataclass instance in place, validating every key and value."""
    if not isinstance(data, dict):
        raise ConfigError(f"section '{prefix.rstrip('.') or 'root'}' must be a mapping", "check the recipe's indentation")
    hints = typing.get_type_hints(type(obj))
    names = [f.name for f in dataclasses.fields(obj)]
    for key, value in data.items():
        where = f"{prefix}{key}"
        if key not in names:
            raise ConfigError(f"unknown config key '{where}'", suggest(where, [f"{prefix}{n}" for n in names]))
        current = getattr(obj, key)
        if dataclasses.is_dataclass(current):
            _merge(current, value, f"{where}.")
        elif isinstance(current, dict) and isinstance(value, dict):  # free-form sections merge key by key
            setattr(obj, key, _deep_merge(current, value))
        else:
            setattr(obj, key, _check_value(value, hints[key], where))


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


def parse_override(item: str) -> tuple[list[str], Any]:
    """`a.b.c=value` -> (["a","b","c"], value parsed as YAML, so 0.1 is a float and [1,2] a list)."""
    if "=" not in item:
        raise ConfigError(f"override '{item}' is not key=value", "write e.g. --set train.epochs=5")
    key, raw = item.split("=", 1)
    try:
        value = yaml.safe_load(raw) if raw != "" else ""
    except yaml.YAMLError:
        value = raw
    return key.strip().split("."), value


def load_config(recipe: Optional[str] = None, overrides: Optional[list[str]] = None) -> Config:
    """Defaults <- recipe YAML <- overrides, validated at each step."""
    cfg = Config()
    if recipe is not None:
        path = resolve_recipe(recipe)
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"recipe {path} is not valid YAML ({str(e).splitlines()[0]})", "fix the YAML syntax") from None
        _merge(cfg, data)
    for item in overrides or []:
        keys, value = parse_override(item)
        nested: Any = value
        for k in reversed(keys):
            nested = {k: nested}
        _merge(cfg, nested)
    validate(cfg)
    return cfg


_CHOICES = {
    "train.amp_level": ("O0", "O1", "O2", "O3"),
    "train.amp_dtype": ("auto", "bfloat16", "float16"),
    "train.loss_scale": ("none", "fixed", "dynamic"),
    "train.ema.buffers": ("copy", "average"),
    "schedule.mode": ("constant", "seed_cosine", "cosine", "step", "poly", "thor"),
    "optim.name": ("sgd", "thor", "adamw"),
    "boost.level": ("O0", "O1", "O2"),
    "data.dataset": ("mnist5k", "digits", "folder", "mnist_idx", "paddle_json", "synthetic"),
}


def validate(cfg: Config) -> None:
    """Cross-field checks that types alone cannot express."""
    for dotted, choices in _CHOICES.items():
        obj: Any = cfg
        for part in dotted.split("."):
            obj = getattr(obj, part)
        if obj not in choices:
            raise ConfigError(f"{dotted}={obj!r} is not one of {', '.join(choices)}", suggest(str(obj), list(choices)))
    positive = {
        "train.epochs": cfg.train.epochs,
        "train.accumulation_steps": cfg.train.accumulation_steps,
        "data.batch_size": cfg.data.batch_size,
        "data.eval_batch_size": cfg.data.eval_batch_size,
        "data.image_size": cfg.data.image_size,
    }
    for key, value in positive.items():
        if value < 1:
            raise ConfigError(f"{key} must be >= 1, got {value}", f"set {key} to a positive value")
    if cfg.data.dataset in ("folder", "mnist_idx", "paddle_json") and not cfg.data.path:
        raise ConfigError(f"data.dataset={cfg.data.dataset} needs a data path", "pass --data DIR (or --set data.path=...)")
    if cfg.train.loss_scale != "none" and cfg.train.loss_scale_value <= 0:
        raise ConfigError("train.loss_scale_value must be > 0", "e.g. --set train.loss_scale_value=128")


def dump_config(cfg: Config, path: Path) -> None:
    """The resolved config, saved next to the checkpoints so a run can be reproduced."""
    path.write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
