"""Exponential moving average of the weights (timm's ModelEmaV2 idea: a shadow copy of the module)."""

from __future__ import annotations

import copy

import torch
from torch import nn

from ..errors import ConfigError, suggest

WARMUPS = ("timm", "nvidia", "none")
BUFFER_MODES = ("copy", "average")


class ModelEMA:
    """e <- d*e + (1-d)*w after each real optimizer update.

    warmup: "timm" d_t = min(d, 1 - (1 + t/gamma)^-power); "nvidia" d_t = min(d, (1+t)/(10+t)); None: d.
    buffers (BN running stats): "copy" takes the live model's, "average" averages them like weights.
    The shadow is a full module (`.module`) so it can be evaluated, saved and exported as is.
    """

    def __init__(self, model: nn.Module, decay: float = 0.9999, warmup: str | None = "timm",
                 warmup_gamma: float = 1.0, warmup_power: float = 2 / 3, buffers: str = "copy") -> None:
        if warmup is not None and warmup not in WARMUPS:
            raise ConfigError(f"unknown EMA warmup {warmup!r}", suggest(str(warmup), WARMUPS))
        if buffers not in BUFFER_MODES:
            raise ConfigError(f"unknown EMA buffers mode {buffers!r}", suggest(str(buffers), BUFFER_MODES))
        self.module = copy.deepcopy(model).eval()
        for p in self.module.parameters():
            p.requires_grad_(False)
        self.decay, self.warmup = decay, None if warmup == "none" else warmup
        self.warmup_gamma, self.warmup_power, self.buffers = warmup_gamma, warmup_power, buffers
        # the update count on the weights' device, and the decay computed there: an update the trainer undoes on
        # the device (train.undo) takes its count back with it, and no update reads a value on the host
        device = next((t.device for t in self.module.state_dict().values()), torch.device("cpu"))
        self.count = torch.zeros((), dtype=torch.float64 if device.type != "mps" else torch.float32, device=device)

    @property
    def updates(self) -> int:
        """The updates averaged so far (a host read: for reports and checkpoints, not for every update)."""
        return int(self.count)

    def current_decay(self) -> torch.Tensor:
        t = self.count
        if self.warmup == "timm":
            return torch.clamp(1 - (1 + t / self.warmup_gamma) ** -self.warmup_power, max=self.decay)
        if self.warmup == "nvidia":
            return torch.clamp((1 + t) / (10 + t), max=self.decay)
        return torch.full_like(t, self.decay)

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        weight = 1.0 - self.current_decay()
        self.count += 1
        ema_p = [p for p in self.module.parameters()]
        live_p = [p.detach() for p in model.parameters()]
        if ema_p and self.count.device != ema_p[0].device:  # the module moved after it was built: once
            self.count = self.count.to(ema_p[0].device)
            weight = weight.to(ema_p[0].device)
        torch._foreach_lerp_(ema_p, live_p, weight.float())  # e + (1-d)(w - e) == d*e + (1-d)*w, one fused op
        for e, b in zip(self.module.buffers(), model.buffers()):
            if self.buffers == "average" and e.dtype.is_floating_point:
                e.lerp_(b, weight.to(e.dtype))
            else:
                e.copy_(b)

    def state_dict(self) -> dict:
        return {"module": self.module.state_dict(), "updates": self.updates}

    def load_state_dict(self, state: dict) -> None:
        self.module.load_state_dict(state["module"])
        self.count.fill_(int(state["updates"]))
