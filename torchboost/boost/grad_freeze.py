"""grad_freeze: train only the later layers on a share of the steps, skipping the frozen layers' backward.

Layer groups (MindSpore `split_parameters_groups`): walk the trainable parameters in registration order; a
group closes when it holds >= 3 parameters and the next parameter is not a normalization/bias parameter
(so a conv stays with its BN). MindSpore tests `'bn' in name or 'bias' in name`; we test the owning module
(BatchNorm/GroupNorm/LayerNorm/InstanceNorm) or a `bias` name, so a shortcut BN named `downsample.1` also
stays with its conv.

Training sets: set k trains groups[k*stride:], i.e. freezes the first k*stride groups, with
stride = n_groups // param_groups; set 0 is the whole network. The schedule (`freeze_schedule`) picks the
set of every optimizer update.

Frozen means frozen: `before_update` sets requires_grad=False on the frozen parameters (autograd then
records no backward for the frozen prefix — the real saving) and sets their .grad to None, so torch
optimizers skip them entirely (no momentum or weight-decay motion, which a zero gradient would still cause).
`after_optimizer` turns requires_grad back on, so the model is normal between updates (eval, EMA, saving).
"""

from __future__ import annotations

import numpy as np
from torch import nn

from torchboost.errors import ConfigError
from torchboost.train.hooks import StepHook

from .options import GradFreezeOptions

_NORMS = (nn.modules.batchnorm._NormBase, nn.GroupNorm, nn.LayerNorm)


def layer_groups(model: nn.Module) -> list[list[tuple[str, nn.Parameter]]]:
    """Trainable parameters grouped by layer (see module docstring)."""
    norm_params = {id(p) for m in model.modules() if isinstance(m, _NORMS) for p in m.parameters(recurse=False)}
    groups: list[list[tuple[str, nn.Parameter]]] = []
    current: list[tuple[str, nn.Parameter]] = []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        follower = id(p) in norm_params or name.rsplit(".", 1)[-1] == "bias"
        if not follower and len(current) >= 3:
            groups.append(current)
            current = []
        current.append((name, p))
    if current:
        groups.append(current)
    return groups


def freeze_schedule(param_groups: int, freeze_type: int, freeze_p: float, total_steps: int,
                    seed: int = 0) -> np.ndarray:
    """Training-set index for each of `total_steps` updates (0 = whole network).

    freeze_type 0: repeat [0]*z + [1, ..., n-1] with z = int(p(n-1)/(1-p) + 0.5), so a share p of the
      steps are full. (MindSpore writes `p*(n-1) // (1-p) + 0.5`, a floor: 20 instead of 21 at the
      defaults p=0.7, n=10; we round as intended.)
    freeze_type 1: start with 0; at each step, if the share of frozen steps so far is below 1-p draw
      k in 1..n-1 with P(k) = (n-k) / (n(n-1)/2) (shallow freezes likelier), else 0. MindSpore draws from
      numpy's global RNG; we use a seeded generator so every rank and a resumed run get the same schedule.
    """
    n, p = param_groups, freeze_p
    if freeze_type == 0:
        z = int(p * (n - 1) / (1 - p) + 0.5)
        cycle = np.array([0] * z + list(range(1, n)), dtype=np.int64)
        return np.resize(cycle, total_steps)
    if freeze_type != 1:
        raise ConfigError(f"boost grad_freeze.freeze_type must be 0 or 1, got {freeze_type}")
    ks = np.arange(1, n)
    draws = np.random.default_rng(seed).choice(ks, size=total_steps, p=(n - ks) / (n * (n - 1) / 2))
    out = np.zeros(total_steps, dtype=np.int64)
    full, frozen, used = 1, 0, 0
    for i in range(1, total_steps):
        if frozen / (full + frozen) < 1 - p:
            out[i] = draws[used]
            used += 1
            frozen += 1
        else:
            full += 1
    return out


class GradFreeze(StepHook):
    """StepHook applying a freeze schedule to `model`'s layer groups (see module docstring).

    The schedule has max(options.total_steps, total_steps) entries and repeats after that (both schedule
    types are stationary, so a longer run keeps the same statistics). It is a pure function of the options,
    `total_steps` and `seed`, so resuming needs no extra state.
    """

    def __init__(self, model: nn.Module, options: GradFreezeOptions, total_steps: int | None = None,
                 seed: int = 0) -> None:
        groups = layer_groups(model)
        stride = len(groups) // options.param_groups
        if stride == 0:
            raise ConfigError(
                f"grad_freeze: {type(model).__name__} has {len(groups)} layer groups, fewer than "
                f"param_groups={options.param_groups}, so no training set could freeze anything",
                f"set boost.config.grad_freeze.param_groups to at most {len(groups)}",
            )
        self.groups = groups
        self.stride = stride
        self.params = [p for g in groups for _, p in g]
        self.frozen_sets = [[p for g in groups[: k * stride] for _, p in g] for k in range(options.param_groups)]
        length = max(options.total_steps, total_steps or 0)
        self.schedule = freeze_schedule(options.param_groups, options.freeze_type, options.freeze_p, length, seed)
        self.current = 0

    def set_at(self, step: int) -> int:
        """Training-set index used for update `step`."""
        return int(self.schedule[step % len(self.schedule)])

    def before_update(self, step: int) -> None:
        self.current = self.set_at(step)
        for p in self.params:
            p.requires_grad_(True)
        for p in self.frozen_sets[self.current]:
            p.requires_grad_(False)
            p.grad = None  # a zero tensor would still let momentum/weight decay move the weight

    def after_optimizer(self, model: nn.Module) -> None:
        for p in self.frozen_sets[self.current]:
            p.requires_grad_(True)

    def frozen_names(self, k: int) -> list[str]:
        """Parameter names frozen by training set `k` (for logs and tests)."""
        return [n for g in self.groups[: k * self.stride] for n, _ in g]
