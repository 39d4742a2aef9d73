"""The optimizer registry: every optimizer `torchboost train` and `torchboost race` can build, defined once.

An entry holds what builds and describes one optimizer (as timm's `OptimInfo`): how to build it from a
model and `OptimizerArgs`, the momentum / Nesterov defaults it takes (None = it has no such argument, so
setting it is an error rather than a value silently recorded and ignored), its options dataclass (declared
with `torchboost.options.option`, so a bad option gets the standard one-line error and `--print-config`
shows the defaults), the checks of those options beyond their per-field rules, which parameter-group keys
it honours, and its one-line help. Every argument is per update: what a recipe counts in epochs, the lr
grid a race tries and which optimizers race together are the application's (`recipe/optimizers.py`).
Training, races, validation, CLI help and docs read this table; nothing else lists optimizer names.
Adding one: write its module, add one `register(...)` line.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

from torchboost.errors import ConfigError, suggest
from torchboost.optim.groups import param_groups
from torchboost.optim.muon import muon_optimizer
from torchboost.optim.thor import THOR, thor_muon
from torchboost.optim.thor.args import EKFAC_DECAY, ThorOptions
from torchboost.optim.thor.soap import ThorSOAP


@dataclass(frozen=True)
class OptimizerArgs:
    """What a builder gets besides the model: lr, momentum, weight decay and its groups, the entry's options,
    and the micro-batches summed per update."""

    lr: float
    momentum: float | None = None
    nesterov: bool | None = None
    weight_decay: float = 0.0
    decay_bn_and_bias: bool = False
    weight_decay_groups: dict = dataclasses.field(default_factory=dict)
    options: Any = None  # an instance of the entry's options dataclass (None: its defaults)
    accumulation_steps: int = 1


Builder = Callable[[nn.Module, OptimizerArgs], torch.optim.Optimizer]


@dataclass(frozen=True)
class OptimizerEntry:
    name: str
    help: str
    build: Builder
    momentum: float | None = None  # default; None: the optimizer takes no momentum
    nesterov: bool | None = None  # default; None: no Nesterov option
    options: type | None = None  # dataclass of its options (a recipe's section optim.<options_key>)
    options_key: str | None = None  # the section's name; unset: the entry's name (entries may share one)
    check: Callable[[Any], None] | None = None  # checks of an options instance beyond its per-field rules
    weight_decay_groups: bool = False  # honours optim.weight_decay_groups (per-layer patterns)
    decay_bn_and_bias: bool = False  # honours optim.decay_bn_and_bias (else 1-D parameters are never decayed)
    package: str | None = None  # the optional package it is built from (the `optimizers` extra installs it)
    # whether a checkpoint's optimizer state can be checked and restored (train/checkpoint.check_optimizer_state
    # knows buffers of a parameter's size; SOAP's per-layer eigenbases are not): False refuses --resume plainly
    resumable: bool = True


OPTIMIZERS: dict[str, OptimizerEntry] = {}
DEFAULT_OPTIMIZER = "sgd"


def register(entry: OptimizerEntry) -> OptimizerEntry:
    """Add `entry` (its options section named after it unless `options_key` says otherwise)."""
    if entry.name in OPTIMIZERS:
        raise ValueError(f"optimizer {entry.name!r} is registered twice")
    if entry.options is not None and entry.options_key is None:
        entry = dataclasses.replace(entry, options_key=entry.name)
    if entry.options_key is not None and entry.options is None:
        raise ValueError(f"optimizer {entry.name!r}: options_key {entry.options_key!r} without an options dataclass")
    shared = next((e for e in OPTIMIZERS.values() if e.options_key and e.options_key == entry.options_key), None)
    if shared is not None and shared.options is not entry.options:
        raise ValueError(f"optimizer {entry.name!r}: options section {entry.options_key!r} is {shared.name!r}'s, "
                         "with another dataclass")
    OPTIMIZERS[entry.name] = entry
    return entry


def unregister(name: str) -> None:
    """Remove an entry (for tests and plugins that register one for a while)."""
    OPTIMIZERS.pop(name, None)


def list_optimizers() -> list[str]:
    return list(OPTIMIZERS)


def get_optimizer(name: str) -> OptimizerEntry:
    if name not in OPTIMIZERS:
        raise ConfigError(f"unknown optimizer '{name}'", suggest(str(name), list(OPTIMIZERS)))
    return OPTIMIZERS[name]


OPTIONAL_EXTRA = "pip install 'torchboost[optimizers]'"


def check_installed(entry: OptimizerEntry) -> None:
    """An entry built from an optional package that is not installed: one line saying which and how to get it."""
    if entry.package is not None and importlib.util.find_spec(entry.package) is None:
        raise ConfigError(f"optimizer {entry.name} needs the package {entry.package}, which is not installed",
                          OPTIONAL_EXTRA)


def build_optimizer(name: str, model: nn.Module, args: OptimizerArgs) -> torch.optim.Optimizer:
    """The registered optimizer `name` for `model`; unset momentum/nesterov/options take the entry's defaults."""
    entry = get_optimizer(name)
    check_installed(entry)
    args = dataclasses.replace(
        args, momentum=entry.momentum if args.momentum is None else args.momentum,
        nesterov=entry.nesterov if args.nesterov is None else args.nesterov,
        options=args.options if args.options is not None or entry.options is None else entry.options())
    return entry.build(model, args)


