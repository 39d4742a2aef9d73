"""Loss scaling in torch's vocabulary: `torch.amp.GradScaler`, plus a fixed scale that may apply overflowing
updates (MindSpore's `FixedLossScaleManager(drop_overflow_update=False)`, whose names live in
`torchboost.compat.mindspore`)."""

from __future__ import annotations

from typing import Any, Optional

import torch


class FixedGradScaler(torch.amp.GradScaler):
    """A GradScaler whose scale never changes. With skip_overflow=False an update whose gradients overflowed
    is applied anyway (what MindSpore does by default; GradScaler always skips it)."""

    def __init__(self, scale: float = 128.0, skip_overflow: bool = True, device: str = "cpu") -> None:
        super().__init__(device, init_scale=scale, growth_interval=2**31 - 1)
        self.fixed_scale = float(scale)
        self.skip_overflow = skip_overflow

    def update(self, new_scale: Optional[float | torch.Tensor] = None) -> None:
        super().update(new_scale=self.fixed_scale)  # GradScaler would halve on overflow; a fixed scale must not

    def step(self, optimizer: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Optional[float]:
        if self.skip_overflow:
            return super().step(optimizer, *args, **kwargs)
        return optimizer.step(*args, **kwargs)  # gradients already unscaled (TrainStep unscales first)


def skips_overflow(scaler: Optional[torch.amp.GradScaler]) -> bool:
    """Whether an update whose (unscaled) gradients hold inf/NaN is dropped: always, but for a FixedGradScaler
    told otherwise."""
    return not isinstance(scaler, FixedGradScaler) or scaler.skip_overflow
