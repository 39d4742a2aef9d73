"""THOR arguments: schedule values (float, per-update array or callable), the declared options and checks.

`ThorOptions` declares what a recipe may set (`optim.thor`) in the project's one rule language
(`torchboost.options.option`); `check_thor_options` applies those rules (plus the Python-only arguments) and
is what the constructors call, so a bad option gets the same one-line error from Python and from a recipe.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Callable, Optional, Sequence, Union

import numpy as np
from torch import Tensor

from torchboost.errors import ConfigError, suggest
from torchboost.options import check_options, option

Schedule = float | Sequence[float] | np.ndarray | Tensor | Callable[[int], float]


class Value:
    """A schedule: a float, a per-update array or a callable of the update index. A float lr is read from
    the param group instead (`group_value`), so torch's lr schedulers act on it."""

    def __init__(self, value: Schedule, name: str) -> None:
        self.name, self.fn, self.array = name, None, None
        self.constant = float(value) if isinstance(value, (int, float)) else None
        if callable(value):
            self.fn = value
        elif not isinstance(value, (int, float)):
            self.array = np.asarray(value.detach().cpu() if isinstance(value, Tensor) else value,
                                    dtype=np.float64).reshape(-1)
            if self.array.size == 0:
                raise ConfigError(f"THOR {name} schedule is empty", "give a float or a non-empty array")

    def initial(self, value: Schedule) -> float:
        return float(self(0, value if isinstance(value, (int, float)) else 0.0))

    def __call__(self, k: int, group_value: float | None = None) -> float:
        if self.fn is not None:
            return float(self.fn(k))
        if self.array is not None:
            if k >= self.array.size:
                raise ConfigError(f"THOR {self.name} schedule has {self.array.size} entries but update {k} "
                                  "needs one", f"make the {self.name} array cover every update")
            return float(self.array[k])
        return self.constant if group_value is None else group_value


def _is_schedule_object(v: Any) -> bool:
    """A callable of the update index or an array (numpy, tensor): Python-only forms of a schedule."""
    return callable(v) or isinstance(v, (np.ndarray, Tensor))


@dataclass
class ThorOptions:
    """ThorPreconditioner's options that a recipe can write (`optim.thor`), with their defaults and rules.
    `damping` may also be a per-update list; in Python it may be an array or a callable of the update index."""

    damping: Union[float, list[float]] = option(0.03, gt=0, help="added to the factors' diagonal before inverting "
                                                                 "(a number, or one per update)")
    frequency: int = option(100, ge=1, help="updates between refreshes of the factors and their inverses")
    split_dim: Optional[int] = option(128, ge=1, help="block size of the block-diagonal inverse; unset: the "
                                                      "whole matrix")
    loss_scale: float = option(1.0, gt=0, help="the loss scale the gradients carry (divided out of the factors)")
    factor_interval: Optional[int] = option(None, ge=1, help="updates between factor refreshes; unset: frequency")
    inv_interval: Optional[int] = option(None, ge=1, help="updates between inversions (a multiple of "
                                                          "factor_interval); unset: frequency")
    factor_decay: Optional[float] = option(None, ge=0, lt=1, help="running average of the factors; unset: the "
                                                                  "latest batch only")
    inverse_method: str = option("cholesky", choices=("cholesky", "eigen"), help="how the damped factors are "
                                                                                 "inverted")
    trace_threshold: Optional[float] = option(None, ge=0, help="skip a layer's refresh while its factors' trace "
                                                               "moved less than this share; unset: always refresh")
    interval_growth: int = option(1, ge=1, help="with trace_threshold: a skipped layer's interval grows by this "
                                                "factor")
    max_interval_mult: int = option(8, ge=1, help="with trace_threshold: the largest interval, in frequencies")
    loss_reduction: str = option("mean", choices=("mean", "sum"), help="how the loss reduces over the batch "
                                                                       "(scales the output-gradient factor)")
    max_damping_retries: int = option(3, ge=0, help="an inversion that fails is retried with 10x the damping "
                                                    "this many times")
    graft: str = option("none", choices=("none", "grad", "sgd_step", "muon_step"),
                        help="THOR's direction with another optimizer's per-layer size, so the lr schedule sets "
                             "the step: grad = each preconditioned gradient gets its plain gradient's norm; sgd_step "
                             "= each step gets the norm of momentum SGD's step at this lr; muon_step = of Muon's "
                             "(lr x sqrt(max(1, rows/cols)) x sqrt(min(rows, cols)), an orthogonal update's); "
                             "sgd_step and muon_step size THOR's own update (thor_muon's step already is Muon's)")
    factor_samples: Optional[int] = option(None, ge=1, help="batch samples the factors are built from at a "
                                                            "refresh; unset: the whole batch")
    split_indices: Optional[list[int]] = option(None, ge=0, help="multi-process: layer indices where the "
                                                                 "inverses' all-reduce groups split")
    kl_clip: Optional[float] = option(None, gt=0, help="trust region (K-FAC's, kfac-pytorch's default 0.001): "
                                                       "scale every preconditioned gradient by min(1, sqrt(kl_clip "
                                                       "/ (lr^2 * sum over layers of <P g, g>))); unset: no clip")
    max_dim: Optional[int] = option(None, ge=1, help="a factor side wider than this keeps only its diagonal "
                                                     "(Shampoo's max_preconditioner_dim); unset: every side blocked "
                                                     "by split_dim")
    batchnorm: str = option("none", choices=("none", "unit_wise"), help="BatchNorm scale and shift: none = not "
                                                                        "preconditioned (the plain update); unit_wise "
                                                                        "= each channel's (scale, shift) gradient "
                                                                        "times its damped 2x2 Fisher inverse")