def _groups(model: nn.Module, a: OptimizerArgs) -> list[dict]:
    return param_groups(model, a.weight_decay, a.decay_bn_and_bias, a.weight_decay_groups)


# fused kernels: one kernel for the whole update instead of one per tensor list (see BENCHMARKS.md for the gain)
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


# THOR's entries: a.options is the ThorOptions (the recipe's optim.thor, converted to updates)
def _thor(model: nn.Module, a: OptimizerArgs) -> torch.optim.Optimizer:
    ndim = {name: p.ndim for name, p in model.named_parameters()}
    exempt = None if a.decay_bn_and_bias else lambda name: ndim[name] >= 2  # 1-D: BN scale/shift, biases
    return THOR(model, a.lr, a.options, momentum=a.momentum, weight_decay=a.weight_decay, nesterov=a.nesterov,
                decay_filter=exempt, accumulation_steps=a.accumulation_steps)


def _thor_ekfac(model: nn.Module, a: OptimizerArgs) -> torch.optim.Optimizer:
    """THOR with EKFAC's eigenvalue correction: optim.thor.ekfac_decay, EKFAC_DECAY when unset."""
    if a.options.ekfac_decay is None:
        a = dataclasses.replace(a, options=dataclasses.replace(a.options, ekfac_decay=EKFAC_DECAY))
    return _thor(model, a)


def _thor_soap(model: nn.Module, a: OptimizerArgs) -> torch.optim.Optimizer:
    return ThorSOAP(model, _groups(model, a), a.lr, a.options, momentum=a.momentum, weight_decay=a.weight_decay,
                    accumulation_steps=a.accumulation_steps)


def _thor_muon(model: nn.Module, a: OptimizerArgs, row_beta: float | None = None) -> torch.optim.Optimizer:
    return thor_muon(model, a.lr, a.options, momentum=a.momentum, weight_decay=a.weight_decay, nesterov=a.nesterov,
                     row_beta=row_beta, accumulation_steps=a.accumulation_steps)


def _thor_normuon(model: nn.Module, a: OptimizerArgs) -> torch.optim.Optimizer:
    return _thor_muon(model, a, NORMUON_ROW_BETA)


# optional packages' optimizers: their modules import the package, so they are imported only when one is built
def _sgd_schedulefree(model: nn.Module, a: OptimizerArgs) -> torch.optim.Optimizer:
    from torchboost.optim.schedule_free import ScheduleFreeSGD

    return ScheduleFreeSGD(_groups(model, a), lr=a.lr, momentum=a.momentum)


