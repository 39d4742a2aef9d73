"""THOR arguments: schedule values (float, per-update array or callable) and validation."""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
from torch import Tensor

from torchboost.errors import ConfigError

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


def validate(momentum: float, weight_decay: float, frequency: int, split_dim: int | None, loss_scale: float,
             factor_interval: int, inv_interval: int, factor_decay: float | None, inverse_method: str,
             trace_threshold: float | None, interval_growth: int, accumulation_steps: int,
             loss_reduction: str) -> None:
    """Raise ConfigError on the first invalid THOR argument."""
    checks = [
        (momentum >= 0, f"momentum must be >= 0, got {momentum}"),
        (weight_decay >= 0, f"weight_decay must be >= 0, got {weight_decay}"),
        (frequency >= 1 and factor_interval >= 1 and inv_interval >= 1, "frequency/intervals must be >= 1"),
        (inv_interval % factor_interval == 0, f"inv_interval {inv_interval} is not a multiple of "
                                              f"factor_interval {factor_interval}"),
        (split_dim is None or split_dim >= 1, f"split_dim must be None or >= 1, got {split_dim}"),
        (loss_scale > 0, f"loss_scale must be > 0, got {loss_scale}"),
        (factor_decay is None or 0 <= factor_decay < 1, f"factor_decay must be in [0, 1), got {factor_decay}"),
        (inverse_method in ("cholesky", "eigen"),
         f"inverse_method must be 'cholesky' or 'eigen', got {inverse_method!r}"),
        (trace_threshold is None or trace_threshold >= 0, f"trace_threshold must be >= 0, got {trace_threshold}"),
        (interval_growth >= 1, f"interval_growth must be an integer >= 1, got {interval_growth}"),
        (accumulation_steps >= 1, f"accumulation_steps must be >= 1, got {accumulation_steps}"),
        (loss_reduction in ("mean", "sum"), f"loss_reduction must be 'mean' or 'sum', got {loss_reduction!r}"),
    ]
    for ok, what in checks:
        if not ok:
            raise ConfigError(f"THOR: {what}", "fix the THOR arguments")
