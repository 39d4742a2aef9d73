"""MindSpore's names, in one place: everything else in torchboost speaks torch's vocabulary.

| MindSpore                                      | torchboost / torch                                   |
|------------------------------------------------|------------------------------------------------------|
| `Model(..., amp_level="O2", loss_scale_manager)` | `torchboost.Model(..., amp_dtype=, grad_scaler=)`    |
| `FixedLossScaleManager(128, drop_overflow_update)` | `FixedGradScaler(128, skip_overflow=)`             |
| `DynamicLossScaleManager(2**24, 2, 2000)`       | `torch.amp.GradScaler(init_scale, growth_factor, ...)` |
| `thor(net, lr, damping, momentum, ..., use_nesterov)` | `THOR(net, lr, ThorOptions(damping=...), momentum=, nesterov=)` |

The amp levels: O0 float32; O1 autocast; O2 autocast plus dynamic loss scaling when the low precision is
float16; O3 the whole network cast to the low precision (and autocast).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import torch
from torch import nn

from torchboost.errors import ConfigError
from torchboost.optim.thor.args import Schedule
from torchboost.optim.thor.optimizer import THOR
from torchboost.train.device import amp_dtype_for, resolve_device
from torchboost.train.loss_scale import FixedGradScaler
from torchboost.train.model import Model as TorchModel

@dataclass(frozen=True)
class AmpLevel:
    """What one of MindSpore's amp levels means in torch's terms."""

    autocast: bool  # the forward under torch.autocast in the low-precision type
    cast_network: bool  # O3: the network's weights in the low precision too
    scale_float16: bool  # O2: a dynamic GradScaler when the low precision is float16 (unless one is given)


AMP_LEVELS = {"O0": AmpLevel(False, False, False), "O1": AmpLevel(True, False, False),
              "O2": AmpLevel(True, False, True), "O3": AmpLevel(True, True, False)}


def level_of(name: str) -> AmpLevel:
    """The meaning of an amp level's name (one-line error for another name)."""
    if name not in AMP_LEVELS:
        raise ConfigError(f"amp_level={name!r} is not one of {', '.join(AMP_LEVELS)}", "use O0, O1, O2 or O3")
    return AMP_LEVELS[name]


class FixedLossScaleManager(FixedGradScaler):
    """MindSpore's fixed loss scale (default 128). With drop_overflow_update=False (MindSpore's default) an
    update whose gradients overflowed is applied anyway, exactly like MindSpore."""

    def __init__(self, loss_scale: float = 128.0, drop_overflow_update: bool = False, device: str = "cpu") -> None:
        super().__init__(loss_scale, skip_overflow=drop_overflow_update, device=device)

    drop_overflow_update = property(lambda self: self.skip_overflow)

    def get_loss_scale(self) -> float:
        return float(self.get_scale())


class DynamicLossScaleManager(torch.amp.GradScaler):
    """MindSpore's dynamic loss scale: halve on overflow (update skipped), multiply by scale_factor after
    scale_window clean updates."""

    def __init__(self, init_loss_scale: float = 2.0**24, scale_factor: float = 2.0, scale_window: int = 2000,
                 device: str = "cpu") -> None:
        super().__init__(device, init_scale=init_loss_scale, growth_factor=scale_factor,
                         backoff_factor=1.0 / scale_factor, growth_interval=scale_window)

    def get_loss_scale(self) -> float:
        return float(self.get_scale())


class Model(TorchModel):
    """`torchboost.Model` with MindSpore's signature: `Model(network, loss_fn, optimizer, metrics,
    amp_level="O0", loss_scale_manager=None, **torchboost_options)`."""

    def __init__(self, network: nn.Module, loss_fn: Optional[nn.Module] = None,
                 optimizer: Optional[torch.optim.Optimizer] = None, metrics: Any = None, amp_level: str = "O0",
                 loss_scale_manager: Optional[torch.amp.GradScaler] = None, *,
                 device: Optional[str | torch.device] = None, amp_dtype: Optional[str | torch.dtype] = None,
                 **options: Any) -> None:
        device = resolve_device(device)
        level = level_of(amp_level)
        dtype = amp_dtype_for(device, amp_dtype) if level.autocast else None
        if level.cast_network:
            network.to(dtype)
        if loss_scale_manager is None and level.scale_float16 and dtype == torch.float16:
            loss_scale_manager = DynamicLossScaleManager(device=device.type)
        if isinstance(metrics, dict):  # MindSpore passes {"acc", "loss"} sets or {name: Metric} dicts
            metrics = list(metrics)
        super().__init__(network, loss_fn, optimizer, metrics, device=device, amp_dtype=dtype,
                         grad_scaler=loss_scale_manager, **options)
        self.amp_level = amp_level
        self.loss_scale_manager = loss_scale_manager


def thor(net: nn.Module, lr: Schedule, damping: Schedule, momentum: float, weight_decay: float = 0.0,
         loss_scale: float = 1.0, batch_size: int = 32, use_nesterov: bool = False,
         decay_filter: Callable[[str], bool] | None = None, split_indices: Sequence[int] | None = None,
         frequency: int = 100, **kwargs: Any) -> THOR:
    """MindSpore's factory, with its argument names and order: `thor(net, lr, damping, momentum,
    weight_decay, loss_scale, batch_size, use_nesterov, decay_filter, split_indices, frequency)`.
    `batch_size` is only validated: THOR reads each step's real batch size from the layer inputs, so a smaller
    last batch is scaled exactly. `split_indices` sets the all-reduce fusion groups of the factors, as in
    MindSpore. Extra keyword arguments go to THOR (ThorOptions fields, or its Python-only arguments)."""
    if batch_size < 1:
        raise ConfigError(f"thor: batch_size must be >= 1, got {batch_size}", "pass the per-device batch size")
    return THOR(net, lr, momentum=momentum, weight_decay=weight_decay, nesterov=use_nesterov,
                decay_filter=decay_filter, damping=damping, loss_scale=loss_scale, split_indices=split_indices,
                frequency=frequency, **kwargs)
