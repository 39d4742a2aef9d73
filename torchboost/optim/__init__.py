"""Optimizers and schedules: THOR (second-order), parameter groups, per-update learning-rate arrays."""

from torchboost.optim.groups import param_groups
from torchboost.optim.schedules import build_lr_schedule
from torchboost.optim.thor import THOR, get_thor_damping, get_thor_lr, thor

__all__ = ["THOR", "thor", "get_thor_lr", "get_thor_damping", "param_groups", "build_lr_schedule"]
