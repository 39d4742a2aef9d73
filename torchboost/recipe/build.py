"""Config -> objects: model, loss, optimizer, lr schedule, loss scaling, EMA. No training logic here.

Each builder reads a resolved, validated Config (see `recipe.resolve.resolve_config`: inferred keys filled in) and
never changes it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import numpy as np
import torch
from torch import nn

from torchboost.data.synthetic import MEMORY_SHARE, physical_memory
from torchboost.data.transforms import normalize_batch
from torchboost.errors import ConfigError
from torchboost.losses import CrossEntropySmooth
from torchboost.models import create_model, training_bytes
from torchboost.models.airbench import MAX_PATCHES, PatchCovariance, init_whitening, whitening_stem
from torchboost.optim import build_lr_schedule, get_thor_lr
from torchboost.optim.averaging import averaged
from torchboost.optim.groups import scale_lr_of
from torchboost.optim.registry import OptimizerArgs, build_optimizer, get_optimizer
from torchboost.optim.weight_norm import pin_weight_norms
from torchboost.recipe.config import Config
from torchboost.recipe.optimizers import library_options
from torchboost.train.checkpoint import classifier_head
from torchboost.train.ema import ModelEMA
from torchboost.train.loss_scale import FixedGradScaler


def build_model(cfg: Config, train_loader: Iterable = ()) -> nn.Module:
    """The network, its whitening stem (airbench's) set from `train_loader`'s first images (`whiten_from_data`);
    one whose training state could not fit in memory is refused before allocating it (the MNIST CNN's classifier
    grows with the image size: 2048 px would need a 20 GB Linear)."""
    m = cfg.model
    kw: dict = {} if m.init is None else {"init": m.init}
    if m.name.startswith("resnet"):
        kw.update(zero_init_last_bn=m.zero_init_last_bn, small_input=bool(m.small_input), padding=m.padding)
    elif m.name == "mnist_cnn":
        kw["image_size"] = cfg.data.image_size
    need = training_bytes(m.name, m.num_classes, m.in_chans, **kw)
    if need > MEMORY_SHARE * physical_memory():
        raise ConfigError(f"{m.name} at data.image_size={cfg.data.image_size} with {m.num_classes} classes needs "
                          f"{need / 2**30:.1f} GiB to train, over {MEMORY_SHARE:.0%} of this machine's memory",
                          "lower data.image_size (or use a ResNet, whose size does not grow with the image)")
    net = create_model(m.name, num_classes=m.num_classes, in_chans=m.in_chans, **kw)
    whiten_from_data(cfg, net, train_loader)
    return net


def whiten_from_data(cfg: Config, net: nn.Module, train_loader: Iterable) -> int:
    """Set the network's patch-whitening stem (`models.airbench`) from the first `model.whiten_images` training
    images the loader gives, normalised as the step normalises them; how many it used (0: the network has no
    stem, or no loader was given: a network whose weights are loaded next). Under DDP each process sets its own
    and DDP's start gives every process rank 0's."""
    stem = whitening_stem(net)
    if stem is None:
        return 0
    stats, seen = PatchCovariance(stem.in_channels, stem.kernel_size[0]), 0
    for batch in train_loader:
        x = batch[0]
        if not isinstance(x, torch.Tensor):
            raise ConfigError(f"{cfg.model.name}'s whitening stem is set from training batches, which "
                              "data.decode=device makes on the GPU during the step", "set data.decode=cpu")
        x = normalize_batch(x, cfg.data.mean, cfg.data.std) if not x.is_floating_point() else x
        x = x[:cfg.model.whiten_images - seen]
        stats.add(x)
        seen += len(x)
        if seen >= cfg.model.whiten_images or stats.count >= MAX_PATCHES:
            break
    if seen:
        init_whitening(stem, stats)
    return seen


def build_loss(cfg: Config) -> nn.Module:
    return CrossEntropySmooth(sparse=True, reduction="mean", smooth_factor=cfg.train.label_smoothing,
                              num_classes=cfg.model.num_classes)


def effective_lr(cfg: Config, world_size: int) -> float:
    """`optim.lr`, scaled linearly when it is given per `optim.lr_reference_batch` images (0.256 per 256)."""
    if cfg.optim.lr_reference_batch is None:
        return cfg.optim.lr
    return cfg.optim.lr * global_batch(cfg, world_size) / cfg.optim.lr_reference_batch


def global_batch(cfg: Config, world_size: int) -> int:
    """Images per optimizer update across all processes."""
    return cfg.data.batch_size * world_size * cfg.train.accumulation_steps


def with_optimizer(cfg: Config, name: str) -> Config:
    """The recipe's config with optimizer `name`, as `race` and `lr-find` build each optimizer they compare: the
    recipe's own optim values when it names the same optimizer, else that optimizer's defaults for momentum,
    Nesterov and which parameters decay (the weight decay, its per-layer groups where supported, and the options
    sections such as `optim.thor` carry)."""
    o = cfg.optim
    if name != o.name:
        entry = get_optimizer(name)
        o = dataclasses.replace(o, name=name, momentum=None, nesterov=None,
                                weight_decay_groups=o.weight_decay_groups if entry.weight_decay_groups else {},
                                decay_bn_and_bias=False)
    return dataclasses.replace(cfg, optim=o)


def optimizer_args(cfg: Config, lr: float, steps_per_epoch: int) -> OptimizerArgs:
    """The registry's builder arguments from a config's `optim.*` (the same for `train` and `race`): its
    options section in updates (`recipe.optimizers.library_options`)."""
    o = cfg.optim
    entry = get_optimizer(o.name)
    section = o.options.get(entry.options_key, {}) if entry.options_key else None
    return OptimizerArgs(lr=lr, momentum=o.momentum, nesterov=o.nesterov, weight_decay=o.weight_decay,
                         decay_bn_and_bias=o.decay_bn_and_bias, weight_decay_groups=dict(o.weight_decay_groups),
                         options=library_options(entry, section, steps_per_epoch, cfg.train.epochs),
                         accumulation_steps=cfg.train.accumulation_steps)


def optimizer_from_config(cfg: Config, model: nn.Module, lr: float, steps_per_epoch: int = 1) -> torch.optim.Optimizer:
    """`optim.name`'s registry entry built for `model` (`torchboost.optim.registry.build_optimizer`), the
    classifier head at `optim.head_lr_mult` times the lr, BatchNorm's shifts at `optim.bn_bias_lr_mult` times it
    and its scales frozen with `optim.freeze_bn_scale` (which sets their requires_grad: call it before DDP wraps
    the model), inside `train.average`'s averaging (`optim.averaging`)."""
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._NormBase) and m.affine]
    if cfg.optim.freeze_bn_scale:  # before the groups are built: a frozen scale is in none of them
        for m in norms:
            m.weight.requires_grad_(False)
    optimizer = build_optimizer(cfg.optim.name, model, optimizer_args(cfg, lr, steps_per_epoch))
    if cfg.optim.head_lr_mult != 1:
        named = dict(model.named_parameters())
        scale_lr_of(optimizer, [named[n] for n in classifier_head(model)], cfg.optim.head_lr_mult, "classifier head")
    if cfg.optim.bn_bias_lr_mult != 1:
        scale_lr_of(optimizer, [m.bias for m in norms], cfg.optim.bn_bias_lr_mult, "BatchNorm shifts")
    if cfg.optim.weight_norm == "pin":
        pin_weight_norms(model, optimizer)
    t = cfg.train
    return averaged(optimizer, t.average, steps_per_epoch * t.epochs, t.average_start, t.average_every,
                    t.lookahead_k, t.lookahead_alpha)


