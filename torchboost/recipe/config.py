"""Recipes: YAML files -> config dataclasses, with `--set key=value` overrides.

Every key is checked as it is merged: an unknown key is an error that suggests the closest valid one (a
typo must never be ignored silently) and a value must have the field's type. The rules on values
(choices, ranges, combinations) are checked by `recipe.validation.validate`; `recipe.load.load_config`
runs both.
Keys left at None are inferred from the data when the run starts (see `recipe.resolve.resolve_config`).
Each optimizer's options section (`optim.thor`) is not a field here: `OptimConfig.options` holds one per
section of the registered optimizers (`recipe.optimizers`), written flat under `optim` in a recipe.
Over 400 lines because every recipe key is declared here, each with its default, rule and help in one field:
splitting the sections across files would scatter the one list `torchboost options` and docs/CONFIG.md read.
Finding and reading recipe files: `recipe.files`.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import yaml

from torchboost.data.sampling import FLIPS
from torchboost.deploy.metadata import MAX_INPUT, MEAN_RANGE, STD_RANGE
from torchboost.errors import ConfigError, suggest
from torchboost.models import list_models
from torchboost.optim.averaging import AVERAGES
from torchboost.optim.registry import DEFAULT_OPTIMIZER, list_optimizers
from torchboost.options import check_type, is_sections, leaf_fields, option, plain, sections
from torchboost.recipe.kinds import DEFAULT_KIND, list_kinds
from torchboost.recipe.optimizers import drop_removed, option_sections
from torchboost.plaindata import check_plain, load_yaml
from torchboost.train.metrics import METRIC_ALIASES, METRIC_NAMES
from torchboost.train.step import COMPILE_MODES, NONFINITE_POLICIES
from torchboost.train.tta import TTA_MODES

MODELS = tuple(list_models())


@dataclass
class ModelConfig:
    name: str = option("mnist_cnn", choices=MODELS, help="the network; on a folder with no recipe named, with its "
                                                           "own settings (torchboost options model.name lists them)")
    num_classes: Optional[int] = option(None, ge=1, le=1_000_000, help="classifier outputs; unset: the data's "
                                                                       "class count")
    in_chans: Optional[int] = option(None, ge=1, help="input channels; unset: the data's channel count")
    zero_init_last_bn: bool = option(False, help="ResNets: start each block's last BatchNorm scale at 0")
    init: Optional[str] = option(None, choices=("torchvision", "mindspore", "torch", "paddle"),
                                 help="weight initialisation of which framework; unset: the model's own")
    padding: str = option("torch", choices=("torch", "same"),
                          help="ResNets: 'same' is MindSpore's pad_mode='same' (needed for its checkpoints' logits)")
    small_input: Optional[bool] = option(None, help="ResNets: 3x3 stride-1 stem without max-pool for 8-64 px "
                                                    "images; unset: on for images <= 64 px")
    channels_last: bool = option(False, help="NHWC memory layout (faster convolutions on some CPUs and GPUs)")
    whiten_images: int = option(5000, ge=1, le=10_000_000, help="networks with a patch-whitening stem (airbench): "
                                                              "the training images (the first batches, as training "
                                                              "sees them) whose patch covariance sets it")


@dataclass
class DataConfig:
    dataset: str = option(DEFAULT_KIND, choices=list_kinds,
                          help="data-set kind: an image folder, tar shards or a built-in set")
    path: Optional[str] = option(None, help="the data's folder: train/<class>/ and val/<class>/ (or test/) inside")
    holdout: int = option(0, ge=0, le=2**31 - 1, help="train: evaluate on this many training images held out "
                                                     "(stratified, unaugmented; training uses the rest), never "
                                                     "reading the test split: where a recipe's choices are made")
    train_subset: Optional[int] = option(None, ge=1, le=2**31 - 1, help="train on this many images of the training "
                                         "split, stratified by class (the same number per class on a balanced set), "
                                         "drawn by a fixed seed that no run's seed changes; unset: all of them")
    image_size: Optional[int] = option(None, ge=1, le=MAX_INPUT, help="side of the square network input; unset: "
                                                                 "native size for small images, 224 for photos")
    channels: Optional[int] = option(None, choices=(1, 3), help="1 grayscale or 3 RGB; unset: what most sampled "
                                                                "images are")
    batch_size: int = option(64, ge=1, le=2**31 - 1, help="training images per step, per process")
    eval_batch_size: int = option(500, ge=1, le=2**31 - 1, help="evaluation images per step, per process")
    workers: int = option(0, ge=0, le=1024, help="loader processes decoding images (0: in the training process)")
    pin_memory: bool = option(False, help="page-locked batches for faster copies to a GPU")
    skip_corrupt: bool = option(False, help="leave out images that cannot be decoded (and say how many) "
                                            "instead of stopping")
    mean: Optional[list[float]] = option(None, ge=MEAN_RANGE[0], le=MEAN_RANGE[1],
                                         help="per-channel normalisation mean; unset: a built-in set's own, "
                                              "ImageNet's for 3-channel folders and shards, 0.5 for 1-channel ones")
    std: Optional[list[float]] = option(None, ge=STD_RANGE[0], le=STD_RANGE[1],
                                        help="per-channel normalisation std (pixels on [0, 1]); unset: as mean")
    crop_pct: Optional[float] = option(None, gt=0, le=1, help="evaluation centre crop: resize the shorter side "
                                       "to image_size / crop_pct, then crop; unset: 1.0 (the whole image, never "
                                       "zoomed) where training sees whole images (in-memory sets, the shift "
                                       "augmentation) or the images are no larger than image_size, else 0.875")
    synthetic_size: int = option(1024, ge=1, le=10_000_000, help="images in the synthetic data set")
    normalize_on_device: bool = option(False, help="ship uint8 batches and normalise on the device (4x fewer "
                                                   "bytes to copy)")
    decode: str = option("cpu", choices=("cpu", "device", "auto"),
                         help="where folders' and shards' JPEGs are decoded: cpu = in the loader workers; device = "
                              "workers ship the encoded bytes and crops, the GPU decodes (nvJPEG, through "
                              "torchvision), crops and resizes (the same crops; without CUDA Pillow decodes in the "
                              "training process); auto = device when training on CUDA with torchvision and the "
                              "augmentations allow it, else cpu")
    augment: str = option("auto", choices=("auto", "imagenet", "flip", "shift", "none"),
                          help="training augmentation: imagenet = random resized crop + flip; flip; shift = random "
                               "translation by random_shift px; none; auto: imagenet for photos and ResNets, shift "
                               "when random_shift > 0, else none")
    rrc_scale: list[float] = option(factory=lambda: [0.08, 1.0], gt=0, le=1,
                                    help="augment=imagenet: [min, max] share of the image each crop covers")
    random_shift: int = option(0, ge=0, le=64, help="augment=shift: largest translation in pixels (below half "
                                                    "the image)")
    flip: str = option("none", choices=FLIPS, help="in-memory sets: left-right mirrors of training images (with "
                                                    "or without random_shift): random = a coin per image and epoch; "
                                                    "alternate = airbench's, a coin per image the first epoch, the "
                                                    "opposite every other epoch (each image seen both ways every two "
                                                    "epochs); folders flip with augment=flip or imagenet")
    auto_augment: str = option("none", choices=("none", "randaugment", "trivialaugment"),
                               help="photo policy on each training crop, torchvision's: randaugment = randaugment_ops "
                                    "ops at randaugment_magnitude; trivialaugment = TrivialAugmentWide (one op, random "
                                    "magnitude); folders and shards")
    randaugment_ops: int = option(2, ge=1, le=14, help="auto_augment=randaugment: operations applied to each image "
                                                       "(torchvision's num_ops)")
    randaugment_magnitude: int = option(9, ge=0, le=30, help="auto_augment=randaugment: magnitude bin 0..30 of 31 "
                                                             "(torchvision's magnitude)")
    random_erasing: float = option(0.0, ge=0, le=1, help="probability of erasing a box (2-33% of the crop, aspect "
                                                         "0.3-3.3) to the mean colour (torchvision's RandomErasing); "
                                                         "folders and shards")
    mixup_alpha: float = option(0.0, ge=0, le=100, help="mixup: blend each batch with itself reversed, weight ~ "
                                                        "Beta(alpha, alpha) (timm's; 0 off, 0.2-0.8 usual; not on "
                                                        "shards); train.label_smoothing s then gives each class s/K "
                                                        "as timm does")
    cutmix_alpha: float = option(0.0, ge=0, le=100, help="cutmix: paste a box of the reversed batch, kept share ~ "
                                                         "Beta(alpha, alpha), corrected to the box (timm's; 0 off, 1.0 "
                                                         "usual)")
    mixup_prob: float = option(1.0, ge=0, le=1, help="mixup/cutmix: probability that a batch is mixed at all")
    mixup_switch_prob: float = option(0.5, ge=0, le=1, help="with mixup_alpha and cutmix_alpha both > 0: probability "
                                                            "that a batch is cut-mixed rather than mixed up")
    shuffle_buffer: int = option(1000, ge=1, le=1_000_000, help="shards: samples each process's shuffle buffer "
                                                                    "holds (more mixes better, costs memory)")
    train_shards: Optional[str] = option(None, help="shards: a brace pattern or pipe: command replacing the index's "
                                                    "training shard files, matched by position")
    eval_shards: Optional[str] = option(None, help="shards: as train_shards, for the evaluation split")


@dataclass(slots=True)  # slots: `cfg.optim.thor = ...` is an error, not an attribute nobody reads
class OptimConfig:
    name: str = option(DEFAULT_OPTIMIZER, choices=list_optimizers, help="the optimizer")
    lr: float = option(0.05, gt=0, help="base learning rate (see lr_reference_batch and schedule.*)")
    lr_reference_batch: Optional[int] = option(None, ge=1, help="when set, lr is for this global batch and is "
                                                                "scaled linearly to the real one")
    momentum: Optional[float] = option(None, ge=0, lt=1, help="unset: the optimizer's own (0.9 SGD/THOR, 0.95 "
                                                              "Muon); an error for optimizers without momentum")
    nesterov: Optional[bool] = option(None, help="Nesterov momentum; unset: the optimizer's own")
    weight_decay: float = option(0.0, ge=0, help="L2 penalty on weights")
    decay_bn_and_bias: bool = option(False, help="also decay BatchNorm scales/shifts and biases")
    head_lr_mult: float = option(1.0, gt=0, le=1e6, help="the classifier head's lr = this x the lr (fine-tuning a "
                                                         "fresh head: e.g. 10), through every schedule")
    freeze_bn_scale: bool = option(False, help="BatchNorm scales stay at their initial value (1), untrained "
                                               "(airbench's): the next conv's weights carry the scale")
    bn_bias_lr_mult: float = option(1.0, gt=0, le=1e6, help="BatchNorm shifts' lr = this x the lr, through every "
                                                          "schedule (airbench trains them at 64x, its bias_scaler)")
    weight_decay_groups: dict = option(factory=dict, help="per-layer decay: {\"layer4.*\": 1e-4, \"fc.*\": 0.0} "
                                                          "(patterns on parameter names, first match wins)")
    weight_norm: str = option("none", choices=("none", "pin"),
                              help="pin: every conv weight that feeds a BatchNorm keeps its norm from before the "
                                   "first update, with no weight decay, so the lr alone sets its relative step "
                                   "(any optimizer)")
    # optim.thor and every other registered optimizer's options section (see recipe.optimizers)
    options: dict = sections(lambda: _option_sections(), help="each optimizer's own options, by section")


def _option_sections() -> dict:
    taken = {f.name for f in dataclasses.fields(OptimConfig)}
    found = option_sections()
    clash = sorted(set(found) & taken)
    if clash:
        raise ValueError(f"optimizer options section(s) {clash} would shadow optim keys of the same name")
    return found


@dataclass
class ScheduleConfig:
    mode: str = option("constant", choices=("constant", "seed_cosine", "cosine", "step", "poly", "thor"),
                       help="lr schedule: constant, cosine (warmup + cosine), seed_cosine (NVIDIA's formula), step "
                            "(milestones), poly, thor (MindSpore's THOR formula)")
    warmup_epochs: float = option(0.0, ge=0, help="epochs of linear warmup from lr_init to lr")
    lr_init: float = option(0.0, ge=0, help="learning rate at the start of the warmup")
    lr_end: float = option(0.0, ge=0, help="learning rate at the end (cosine, poly)")
    milestones: list[float] = option(factory=list, ge=0, help="mode=step: epochs at which lr is multiplied by gamma")
    gamma: float = option(0.1, gt=0, help="mode=step: lr factor at each milestone")
    power: float = option(2.0, gt=0, help="mode=poly: the exponent")
    lr_decay: float = option(5.0, ge=0, help="mode=thor: lr(e) = lr * (1 - e / lr_end_epoch) ^ lr_decay")
    lr_end_epoch: float = option(50.0, gt=0, help="mode=thor: the epoch where that formula reaches 0")
    decay_epochs: float = option(100.0, gt=0, help="mode=thor: lr is halved after this many epochs")


@dataclass
class EmaConfig:
    enabled: bool = option(False, help="keep an exponential moving average of the weights and evaluate it")
    decay: float = option(0.9999, ge=0, lt=1, help="the average's decay per step")
    warmup: str = option("timm", choices=("timm", "nvidia", "none"), help="how decay ramps up in early steps")
    warmup_gamma: float = option(1.0, gt=0, help="warmup=timm: decay = min(decay, 1 - (1 + step / gamma) ^ -power)")
    warmup_power: float = option(0.6666667, gt=0, help="warmup=timm: the power in that formula")
    buffers: str = option("copy", choices=("copy", "average"), help="BatchNorm statistics: copied from the model "
                                                                   "or averaged too")


LOGGERS = ("tensorboard", "csv", "mlflow")


@dataclass
class MlflowSection:
    tracking_uri: Optional[str] = option(None, help="train.loggers has mlflow: the tracking store (sqlite:///PATH, "
                                                    "http://HOST:5000, ...), this key before MLFLOW_TRACKING_URI; unset: "
                                                    "MLFLOW_TRACKING_URI when set, else OUTPUT/mlflow/mlflow.db; "
                                                    "a database or file store's new experiments keep their "
                                                    "artifacts in OUTPUT/mlflow/artifacts, a server's where it says")
    experiment: Optional[str] = option(None, help="train.loggers has mlflow: the MLflow experiment; unset: the run's "
                                                  "name")


@dataclass
class TrainConfig:
    epochs: int = option(3, ge=1, le=1_000_000, help="passes over the training data")
    seed: int = option(0, ge=0, le=2**32 - 1, help="seed of every random choice (weights, order, augmentation)")
    threads: Optional[int] = option(None, ge=1, le=1024, help="torch's CPU threads per process (--threads); unset: "
                                                               "torch's default, recorded as the count that ran")
    device: str = option("auto", help="auto | cpu | cuda | cuda:N (auto: the GPU when there is one)")
    amp_dtype: str = option("none", choices=("none", "auto", "bfloat16", "float16"),
                            help="mixed precision: the forward under torch.autocast in this type; none: float32; "
                                 "auto: bfloat16, or float16 on GPUs without bfloat16 (MindSpore's amp_level is "
                                 "read too: O0 none, O1 auto, O2 auto + dynamic loss_scale for float16, O3 "
                                 "cast_network)")
    cast_network: bool = option(False, help="with amp_dtype: the network's weights in that type too (MindSpore's "
                                            "O3), not only the forward's arithmetic")
    loss_scale: str = option("none", choices=("none", "fixed", "dynamic"),
                             help="loss scaling for float16 (torch.amp.GradScaler; fixed: a constant scale)")
    loss_scale_value: float = option(128.0, gt=0, le=2.0**64, help="loss_scale=fixed: the scale (the start value "
                                                                   "for dynamic)")
    skip_overflow: bool = option(False, help="loss_scale=fixed: skip an update whose gradients overflowed "
                                             "(MindSpore's drop_overflow_update; dynamic always skips)")
    clip_global_norm: Optional[float] = option(None, gt=0, help="clip gradients to this global L2 norm")
    clip_value: Optional[float] = option(None, gt=0, help="clip every gradient element to +-this")
    accumulation_steps: int = option(1, ge=1, help="micro-batches summed per optimizer step")
    label_smoothing: float = option(0.0, ge=0, lt=1, help="share of the target spread over the other classes")
    metrics: list[str] = option(factory=lambda: list(METRIC_NAMES), choices=(*METRIC_NAMES, *METRIC_ALIASES),
                                help="what evaluation reports (top-5 only with more than 5 classes)")
    log_every: int = option(50, ge=1, help="steps between loss lines in the log")
    progress_bar: bool = option(True, help="a progress bar per epoch on a terminal")
    per_batch_accuracy: bool = option(False, help="also log training accuracy per batch (costs a sync)")
    loggers: list[str] = option(factory=lambda: ["tensorboard", "csv"], choices=LOGGERS,
                                help="where the run's metrics go: tensorboard (OUTPUT/tensorboard, when installed), csv "
                                     "(history.jsonl, .csv and .png), mlflow (see train.mlflow.*; needs pip install "
                                     "'torchboost[tracking]')")
    eval_every: int = option(1, ge=1, help="epochs between evaluations")
    precise_bn: int = option(0, ge=0, help="before each epoch's evaluation and checkpoint, recompute BatchNorm's "
                                           "running statistics at the current weights from this many training "
                                           "batches (0: the running averages; a short run's trail its weights)")
    monitor: str = option("val_top_1_accuracy", choices=("val_top_1_accuracy", "val_top_5_accuracy", "val_loss"),
                          help="the metric that picks the best checkpoint and drives early stopping")
    early_stopping_patience: Optional[int] = option(None, ge=1, help="stop after this many evaluations without "
                                                                     "improvement; unset: never")
    restore_best: bool = option(False, help="end with the best epoch's weights (by monitor)")
    average: str = option("none", choices=AVERAGES,
                          help="weight averaging around the optimizer, beside ema: swa (the equal average of the "
                               "weights from average_start on is evaluated and saved, BatchNorm recomputed at it) or "
                               "lookahead (every lookahead_k updates the weights move to slow + lookahead_alpha x "
                               "(fast - slow)); not with train.compile or schedule-free optimizers")
    average_start: float = option(0.75, ge=0, lt=1, help="average=swa: the share of the run's updates before "
                                                         "averaging begins")
    average_every: int = option(1, ge=1, le=1_000_000, help="average=swa: updates between averaged weights")
    lookahead_k: int = option(5, ge=1, le=1_000_000, help="average=lookahead: updates between syncs")
    lookahead_alpha: float = option(0.5, gt=0, le=1, help="average=lookahead: how far the slow weights move")
    test_at_end: bool = option(True, help="after the last epoch, evaluate the best checkpoint once on the test "
                                          "split when the data has one beside val (never used for any choice; "
                                          "else on the validation split), with per-class results in OUTPUT/<split>/")
    nonfinite: str = option("stop", choices=NONFINITE_POLICIES, help="a NaN/inf loss: stop at once, or skip the "
                                                                   "update (up to max_nonfinite_steps in a row)")
    max_nonfinite_steps: int = option(10, ge=1, help="nonfinite=skip: stop after this many bad steps in a row")
    init_weights: Optional[str] = option(None, help="start from these weights only (any weight format; a head "
                                                    "for other classes is re-initialised); --resume restores all")
    freeze_backbone_epochs: int = option(0, ge=0, le=1_000_000, help="fine-tuning: train only the classifier "
                                                                      "head for this many epochs first")
    compile: str = option("none", choices=tuple(COMPILE_MODES),
                          help="torch.compile the training step (forward + backward and the optimizer's step; THOR: "
                               "its update between refreshes, a refresh runs eagerly; not thor_muon, thor_ekfac or "
                               "DimReduce): default, max-autotune, or cudagraphs (CUDA graphs); the first update "
                               "compiles, and its time is printed")
    ema: EmaConfig = dataclasses.field(default_factory=EmaConfig)
    mlflow: MlflowSection = dataclasses.field(default_factory=MlflowSection)


@dataclass
class CheckpointSection:
    save_every_epochs: int = option(1, ge=0, help="epochs between checkpoints (0: none by epoch)")
    save_every_steps: int = option(0, ge=0, help="steps between checkpoints (0: none by step)")
    keep_max: int = option(5, ge=1, help="how many of the newest checkpoints are kept")
    save_best: bool = option(True, help="also keep PREFIX-best.pt, the best epoch by train.monitor")
    prefix: Optional[str] = option(None, help="checkpoint file name prefix; unset: the model name")


@dataclass
class BoostSection:
    level: str = option("O0", choices=("O0", "O1", "O2"), help="boost level: O1 = LessBN + gradient freezing, "
                                                              "O2 = O1 + Adasum")
    config: dict = option(factory=dict, help="MindSpore's boost_config_dict: {boost: {mode: ...}, less_bn: "
                                             "{...}, ...} (see the boost.config rows)")


@dataclass
class DistSection:
    bucket_cap_mb: float = option(25.0, gt=0, help="DDP gradient bucket size")
    fusion_config: Optional[list[int]] = option(None, ge=1, help="parameter indices where gradient buckets split "
                                                                 "(MindSpore's all_reduce_fusion_config)")
    sync_bn: bool = option(False, help="BatchNorm statistics across processes")
    # at most a week (604800 s): longer is a typo, and c10d's timedelta overflows (1e300 did, at the join)
    timeout_s: float = option(300.0, ge=1, le=604800, help="seconds a collective may wait for another process")
    join_timeout_s: float = option(60.0, ge=1, le=604800, help="seconds every process has to start and agree on the job "
                                                              "(config, checkpoint) before training; then timeout_s")


@dataclass
class EvalSection:
    tta: str = option("none", choices=TTA_MODES, help="test-time augmentation of every evaluation of the run "
                                                       "(validation, test at the end, eval, predict, export): flip = "
                                                       "logits averaged with the mirrored image's; flip_translate = "
                                                       "airbench's six views, the flip average of the image and of "
                                                       "it moved 1 px up-left and down-right")


@dataclass
class Config:
    name: str = option("mnist-lenet", help="the run's name (the recipe's)")
    output: str = option("runs/{name}", help="the run's folder: config, checkpoints, logs ({name} = name)")
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    optim: OptimConfig = dataclasses.field(default_factory=OptimConfig)
    schedule: ScheduleConfig = dataclasses.field(default_factory=ScheduleConfig)
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    checkpoint: CheckpointSection = dataclasses.field(default_factory=CheckpointSection)
    boost: BoostSection = dataclasses.field(default_factory=BoostSection)
    dist: DistSection = dataclasses.field(default_factory=DistSection)
    eval: EvalSection = dataclasses.field(default_factory=EvalSection)

    def to_dict(self) -> dict:
        """The config as plain data, option sections written under their names (`optim.thor`)."""
        return plain(self)


def merge(obj: Any, data: Any, prefix: str = "") -> None:
    """Merge a nested dict into a config dataclass in place, checking every key and value type."""
    if not isinstance(data, dict):
        raise ConfigError(f"section '{prefix.rstrip('.') or 'root'}' must be a mapping, got {data!r}",
                          "check the recipe's indentation, or write KEY.SUBKEY=VALUE")
    data = drop_removed(type(obj), data, prefix.rstrip("."))  # a removed key: one line saying so, not "unknown"
    fields = {f.name: f for f in dataclasses.fields(obj) if not is_sections(f)}
    pools = [getattr(obj, f.name) for f in dataclasses.fields(obj) if is_sections(f)]
    hints = typing.get_type_hints(type(obj))
    aliases = ALIASES.get(type(obj), {})
    for key, value in [*((k, v) for k, v in data.items() if k not in aliases),
                       *((k, v) for k, v in data.items() if k in aliases)]:  # an alias reads its section's keys
        where = f"{prefix}{key}"
        if key in aliases:
            aliases[key](obj, value, where)
            continue
        pool = next((p for p in pools if key in p), None)
        if pool is not None and key not in fields:  # an option section, written flat: optim.thor
            if dataclasses.is_dataclass(pool[key]):
                merge(pool[key], value, f"{where}.")
            else:  # a mapping put there in Python: merged now, checked by the validation pass
                pool[key] = _deep_merge(check_type(pool[key], dict, where), check_type(value, dict, where))
            continue
        if key not in fields:
            raise ConfigError(f"unknown config key '{where}'", _suggest_key(where, key, obj, prefix))
        current = getattr(obj, key)
        if dataclasses.is_dataclass(current):
            merge(current, value, f"{where}.")
        elif isinstance(current, dict) and isinstance(value, dict):  # free-form sections merge key by key
            setattr(obj, key, _deep_merge(current, value))
        else:
            setattr(obj, key, check_type(value, hints[key], where))


def _amp_level(train: TrainConfig, value: Any, where: str) -> None:
    """MindSpore's train.amp_level: checked now, written as the torch keys it means once every source is merged
    (`apply_amp_level`), so `--set train.amp_level=O2 --set train.amp_dtype=float16` adds loss scaling as
    `amp_level: O2, amp_dtype: float16` in one mapping does."""
    from torchboost.compat.mindspore import level_of

    level_of(check_type(value, str, where))
    train.__dict__["pending_amp_level"] = value  # not a field: never dumped, gone once applied


def apply_amp_level(train: TrainConfig) -> None:
    """The amp level given last (torchboost.compat.mindspore says what it means) as torch keys."""
    from torchboost.compat.mindspore import level_of

    name = train.__dict__.pop("pending_amp_level", None)
    if name is None:
        return
    level = level_of(name)
    if not level.autocast:
        train.amp_dtype, train.cast_network = "none", False
        return
    if train.amp_dtype == "none":
        train.amp_dtype = "auto"
    train.cast_network = level.cast_network
    if level.scale_float16 and train.amp_dtype == "float16" and train.loss_scale == "none":
        train.loss_scale = "dynamic"


def _model_compile(model: ModelConfig, value: Any, where: str) -> None:
    """The earlier model.compile (true: the network compiled), read as train.compile=default once merged."""
    model.__dict__["pending_compile"] = check_type(value, bool, where)


def _drop_overflow_update(train: TrainConfig, value: Any, where: str) -> None:
    train.skip_overflow = check_type(value, bool, where)


# MindSpore's names for keys, read where a recipe, --set or a saved config gives them; the config holds only
# torch's (`torchboost.compat.mindspore` says what each means)
ALIASES = {TrainConfig: {"amp_level": _amp_level, "drop_overflow_update": _drop_overflow_update},
           ModelConfig: {"compile": _model_compile}}


def _suggest_key(where: str, key: str, obj: Any, prefix: str) -> str:
    """The same key in another section (data.num_classes -> model.num_classes), else the closest one here."""
    elsewhere = [k for k, *_ in leaf_fields(Config()) if k.rsplit(".", 1)[-1] == key]
    if elsewhere:
        return f"did you mean '{elsewhere[0]}'?"
    here = [f.name for f in dataclasses.fields(obj) if not is_sections(f)]
    here += [name for f in dataclasses.fields(obj) if is_sections(f) for name in getattr(obj, f.name)]
    return suggest(where, [f"{prefix}{name}" for name in here])


def _deep_merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for k, v in extra.items():
        out[k] = _deep_merge(out[k], v) if isinstance(out.get(k), dict) and isinstance(v, dict) else v
    return out


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
    apply_amp_level(cfg.train)
    if cfg.model.__dict__.pop("pending_compile", False) and cfg.train.compile == "none":
        cfg.train.compile = "default"
    return cfg


def dump_config(cfg: Config) -> str:
    """The resolved config as YAML (saved next to the checkpoints so a run can be reproduced)."""
    return yaml.safe_dump(cfg.to_dict(), sort_keys=False)