def _adamw_schedulefree(model: nn.Module, a: OptimizerArgs) -> torch.optim.Optimizer:
    from torchboost.optim.schedule_free import ScheduleFreeAdamW

    return ScheduleFreeAdamW(_groups(model, a), lr=a.lr)


def _soap(model: nn.Module, a: OptimizerArgs) -> torch.optim.Optimizer:
    from torchboost.optim.soap import SOAP

    return SOAP(_groups(model, a), lr=a.lr)


THOR_OPTIONS = dict(options=ThorOptions, options_key="thor")

register(OptimizerEntry("sgd", "momentum SGD (fused kernel); per-layer weight decay groups", _sgd, momentum=0.9,
                        nesterov=False, weight_decay_groups=True, decay_bn_and_bias=True))
register(OptimizerEntry("adamw", "AdamW (fused kernel); per-layer weight decay groups", _adamw,
                        weight_decay_groups=True, decay_bn_and_bias=True))
register(OptimizerEntry("muon", "Muon on hidden weights + AdamW on the input layer, head, biases and norms",
                        _muon, momentum=0.95, nesterov=True))
register(OptimizerEntry("normuon", "NorMuon: Muon with each neuron's update normalised by its running RMS, at Muon's "
                        "step norm", _normuon, momentum=0.95, nesterov=True))
register(OptimizerEntry("thor", "THOR: MindSpore's second-order optimizer (K-FAC natural gradient + momentum SGD)",
                        _thor, momentum=0.9, nesterov=False, decay_bn_and_bias=True, **THOR_OPTIONS))
register(OptimizerEntry("thor_ekfac", "eigenvalue-corrected THOR (EKFAC, George et al. 2018): the gradient in the "
                        "eigenbasis of THOR's factors divided by its running second moment, + momentum SGD (options: "
                        f"optim.thor; ekfac_decay unset: {EKFAC_DECAY})", _thor_ekfac, momentum=0.9, nesterov=False,
                        decay_bn_and_bias=True, **THOR_OPTIONS))
register(OptimizerEntry("thor_soap", "SOAP in the eigenbasis of THOR's factors: Adam's bias-corrected moments in "
                        "the rotated basis, refreshed every optim.thor.frequency updates, decoupled weight decay "
                        "(beta1: momentum; beta2: optim.thor.soap_beta2; epsilon: damping, relative with "
                        "damping_mode trace)", _thor_soap, momentum=0.9, weight_decay_groups=True,
                        decay_bn_and_bias=True, **THOR_OPTIONS))
register(OptimizerEntry("thor_muon", "Muon on THOR-preconditioned gradients (options: optim.thor)", _thor_muon,
                        momentum=0.95, nesterov=True, **THOR_OPTIONS))
register(OptimizerEntry("thor_normuon", "NorMuon on THOR-preconditioned gradients (options: optim.thor)",
                        _thor_normuon, momentum=0.95, nesterov=True, **THOR_OPTIONS))
register(OptimizerEntry("sgd_schedulefree", "schedule-free SGD (Defazio et al. 2024; package schedulefree): no lr decay, "
                        "evaluates the average of its iterates (BatchNorm statistics recomputed there)",
                        _sgd_schedulefree, momentum=0.9, weight_decay_groups=True, decay_bn_and_bias=True,
                        package="schedulefree"))
register(OptimizerEntry("adamw_schedulefree", "schedule-free AdamW (Defazio et al. 2024; package schedulefree): no lr "
                        "decay, evaluates the average of its iterates (BatchNorm statistics recomputed there)",
                        _adamw_schedulefree, weight_decay_groups=True, decay_bn_and_bias=True, package="schedulefree"))
register(OptimizerEntry("soap", "SOAP (Vyas et al. 2024; package heavyball): Adam in the eigenbasis of Shampoo's "
                        "Kronecker-factored preconditioner", _soap, weight_decay_groups=True, decay_bn_and_bias=True,
                        package="heavyball", resumable=False))
