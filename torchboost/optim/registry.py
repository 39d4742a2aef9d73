"""The optimizer registry: every optimizer `torchboost train` and `torchboost race` can build, defined once.

An entry holds everything about one optimizer: how to build it from a model and `OptimizerArgs`, the
momentum / Nesterov defaults it takes (None = it has no such argument, so setting it is an error rather
than a value silently recorded and ignored), its options section (declared with `torchboost.options.opt`,
so a bad option gets the standard one-line error and `--print-config` shows the defaults), the lr grid a
race tries by default and its one-line help. Training, races, validation, CLI help and docs read this
table; nothing else lists optimizer names. Adding one: write its module, add one `register(...)` line.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np
import torch
from torch import nn

from torchboost.errors import ConfigError, suggest
from torchboost.optim.groups import param_groups
from torchboost.optim.muon import muon_optimizer
from torchboost.optim.thor import THOR, get_thor_damping, thor_muon
from torchboost.optim.thor.args import ThorOptions, check_thor_options
from torchboost.options import opt


@dataclass
class ThorRecipeOptions(ThorOptions):
    """`optim.thor`: ThorPreconditioner's options plus MindSpore's damping generator."""

    damping_decay: Optional[float] = opt(None, gt=0, help="damping(e) = damping * damping_decay ^ (e / 10) "
                                                        "(MindSpore's recipe: 0.5467; above 1 the damping grows and "
                                                        "THOR fades into its first-order update); unset: constant")
    first_order_epoch: Optional[float] = opt(None, ge=0, help="curvature early, first-order late: from this "
                                                              "epoch on the plain momentum update (no refreshes, "
                                                              "no preconditioning); unset: curvature throughout")


@dataclass(frozen=True)
class OptimizerArgs:
    """What a builder gets besides the model: the resolved `optim.*` values and the run's shape."""

    lr: float
    momentum: float | None = None
    nesterov: bool | None = None
    weight_decay: float = 0.0
    decay_bn_and_bias: bool = False
    weight_decay_groups: dict = dataclasses.field(default_factory=dict)
    options: Any = None  # the entry's options dataclass instance (None: entry has no options section)
    accumulation_steps: int = 1
    updates_per_epoch: int = 1
    epochs: int = 1


Builder = Callable[[nn.Module, OptimizerArgs], torch.optim.Optimizer]


@dataclass(frozen=True)
class OptimizerEntry:
    name: str
    help: str
    build: Builder
    lr_grid: tuple[float, ...]  # what `torchboost race` tries when no --lr is given (>= 3 points)
    momentum: float | None = None  # default; None: the optimizer takes no momentum
    nesterov: bool | None = None  # default; None: no Nesterov option
    options: type | None = None  # dataclass of its section under optim.<options_key>
    options_key: str | None = None
    check: Callable[[Any], None] | None = None  # checks of the options section beyond its per-field rules
    weight_decay_groups: bool = False  # honours optim.weight_decay_groups (per-layer patterns)
    decay_bn_and_bias: bool = False  # honours optim.decay_bn_and_bias (else 1-D parameters are never decayed)
    family: str = ""  # entries of one family (THOR and its variants) are not each other's rivals in a race
    race_default: bool = True  # raced when `torchboost race` is given no --optimizers


OPTIMIZERS: dict[str, OptimizerEntry] = {}
THOR_FAMILY = "thor"
DEFAULT_OPTIMIZER = "sgd"


def register(entry: OptimizerEntry) -> OptimizerEntry:
    if entry.name in OPTIMIZERS:
        raise ValueError(f"optimizer {entry.name!r} is registered twice")
    if len(entry.lr_grid) < 3:
        raise ValueError(f"optimizer {entry.name!r}: a race lr grid needs at least 3 points")
    OPTIMIZERS[entry.name] = entry
    return entry


def list_optimizers() -> list[str]:
    return list(OPTIMIZERS)


def get_optimizer(name: str) -> OptimizerEntry:
    if name not in OPTIMIZERS:
        raise ConfigError(f"unknown optimizer '{name}'", suggest(str(name), list(OPTIMIZERS)))
    return OPTIMIZERS[name]


def build_optimizer(name: str, model: nn.Module, args: OptimizerArgs) -> torch.optim.Optimizer:
    """The registered optimizer `name` for `model`; unset momentum/nesterov/options take the entry's defaults."""
    entry = get_optimizer(name)
    args = dataclasses.replace(
        args, momentum=entry.momentum if args.momentum is None else args.momentum,
        nesterov=entry.nesterov if args.nesterov is None else args.nesterov,
        options=args.options if args.options is not None or entry.options is None else entry.options())
    return entry.build(model, args)


def _groups(model: nn.Module, a: OptimizerArgs) -> list[dict]:
    return param_groups(model, a.weight_decay, a.decay_bn_and_bias, a.weight_decay_groups)


# fused kernels: 2.0-2.3x faster than foreach for ResNet-50's update on this CPU (BENCHMARKS.md)
def _sgd(model: nn.Module, a: OptimizerArgs) -> torch.optim.Optimizer:
    return torch.optim.SGD(_groups(model, a), lr=a.lr, momentum=a.momentum, nesterov=a.nesterov, fused=True)