def build_schedule(cfg: Config, lr: float, steps_per_epoch: int) -> np.ndarray:
    s = cfg.schedule
    total = steps_per_epoch * cfg.train.epochs
    if s.mode == "thor":
        lrs = get_thor_lr(0, lr, s.lr_decay, int(s.lr_end_epoch), steps_per_epoch, int(s.decay_epochs))
        return np.asarray(lrs, dtype=np.float64)[:total]
    return build_lr_schedule(s.mode, lr, total, steps_per_epoch, warmup_epochs=s.warmup_epochs,
                             lr_init=s.lr_init, lr_end=s.lr_end, milestones=s.milestones, gamma=s.gamma,
                             power=s.power)


def build_grad_scaler(cfg: Config, device: torch.device) -> torch.amp.GradScaler | None:
    """train.loss_scale as a GradScaler: dynamic halves on overflow and doubles after 2000 clean updates
    (MindSpore's and torch's defaults agree)."""
    t = cfg.train
    if t.loss_scale == "fixed":
        return FixedGradScaler(t.loss_scale_value, t.skip_overflow, device=device.type)
    if t.loss_scale == "dynamic":
        return torch.amp.GradScaler(device.type, init_scale=t.loss_scale_value, growth_interval=2000)
    return None


def build_ema(cfg: Config, model: nn.Module) -> ModelEMA | None:
    e = cfg.train.ema
    if not e.enabled:
        return None
    return ModelEMA(model, e.decay, e.warmup, e.warmup_gamma, e.warmup_power, e.buffers)
