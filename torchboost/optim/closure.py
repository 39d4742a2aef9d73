"""torch.optim's `step(closure)` contract, written once for every optimizer here."""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor


def evaluate_closure(closure: Callable[[], Tensor] | None) -> Tensor | None:
    """The closure's loss, computed with gradients on (`step` itself runs under no_grad), or None."""
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()
