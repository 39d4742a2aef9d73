"""Config -> objects: model, loss, optimizer, lr schedule, loss scaling, EMA. No training logic here.

Each builder reads a resolved, validated Config (see `recipe.run.resolve`: inferred keys filled in) and
never changes it.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from torchboost.data.synthetic import MEMORY_SHARE, physical_memory
from torchboost.errors import ConfigError
from torchboost.losses import CrossEntropySmooth
from torchboost.models import create_model
from torchboost.optim import (THOR, build_lr_schedule, get_thor_damping, get_thor_lr, muon_optimizer,
                              param_groups, thor_muon)
from torchboost.recipe.config import Config, OptimConfig
from torchboost.train.ema import ModelEMA
from torchboost.train.loss_scale import DynamicLossScaleManager, FixedLossScaleManager, LossScaleManager


def build_model(cfg: Config) -> nn.Module:
    """The network; one whose training state could not fit in memory is refused before allocating it
    (the MNIST CNN's classifier grows with the image size: 2048 px would need a 20 GB Linear)."""
    m = cfg.model
    kw: dict = {} if m.init is None else {"init": m.init}
    if m.name.startswith("resnet"):
        kw.update(zero_init_last_bn=m.zero_init_last_bn, small_input=m.small_input, padding=m.padding)
    elif m.name == "mnist_cnn":
        kw["image_size"] = cfg.data.image_size
    with torch.device("meta"):  # shapes only: no memory, no init cost
        probe = create_model(m.name, num_classes=m.num_classes, in_chans=m.in_chans, **kw)
    need = 4 * sum(p.numel() * p.element_size() for p in probe.parameters())  # weights, grads, 2 optim states
    if need > MEMORY_SHARE * physical_memory():
        raise ConfigError(f"{m.name} at data.image_size={cfg.data.image_size} with {m.num_classes} classes needs "
                          f"{need / 2**30:.1f} GiB to train, over {MEMORY_SHARE:.0%} of this machine's memory",
                          "lower data.image_size (or use a ResNet, whose size does not grow with the image)")
    return create_model(m.name, num_classes=m.num_classes, in_chans=m.in_chans, **kw)


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


MUON_LIKE = ("muon", "thor_muon")  # Muon's authors' defaults: momentum 0.95, Nesterov


def momentum(o: OptimConfig) -> float:
    """optim.momentum, or the optimizer's own default when unset."""
    return o.momentum if o.momentum is not None else 0.95 if o.name in MUON_LIKE else 0.9


def nesterov(o: OptimConfig) -> bool:
    return o.nesterov if o.nesterov is not None else o.name in MUON_LIKE


def build_optimizer(cfg: Config, model: nn.Module, lr: float, steps_per_epoch: int = 1) -> torch.optim.Optimizer:
    o = cfg.optim
    if o.name in ("sgd", "adamw"):
        groups = param_groups(model, o.weight_decay, o.decay_bn_and_bias, o.weight_decay_groups)
        # fused kernels: 2.0-2.3x faster than foreach for ResNet-50's update on this CPU (BENCHMARKS.md)
        if o.name == "adamw":
            return torch.optim.AdamW(groups, lr=lr, fused=True)
        return torch.optim.SGD(groups, lr=lr, momentum=momentum(o), nesterov=nesterov(o), fused=True)
    if o.name == "muon":
        return muon_optimizer(model, lr=lr, momentum=momentum(o), weight_decay=o.weight_decay, nesterov=nesterov(o))
    kw = dict(o.thor)  # thor / thor_muon; keys and values were checked by the validation pass
    damping = kw.pop("damping", 0.03)
    decay = kw.pop("damping_decay", None)
    if decay is not None:  # MindSpore's damping generator: damping * decay^(epoch/10), per update
        damping = get_thor_damping(0, damping, decay, cfg.train.epochs, steps_per_epoch)
    if o.name == "thor_muon":
        return thor_muon(model, lr, momentum(o), o.weight_decay, nesterov(o), damping=damping,
                         accumulation_steps=cfg.train.accumulation_steps, **kw)
    return THOR(model, lr=lr, damping=damping, momentum=momentum(o), weight_decay=o.weight_decay,
                accumulation_steps=cfg.train.accumulation_steps, **kw)


def build_schedule(cfg: Config, lr: float, steps_per_epoch: int) -> np.ndarray:
    s = cfg.schedule
    total = steps_per_epoch * cfg.train.epochs
    if s.mode == "thor":
        lrs = get_thor_lr(0, lr, s.lr_decay, int(s.lr_end_epoch), steps_per_epoch, int(s.decay_epochs))
        return np.asarray(lrs, dtype=np.float64)[:total]
    return build_lr_schedule(s.mode, lr, total, steps_per_epoch, warmup_epochs=s.warmup_epochs,
                             lr_init=s.lr_init, lr_end=s.lr_end, milestones=s.milestones, gamma=s.gamma,
                             power=s.power)


def build_loss_scale(cfg: Config, device: torch.device) -> LossScaleManager | None:
    t = cfg.train
    if t.loss_scale == "fixed":
        return FixedLossScaleManager(t.loss_scale_value, t.drop_overflow_update, device=device.type)
    if t.loss_scale == "dynamic":
        return DynamicLossScaleManager(init_loss_scale=t.loss_scale_value, device=device.type)
    return None


def build_ema(cfg: Config, model: nn.Module) -> ModelEMA | None:
    e = cfg.train.ema
    if not e.enabled:
        return None
    return ModelEMA(model, e.decay, e.warmup, e.warmup_gamma, e.warmup_power, e.buffers)
