"""Optimizers and schedules: THOR (second-order) and its preconditioner, Muon + AdamW, parameter groups,
per-update learning-rate arrays."""

from torchboost.optim.groups import param_groups
from torchboost.optim.muon import MuonAdamW, muon_optimizer
from torchboost.optim.schedules import build_lr_schedule
from torchboost.optim.thor import (THOR, ThorPreconditioned, ThorPreconditioner, check_thor_options, get_thor_damping,
                                   get_thor_lr, thor_muon)

__all__ = ["THOR", "ThorPreconditioner", "ThorPreconditioned", "thor_muon", "check_thor_options",
           "get_thor_lr", "get_thor_damping", "MuonAdamW", "muon_optimizer", "param_groups", "build_lr_schedule"]
