"""Evaluation metrics that aggregate exactly: sums and counts, reduced across ranks at the end."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

from .. import distributed as dist
from ..errors import ConfigError, suggest
from ..plaindata import in_float_range

METRIC_NAMES = ("top_1_accuracy", "top_5_accuracy", "loss")
METRIC_ALIASES = {"accuracy": "top_1_accuracy", "acc": "top_1_accuracy", "top1": "top_1_accuracy",
                  "top_1": "top_1_accuracy", "top5": "top_5_accuracy", "top_5": "top_5_accuracy"}
_RESULT_PREFIXES = ("val_ema_", "val_", "train_")  # how Model.train names the epoch's results


def resolve_metric(name: str) -> str:
    """The canonical name of a metric ("acc", "top1" -> "top_1_accuracy"); ConfigError for unknown names."""
    if name in METRIC_NAMES:
        return name
    if name in METRIC_ALIASES:
        return METRIC_ALIASES[name]
    raise ConfigError(f"unknown metric {name!r}", suggest(name, [*METRIC_NAMES, *METRIC_ALIASES]))


def resolve_monitor(name: str) -> str:
    """A monitored epoch result with its metric part canonical: "val_acc" -> "val_top_1_accuracy".
    Names without a known prefix (e.g. "data_wait_share") are taken as they are."""
    for prefix in _RESULT_PREFIXES:
        if name.startswith(prefix):
            return prefix + resolve_metric(name[len(prefix):])
    return name


def monitor_mode(name: str, mode: str | None = None) -> str:
    """"min" or "max": given, else min for losses and times, max for accuracies."""
    if mode is None:
        return "max" if "accuracy" in name else "min"
    if mode not in ("min", "max"):
        raise ConfigError(f"mode={mode!r} for monitoring {name}", "use 'min', 'max' or leave it unset (auto)")
    return mode


@dataclass
class BestValue:
    """The best value of a monitored epoch result so far and its (1-based) epoch; `min_delta` is the least
    change that counts as an improvement. Non-finite values never count."""

    monitor: str
    mode: str  # "min" or "max"
    min_delta: float = 0.0
    value: Optional[float] = None
    epoch: int = 0

    def update(self, value: float, epoch: int) -> bool:
        """Record `value` of `epoch`; True when it is the new best."""
        if not math.isfinite(value):
            return False
        better = self.value is None or (value > self.value + self.min_delta if self.mode == "max"
                                        else value < self.value - self.min_delta)
        if better:
            self.value, self.epoch = value, epoch
        return better

    def state_dict(self) -> dict:
        return {"value": self.value, "epoch": self.epoch}

    def load_state_dict(self, state: dict) -> None:
        """Restore from a checkpoint (untrusted): a finite number or none, and an epoch count."""
        value, epoch = state["value"], state["epoch"]
        if not ((value is None or (type(value) in (int, float) and in_float_range(value)))
                and type(epoch) is int and epoch >= 0):
            raise ValueError(f"best {self.monitor} {str(value)[:20]!r} at epoch {str(epoch)[:20]!r} is not a number "
                             "and an epoch")
        self.value, self.epoch = value, epoch


def topk_correct(logits: torch.Tensor, target: torch.Tensor, ks: tuple[int, ...] = (1, 5)) -> list[torch.Tensor]:
    """Number of samples whose label is among the k highest logits, for each k (k capped at #classes)."""
    maxk = min(max(ks), logits.shape[1])
    top = logits.topk(maxk, dim=1).indices
    hit = top == target.unsqueeze(1)
    return [hit[:, : min(k, maxk)].any(dim=1).sum() for k in ks]


class MetricAccumulator:
    """Accumulates loss sum, top-1/top-5 hits and the sample count; `compute()` all-reduces them once."""

    def __init__(self, names: tuple[str, ...] | list[str] | set[str] = METRIC_NAMES) -> None:
        wanted = {resolve_metric(n) for n in sorted(names)}  # sorted: the first unknown name is reproducible
        self.names = [n for n in METRIC_NAMES if n in wanted]
        self.reset()

    def reset(self) -> None:
        self._sums = torch.zeros(4, dtype=torch.float64)  # loss_sum, top1, top5, count

    @torch.no_grad()
    def update(self, logits: torch.Tensor, target: torch.Tensor, loss_sum: torch.Tensor) -> None:
        c1, c5 = topk_correct(logits, target)
        batch = torch.stack([loss_sum.double(), c1.double(), c5.double(),
                             torch.tensor(float(target.numel()), dtype=torch.float64, device=logits.device)])
        self._sums += batch.cpu()

    def compute(self) -> dict[str, float]:
        sums = dist.all_reduce_sum(self._sums.clone())  # no-op in one process; NCCL-safe device handling
        n = max(sums[3].item(), 1.0)
        values = {"loss": sums[0].item() / n, "top_1_accuracy": sums[1].item() / n,
                  "top_5_accuracy": sums[2].item() / n}
        out = {k: values[k] for k in self.names}
        out["samples"] = int(sums[3].item())
        return out