@dataclass
class PreconditionerPythonOptions:
    """ThorPreconditioner's options that only Python callers pass (live objects, the trainer's accumulation)."""

    accumulation_steps: int = option(1, ge=1)
    first_order_after: Optional[int] = option(None, ge=0)  # recipes: optim.thor.first_order_epoch
    grad_scaler: Any = option(None)
    process_group: Any = option(None)


@dataclass
class ThorPythonOptions(PreconditionerPythonOptions):
    """...and the THOR optimizer's own arguments."""

    lr: float = option(0.0, ge=0)
    momentum: float = option(0.9, ge=0)
    weight_decay: float = option(0.0, ge=0)
    nesterov: bool = option(False)
    decay_filter: Any = option(None)  # None or a callable(name) -> bool


def check_thor_options(options: dict, *, preconditioner_only: bool = False) -> None:
    """Validate THOR keyword arguments without a model, by the rules declared on `ThorOptions` and
    `ThorPythonOptions`. Unknown keys and bad values raise ConfigError naming the key (with the closest
    valid key, or the allowed range). Schedules (`damping`, `lr`) may also be arrays or callables."""
    python_cls = PreconditionerPythonOptions if preconditioner_only else ThorPythonOptions
    recipe_keys = {f.name for f in fields(ThorOptions)}
    python_keys = {f.name for f in fields(python_cls)}
    for key in options:
        if key not in recipe_keys | python_keys:
            raise ConfigError(f"unknown THOR option '{key}'", suggest(str(key), sorted(recipe_keys | python_keys)))
    values = dict(options)
    for key in ("damping", "lr"):
        if _is_schedule_object(values.get(key)):
            if not callable(values[key]) and np.size(values[key]) == 0:
                raise ConfigError(f"THOR {key} schedule is empty", "give a float or a non-empty array")
            del values[key]
    check_options({k: v for k, v in values.items() if k in recipe_keys}, ThorOptions, "THOR")
    check_options({k: v for k, v in values.items() if k in python_keys}, python_cls, "THOR")
    decay_filter = values.get("decay_filter")
    if decay_filter is not None and not callable(decay_filter):
        raise ConfigError(f"THOR decay_filter must be None or a callable(name) -> bool, got {decay_filter!r}",
                          "pass a function of the parameter name")
    frequency = options.get("frequency", 100)
    factor = options.get("factor_interval") or frequency
    inverse = options.get("inv_interval") or frequency
    if inverse % factor:
        raise ConfigError(f"THOR inv_interval {inverse} is not a multiple of factor_interval {factor}",
                          "make inv_interval a multiple of factor_interval")