def _adamw(model: nn.Module, a: OptimizerArgs) -> torch.optim.Optimizer:
    return torch.optim.AdamW(_groups(model, a), lr=a.lr, fused=True)


def _muon(model: nn.Module, a: OptimizerArgs) -> torch.optim.Optimizer:
    return muon_optimizer(model, lr=a.lr, momentum=a.momentum, weight_decay=a.weight_decay, nesterov=a.nesterov)


NORMUON_ROW_BETA = 0.95  # the NorMuon paper's second-moment factor (its beta2)


def _normuon(model: nn.Module, a: OptimizerArgs) -> torch.optim.Optimizer:
    return muon_optimizer(model, lr=a.lr, momentum=a.momentum, weight_decay=a.weight_decay, nesterov=a.nesterov,
                          row_beta=NORMUON_ROW_BETA)


def thor_kwargs(a: OptimizerArgs) -> dict:
    """ThorPreconditioner keyword arguments from `optim.thor`; damping_decay becomes the per-update damping."""
    kw = dataclasses.asdict(a.options)
    decay, switch = kw.pop("damping_decay"), kw.pop("first_order_epoch")
    if switch is not None:
        kw["first_order_after"] = round(switch * a.updates_per_epoch)
    if decay is not None:
        with np.errstate(over="ignore"):
            kw["damping"] = get_thor_damping(0, kw["damping"], decay, a.epochs, a.updates_per_epoch)
        if not np.isfinite(kw["damping"]).all():
            raise ConfigError(f"optim.thor.damping_decay {decay:g} takes the damping past the float range within "
                              f"{a.epochs} epochs", "use a damping_decay nearer 1 (30 grows it 30x per 10 epochs)")
    return {**kw, "accumulation_steps": a.accumulation_steps}


def check_thor_section(t: ThorRecipeOptions) -> None:
    """`optim.thor` as a whole: its combinations, and THOR's own argument checks."""
    if t.damping_decay is not None and isinstance(t.damping, list):
        raise ConfigError("damping is a per-update list and damping_decay is set",
                          "give damping as one number with damping_decay, or the list alone")
    epoch_keys = ("damping_decay", "first_order_epoch")  # recipe-only: converted by thor_kwargs
    check_thor_options({k: v for k, v in dataclasses.asdict(t).items() if k not in epoch_keys},
                       preconditioner_only=True)


def _thor(model: nn.Module, a: OptimizerArgs) -> torch.optim.Optimizer:
    ndim = {name: p.ndim for name, p in model.named_parameters()}
    exempt = None if a.decay_bn_and_bias else lambda name: ndim[name] >= 2  # 1-D: BN scale/shift, biases
    return THOR(model, lr=a.lr, momentum=a.momentum, weight_decay=a.weight_decay, use_nesterov=a.nesterov,
                decay_filter=exempt, **thor_kwargs(a))


def _thor_muon(model: nn.Module, a: OptimizerArgs) -> torch.optim.Optimizer:
    return thor_muon(model, a.lr, a.momentum, a.weight_decay, a.nesterov, **thor_kwargs(a))


def _thor_normuon(model: nn.Module, a: OptimizerArgs) -> torch.optim.Optimizer:
    return thor_muon(model, a.lr, a.momentum, a.weight_decay, a.nesterov, row_beta=NORMUON_ROW_BETA,
                     **thor_kwargs(a))


register(OptimizerEntry("sgd", "momentum SGD (fused kernel); per-layer weight decay groups", _sgd,
                        (0.01, 0.02, 0.05), momentum=0.9, nesterov=False, weight_decay_groups=True,
                        decay_bn_and_bias=True))
register(OptimizerEntry("adamw", "AdamW (fused kernel); per-layer weight decay groups", _adamw,
                        (0.001, 0.002, 0.005), weight_decay_groups=True, decay_bn_and_bias=True))
register(OptimizerEntry("muon", "Muon on hidden weights + AdamW on the input layer, head, biases and norms",
                        _muon, (0.01, 0.02, 0.05), momentum=0.95, nesterov=True))
register(OptimizerEntry("normuon", "NorMuon: Muon with each neuron's update normalised by its running RMS, at Muon's "
                        "step norm", _normuon, (0.01, 0.02, 0.05), momentum=0.95, nesterov=True, race_default=False))
register(OptimizerEntry("thor", "THOR: MindSpore's second-order optimizer (K-FAC natural gradient + momentum SGD)",
                        _thor, (0.01, 0.02, 0.05), momentum=0.9, nesterov=False, options=ThorRecipeOptions,
                        options_key="thor", check=check_thor_section, family=THOR_FAMILY, decay_bn_and_bias=True))
register(OptimizerEntry("thor_muon", "Muon on THOR-preconditioned gradients (options: optim.thor)", _thor_muon,
                        (0.01, 0.02, 0.05), momentum=0.95, nesterov=True, options=ThorRecipeOptions,
                        options_key="thor", check=check_thor_section, family=THOR_FAMILY, race_default=False))
register(OptimizerEntry("thor_normuon", "NorMuon on THOR-preconditioned gradients (options: optim.thor)",
                        _thor_normuon, (0.01, 0.02, 0.05), momentum=0.95, nesterov=True, options=ThorRecipeOptions,
                        options_key="thor", check=check_thor_section, family=THOR_FAMILY, race_default=False))
