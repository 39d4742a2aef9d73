"""MindSpore's loss-scale managers, built on torch.amp.GradScaler."""

from __future__ import annotations

import torch


class LossScaleManager:
    """Holds a GradScaler; `drop_overflow_update` says whether an update with inf/NaN gradients is skipped."""

    drop_overflow_update = True

    def __init__(self, scaler: torch.amp.GradScaler) -> None:
        self.scaler = scaler

    def get_loss_scale(self) -> float:
        return float(self.scaler.get_scale())

    def update(self) -> None:
        self.scaler.update()

    def state_dict(self) -> dict:
        return self.scaler.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.scaler.load_state_dict(state)


class FixedLossScaleManager(LossScaleManager):
    """A constant scale (MindSpore default 128). With drop_overflow_update=False (MindSpore's default) the
    update is applied even when gradients overflow, exactly like MindSpore."""

    def __init__(self, loss_scale: float = 128.0, drop_overflow_update: bool = False, device: str = "cpu") -> None:
        super().__init__(torch.amp.GradScaler(device, init_scale=loss_scale, growth_interval=2**31 - 1))
        self.loss_scale = float(loss_scale)
        self.drop_overflow_update = drop_overflow_update

    def update(self) -> None:
        self.scaler.update(new_scale=self.loss_scale)  # GradScaler would halve on overflow; a fixed scale must not


class DynamicLossScaleManager(LossScaleManager):
    """Halve on overflow (update skipped), double after `scale_window` clean updates (MindSpore's defaults)."""

    def __init__(self, init_loss_scale: float = 2.0**24, scale_factor: float = 2.0, scale_window: int = 2000,
                 device: str = "cpu") -> None:
        super().__init__(torch.amp.GradScaler(device, init_scale=init_loss_scale, growth_factor=scale_factor,
                                              backoff_factor=1.0 / scale_factor, growth_interval=scale_window))
