"""THOR arguments: schedule values (float, per-update array or callable) and validation.

`check_thor_options` is the one place THOR's keyword arguments are checked: the constructors call it, and
recipe validation calls it on `optim.thor` before anything is built (no model needed).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterable, Sequence

import numpy as np
from torch import Tensor

from torchboost.errors import ConfigError, suggest

Schedule = float | Sequence[float] | np.ndarray | Tensor | Callable[[int], float]


class Value:
    """A float (read from the param group, so torch LR schedulers still work), a per-update array or a
    callable of the update index."""

    def __init__(self, value: Schedule, name: str) -> None:
        self.name, self.fn, self.array = name, None, None
        if callable(value):
            self.fn = value
        elif not isinstance(value, (int, float)):
            self.array = np.asarray(value.detach().cpu() if isinstance(value, Tensor) else value,
                                    dtype=np.float64).reshape(-1)
            if self.array.size == 0:
                raise ConfigError(f"THOR {name} schedule is empty", "give a float or a non-empty array")

    def initial(self, value: Schedule) -> float:
        return float(self(0, value if isinstance(value, (int, float)) else 0.0))

    def __call__(self, k: int, group_value: float) -> float:
        if self.fn is not None:
            return float(self.fn(k))
        if self.array is not None:
            if k >= self.array.size:
                raise ConfigError(f"THOR {self.name} schedule has {self.array.size} entries but update {k} "
                                  "needs one", f"make the {self.name} array cover every update")
            return float(self.array[k])
        return group_value


Rule = Callable[[Any], bool]


def _num(lo: float | None = None, hi: float | None = None, *, lo_open: bool = False, hi_open: bool = False,
         integer: bool = False, none: bool = False) -> tuple[Rule, str]:
    """A numeric rule and its human-readable allowed range."""
    def ok(v: Any) -> bool:
        if v is None:
            return none
        if isinstance(v, bool) or not isinstance(v, (int, float)) or (integer and not isinstance(v, int)):
            return False
        if not math.isfinite(v):
            return False
        if lo is not None and (v <= lo if lo_open else v < lo):
            return False
        return hi is None or (v < hi if hi_open else v <= hi)
    parts = ["an integer" if integer else "a number"]
    if lo is not None:
        parts.append(f"{'>' if lo_open else '>='} {lo:g}")
    if hi is not None:
        parts.append(f"{'and ' if lo is not None else ''}{'<' if hi_open else '<='} {hi:g}")
    return ok, " ".join(parts) + (" or None" if none else "")


def _schedule(positive: bool) -> tuple[Rule, str]:
    """A float (> 0 or >= 0), a non-empty per-update array or a callable of the update index."""
    number, text = _num(0, lo_open=positive)
    def ok(v: Any) -> bool:
        return callable(v) or number(v) or (not isinstance(v, (str, bytes, dict, bool)) and not isinstance(
            v, (int, float)) and np.size(v) > 0)
    return ok, f"{text}, a per-update array or a callable of the update index"


def _choice(*choices: str) -> tuple[Rule, str]:
    return (lambda v: v in choices), " or ".join(repr(c) for c in choices)


def _any() -> tuple[Rule, str]:
    return (lambda v: True), "anything"


# Options of ThorPreconditioner (the curvature machinery), then the ones only the THOR optimizer takes.
PRECONDITIONER_RULES: dict[str, tuple[Rule, str]] = {
    "damping": _schedule(positive=True),
    "frequency": _num(1, integer=True),
    "split_dim": _num(1, integer=True, none=True),
    "loss_scale": _num(0, lo_open=True),
    "factor_interval": _num(1, integer=True, none=True),
    "inv_interval": _num(1, integer=True, none=True),
    "factor_decay": _num(0, 1, hi_open=True, none=True),
    "inverse_method": _choice("cholesky", "eigen"),
    "trace_threshold": _num(0, none=True),
    "interval_growth": _num(1, integer=True),
    "max_interval_mult": _num(1, integer=True),
    "accumulation_steps": _num(1, integer=True),
    "loss_reduction": _choice("mean", "sum"),
    "max_damping_retries": _num(0, integer=True),
    "graft": _choice("none", "grad"),
    "factor_samples": _num(1, integer=True, none=True),
    "grad_scaler": _any(),
    "split_indices": _any(),
    "process_group": _any(),
}
OPTIMIZER_RULES: dict[str, tuple[Rule, str]] = {
    "lr": _schedule(positive=False),
    "momentum": _num(0),
    "weight_decay": _num(0),
    "use_nesterov": (lambda v: isinstance(v, bool), "True or False"),
    "decay_filter": (lambda v: v is None or callable(v), "None or a callable(name) -> bool"),
}


def check_thor_options(options: dict, allow: Iterable[str] = (), *, preconditioner_only: bool = False) -> None:
    """Validate THOR keyword arguments without a model. Unknown keys and bad values raise ConfigError naming
    the key (with the closest valid key, or the allowed range). `allow`: extra keys the caller handles
    itself (e.g. a recipe's `damping_decay`), accepted unchecked."""
    rules = PRECONDITIONER_RULES if preconditioner_only else {**PRECONDITIONER_RULES, **OPTIMIZER_RULES}
    allowed = set(allow)
    for key, value in options.items():
        if key in allowed:
            continue
        if key not in rules:
            raise ConfigError(f"unknown THOR option '{key}'", suggest(key, sorted(set(rules) | allowed)))
        ok, text = rules[key]
        if not ok(value):
            raise ConfigError(f"THOR {key} must be {text}, got {value!r}", f"set {key} to {text}")
    frequency = options.get("frequency", 100)
    factor = options.get("factor_interval") or frequency
    inverse = options.get("inv_interval") or frequency
    if inverse % factor:
        raise ConfigError(f"THOR inv_interval {inverse} is not a multiple of factor_interval {factor}",
                          "make inv_interval a multiple of factor_interval")
