"""Learning-rate generators: one value per optimizer update (MindSpore's `lr_generator` convention).

All of them return a float64 numpy array of length `total_steps`; the trainer sets `lr` from it before
every update, so gradient accumulation and world size never rescale a schedule implicitly.
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import ConfigError


def _warmup(i: int, lr_init: float, lr_max: float, warmup_steps: int) -> float:
    return lr_init + (lr_max - lr_init) * (i + 1) / warmup_steps


def seed_cosine_lr(lr_init: float, lr_max: float, total_steps: int, warmup_steps: int = 0) -> np.ndarray:
    """The NVIDIA ResNet-50 recipe's cosine (MindSpore model zoo `lr_decay_mode="cosine"`), reproduced exactly:
    linear warmup, then lr_max * ((total - i)/decay_steps * 0.5 * (1 + cos(2*0.47*pi*i/decay_steps)) + 1e-5).
    Note the odd shape: a linear ramp times a cosine that does not reach its minimum."""
    decay_steps = total_steps - warmup_steps
    out = np.empty(total_steps)
    for i in range(total_steps):
        if i < warmup_steps:
            out[i] = _warmup(i, lr_init, lr_max, warmup_steps)
        else:
            linear = (total_steps - i) / decay_steps
            cosine = 0.5 * (1 + math.cos(math.pi * 2 * 0.47 * i / decay_steps))
            out[i] = lr_max * (linear * cosine + 0.00001)
    return out


def warmup_cosine_lr(lr_init: float, lr_max: float, lr_end: float, total_steps: int,
                     warmup_steps: int = 0) -> np.ndarray:
    """Standard linear warmup then half-cosine from lr_max down to lr_end at the last update."""
    out = np.empty(total_steps)
    decay_steps = max(total_steps - warmup_steps, 1)
    for i in range(total_steps):
        if i < warmup_steps:
            out[i] = _warmup(i, lr_init, lr_max, warmup_steps)
        else:
            t = (i - warmup_steps) / decay_steps
            out[i] = lr_end + 0.5 * (lr_max - lr_end) * (1 + math.cos(math.pi * t))
    return out


def step_lr(lr_max: float, total_steps: int, milestones: list[int], gamma: float = 0.1,
            lr_init: float = 0.0, warmup_steps: int = 0) -> np.ndarray:
    """Multiply by `gamma` at each milestone (update indices). MindSpore's `steps` mode uses milestones at
    30%, 60% and 80% of training; pass those for the same curve."""
    out = np.empty(total_steps)
    for i in range(total_steps):
        if i < warmup_steps:
            out[i] = _warmup(i, lr_init, lr_max, warmup_steps)
        else:
            out[i] = lr_max * gamma ** sum(i >= m for m in milestones)
    return out


def poly_lr(lr_init: float, lr_max: float, lr_end: float, total_steps: int, warmup_steps: int = 0,
            power: float = 2.0) -> np.ndarray:
    """MindSpore's `poly` mode: lr_max * (1 - progress)^power after warmup (power 2 in the zoo)."""
    out = np.empty(total_steps)
    for i in range(total_steps):
        if i < warmup_steps:
            out[i] = lr_init + (lr_max - lr_init) * i / warmup_steps
        else:
            base = 1.0 - (i - warmup_steps) / (total_steps - warmup_steps)
            out[i] = max(lr_end + (lr_max - lr_end) * base ** power, 0.0)
    return out


def build_lr_schedule(mode: str, lr: float, total_steps: int, steps_per_epoch: int, *, warmup_epochs: float = 0,
                      lr_init: float = 0.0, lr_end: float = 0.0, milestones: list[float] = (),
                      gamma: float = 0.1, power: float = 2.0) -> np.ndarray:
    """One entry point for the config's `schedule` section (milestones and warmup are in epochs)."""
    warmup = int(round(warmup_epochs * steps_per_epoch))
    if warmup >= total_steps and mode != "constant":
        raise ConfigError(f"warmup ({warmup} updates) is not shorter than training ({total_steps})",
                          "lower schedule.warmup_epochs or raise train.epochs")
    if mode == "constant":
        return np.full(total_steps, lr, dtype=np.float64)
    if mode == "seed_cosine":
        return seed_cosine_lr(lr_init, lr, total_steps, warmup)
    if mode == "cosine":
        return warmup_cosine_lr(lr_init, lr, lr_end, total_steps, warmup)
    if mode == "step":
        return step_lr(lr, total_steps, [int(m * steps_per_epoch) for m in milestones], gamma, lr_init, warmup)
    if mode == "poly":
        return poly_lr(lr_init, lr, lr_end, total_steps, warmup, power)
    raise ConfigError(f"unknown lr schedule mode '{mode}'", "use constant, seed_cosine, cosine, step, poly or thor")
