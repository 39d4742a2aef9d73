"""Turn a `BoostPlan` into a changed model, the StepHooks for `TrainStep`, and (dim_reduce) the optimizer.

How the trainer (`recipe.run`) uses it (the model on its device; before the EMA copy, the optimizer and DDP
exist):

    plan = resolve_boost(cfg.boost.level, cfg.boost.config, world_size=info.world_size)   # config errors
    log(plan.describe())                                                                 # training start
    net, hooks = build_boost(plan, net, total_steps=updates_per_epoch * epochs, world_size=info.world_size,
                             seed=cfg.train.seed)                                        # same seed on all ranks
    optimizer = boost_optimizer(plan, net) or optimizer_from_config(cfg, net, lr)        # DimReduce or yours
    ema = build_ema(cfg, net); wrap DDP unless Adasum is among the hooks (it needs unwrapped models)
    TrainStep(..., hooks=hooks, accumulation=plan.grad_accumulation_step)

With grad_freeze under DDP, pass find_unused_parameters=True (frozen layers produce no gradient).
For evaluating a boost-trained checkpoint, call `transform_model(plan, net)` before loading the weights:
less_bn changes the module structure and the state-dict keys.
"""

from __future__ import annotations

import torch
from torch import nn

from torchboost.train.hooks import StepHook

from .config import BoostPlan, check_world_size
from .dim_reduce import build_dim_reduce
from .grad_freeze import GradFreeze
from .gradient_centralization import GradCentralization, gc_parameters
from .less_bn import apply_less_bn


def transform_model(plan: BoostPlan, model: nn.Module) -> nn.Module:
    """The structural part of boost (less_bn), for training and for loading boost-trained weights."""
    if plan.on("less_bn"):
        apply_less_bn(model, fn_flag=plan.less_bn_options.fn_flag)
    return model


def build_boost(plan: BoostPlan, model: nn.Module, *, total_steps: int | None = None, world_size: int = 1,
                seed: int = 0) -> tuple[nn.Module, list[StepHook]]:
    """Apply `plan` to `model` (in place) and return (model, hooks), hooks in the order they must run:
    grad_freeze (before_update/after_optimizer), gradient centralization (on_gradients), Adasum
    (before/after_optimizer, last: it combines the final local update).

    `total_steps` (the run's optimizer updates) lengthens the grad_freeze schedule to cover the whole run
    when it exceeds grad_freeze.total_steps. `seed` picks the freeze_type 1 schedule: the same on every rank.
    """
    check_world_size(plan, world_size)
    model = transform_model(plan, model)
    hooks: list[StepHook] = []
    if plan.on("grad_freeze"):
        hooks.append(GradFreeze(model, plan.grad_freeze_options, total_steps=total_steps, seed=seed))
    if plan.on("less_bn") and plan.less_bn_options.gc_flag:
        hooks.append(GradCentralization(gc_parameters(model)))
    if plan.on("adasum"):
        from .adasum import AdasumHook  # the distributed side's module; imported only when used

        hooks.append(AdasumHook(model, hierarchical=plan.adasum_options.hierarchical))
    return model, hooks


def boost_optimizer(plan: BoostPlan, model: nn.Module) -> torch.optim.Optimizer | None:
    """The optimizer boost imposes, or None to use the recipe's: with dim_reduce, `DimReduce` over the
    model's trainable weights (needs_closure = True; it has no learning rate)."""
    return build_dim_reduce(model, plan.dim_reduce_options) if plan.on("dim_reduce") else None
