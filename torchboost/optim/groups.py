"""Optimizer parameter groups: per-pattern L2 weight decay, BN parameters and biases exempt by default; a
part of the network (a fine-tuned classifier head) at its own lr multiple.

The NVIDIA ResNet-50 recipe exempts BN gamma/beta and biases from weight decay; the MNIST tutorial's habit
of per-layer L2 regularisation is the same mechanism with name patterns.
"""

from __future__ import annotations

import fnmatch
from typing import Iterable, Mapping, Optional

import torch
from torch import nn

from ..errors import ConfigError


def param_groups(model: nn.Module, weight_decay: float, decay_bn_and_bias: bool = False,
                 patterns: Optional[Mapping[str, float]] = None) -> list[dict]:
    """Groups for SGD/AdamW. A parameter with fewer than 2 dimensions is a bias or a normalisation
    scale/shift: exactly the set the NVIDIA ResNet-50 recipe exempts, and right for layers we don't know about."""
    return weight_decay_groups(model, patterns or {}, weight_decay, exempt_bn_and_bias=not decay_bn_and_bias)


def weight_decay_groups(model: nn.Module, patterns: Mapping[str, float], default: float = 0.0, *,
                        exempt_bn_and_bias: bool = True) -> list[dict]:
    """Optimizer parameter groups with L2 weight decay per parameter-name pattern (fnmatch), e.g.
    `{"layer4.*": 1e-4, "fc.*": 0.0}`. The first matching pattern wins (mapping order). Unmatched
    parameters get `default`, except 1-D ones (BN scale/shift, biases), which get 0 when
    `exempt_bn_and_bias`. With SGD, weight_decay adds wd·w to the gradient: exactly an L2 penalty
    wd/2·|w|² in the loss (Paddle's L2Decay). Groups carry a "name" key (the pattern) for logs.

    A pattern that matches no parameter raises ConfigError: a typo must not leave a layer unregularised."""
    groups = {pat: {"name": pat, "params": [], "weight_decay": float(wd)} for pat, wd in patterns.items()}
    rest = {"name": "default", "params": [], "weight_decay": float(default)}
    no_decay = {"name": "no_decay (1-D: BN, biases)", "params": [], "weight_decay": 0.0}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        pat = next((pat for pat in patterns if fnmatch.fnmatchcase(name, pat)), None)
        target = groups[pat] if pat is not None else (no_decay if exempt_bn_and_bias and p.ndim < 2 else rest)
        target["params"].append(p)
    unused = [pat for pat, g in groups.items() if not g["params"]]
    if unused:
        raise ConfigError(f"weight-decay pattern '{unused[0]}' matches no parameter",
                          f"patterns match parameter names such as '{next(iter(dict(model.named_parameters())), '')}'")
    return [g for g in (*groups.values(), rest, no_decay) if g["params"]]


def scale_lr_of(optimizer: torch.optim.Optimizer, params: Iterable[torch.Tensor], mult: float, name: str) -> None:
    """Give `params` `mult` times their group's lr, for any optimizer: each group holding some of them is split
    in two with the same hyperparameters, the new one with lr and lr_scale multiplied (the trainer sets every
    group's lr to schedule(step) x lr_scale, so the ratio holds through warmup and decay). Call it right after
    building the optimizer, before it has state. Fine-tuning uses it for a fresh classifier head."""
    wanted = {id(p) for p in params}
    if not wanted:
        raise ConfigError(f"this network has no {name} to give its own lr", f"leave the {name} lr multiplier at 1")
    kept, scaled = [], []
    for g in optimizer.param_groups:
        inside = [p for p in g["params"] if id(p) in wanted]
        rest = [p for p in g["params"] if id(p) not in wanted]
        if rest:
            kept.append({**g, "params": rest})
        if inside:
            scaled.append({**g, "params": inside, "lr": g["lr"] * mult, "lr_scale": g.get("lr_scale", 1.0) * mult,
                           "name": f"{g.get('name', 'group')} ({name})"})
    optimizer.param_groups[:] = kept  # in place: a wrapper (THOR-preconditioned) shares its inner list
    for g in scaled:
        optimizer.add_param_group(g)
