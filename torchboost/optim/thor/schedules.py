"""THOR learning-rate and damping schedules, as MindSpore's model zoo (resnet/src/lr_generator.py).

Both return per-update numpy float32 arrays starting at `global_step` (MindSpore returns the tail of the
array so a resumed run picks up where it stopped). With e = (i + 1) / steps_per_epoch for update i:

    lr(i)      = lr_init * (1 - e / total_epochs) ** decay, halved once e >= decay_epochs and again once
                 e >= decay_epochs + 1 (the zoo passes lr_end_epoch as total_epochs, decay_epochs=39)
    damping(i) = damping_init * decay_rate ** (e / 10)
"""

from __future__ import annotations

import numpy as np

from torchboost.errors import ConfigError


def _epochs(total_epochs: int, steps_per_epoch: int) -> np.ndarray:
    if total_epochs < 1 or steps_per_epoch < 1:
        raise ConfigError(f"THOR schedule needs total_epochs >= 1 and steps_per_epoch >= 1, got "
                          f"{total_epochs} and {steps_per_epoch}", "pass positive epoch and step counts")
    # float64 as MindSpore's Python loop, cast to float32 only at the end
    return (np.arange(steps_per_epoch * total_epochs, dtype=np.float64) + 1) / steps_per_epoch


def get_thor_lr(global_step: int, lr_init: float, decay: float, total_epochs: int, steps_per_epoch: int,
                decay_epochs: int = 100) -> np.ndarray:
    """Polynomial decay to 0 at `total_epochs` with two extra halvings from `decay_epochs` on."""
    epoch = _epochs(total_epochs, steps_per_epoch)
    lr = lr_init * (1.0 - epoch / total_epochs) ** decay
    lr = np.where(epoch >= decay_epochs, lr * 0.5, lr)
    lr = np.where(epoch >= decay_epochs + 1, lr * 0.5, lr)
    return lr.astype(np.float32)[global_step:]


def get_thor_damping(global_step: int, damping_init: float, decay_rate: float, total_epochs: int,
                     steps_per_epoch: int) -> np.ndarray:
    """Exponential damping decay by `decay_rate` every 10 epochs (continuous in the update index)."""
    epoch = _epochs(total_epochs, steps_per_epoch)
    return (damping_init * decay_rate ** (epoch / 10)).astype(np.float32)[global_step:]
