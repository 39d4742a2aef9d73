"""What callbacks see (`TrainState`) and the hook points they override (`Callback`).

Kept apart from callbacks.py so that `Model` and the callbacks both depend on it, not on each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from torchboost.train.step import StepOutput


@dataclass
class TrainState:
    """What callbacks see (MindSpore's `run_context.original_args()`)."""

    model: Any  # the torchboost Model being trained (typed loosely: Model imports this module)
    epochs: int
    steps_per_epoch: int
    epoch: int = 0  # 0-based index of the current epoch
    step_in_epoch: int = 0  # updates done in the current epoch
    global_step: int = 0  # updates done since the start of training
    batch_size: int = 0  # samples per update on this process
    output: Optional[StepOutput] = None
    data_time: float = 0.0  # seconds waiting for the last update's batches
    step_time: float = 0.0  # seconds for the whole last update, data wait included
    eval_results: dict = field(default_factory=dict)
    epoch_loss_sum: Any = 0.0  # tensor sum over the epoch; synced only at epoch end
    epoch_samples: int = 0
    epoch_correct: Any = 0
    stop_training: bool = False
    log_fn: Any = print

    def log(self, msg: str) -> None:
        self.log_fn(msg)


class Callback:
    """Override the hook points you need."""

    def on_train_begin(self, state: TrainState) -> None: ...
    def on_train_epoch_begin(self, state: TrainState) -> None: ...
    def on_train_step_end(self, state: TrainState) -> None: ...
    def on_train_epoch_end(self, state: TrainState) -> None: ...
    def on_train_end(self, state: TrainState) -> None: ...


def summarize_epoch(state: TrainState) -> dict[str, Any]:
    """Train-side epoch metrics from the tensors accumulated during the epoch (one sync, at epoch end)."""
    n = max(state.epoch_samples, 1)
    out = {"train_loss": float(torch.as_tensor(state.epoch_loss_sum).item()) / n}
    if not isinstance(state.epoch_correct, (int, float)) or state.epoch_correct:
        out["train_top_1_accuracy"] = float(torch.as_tensor(state.epoch_correct).item()) / n
    return out
