"""What callbacks see (`TrainState`) and the hook points they override (`Callback`).

Kept apart from callbacks.py so that `Model` and the callbacks both depend on it, not on each other.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional, Sequence

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
    samples_in_epoch: int = 0  # samples this process consumed in the current epoch (what a resume skips)
    global_step: int = 0  # updates done since the start of training
    batch_size: int = 0  # samples per update on this process
    output: Optional[StepOutput] = None
    data_time: float = 0.0  # seconds waiting for the last update's batches
    step_time: float = 0.0  # host seconds for the whole last update, data wait included
    clock: Any = None  # the epoch's StepClock: device time per update (CUDA events), read at log time
    eval_results: dict = field(default_factory=dict)
    final_results: dict = field(default_factory=dict)  # after the last epoch (the test split's): history, tracking
    epoch_loss_sum: Any = 0.0  # tensor sum over the epoch; synced only at epoch end
    epoch_samples: Any = 0  # counted in the sums; a device tensor under deferred checks
    epoch_correct: Any = 0
    epoch_start: float = 0.0  # time.perf_counter() at the epoch's start (moved back on resume by the time spent)
    stop_training: bool = False
    log_fn: Any = print
    callbacks: list = field(default_factory=list)  # the run's callbacks (their state goes in checkpoints)
    compile_stats: tuple = (0, 0)  # under train.compile: (graphs compiled, recompiles) since training began

    def add_update(self, out: StepOutput) -> None:
        """Add an update to the epoch's sums, leaving out a non-finite one (it would make the epoch's loss NaN).
        Under deferred checks the verdict is a device flag: the sums stay on the device, no host read."""
        if isinstance(out.nonfinite, torch.Tensor):
            keep = ~out.nonfinite
            self.epoch_loss_sum = self.epoch_loss_sum + torch.where(keep, out.loss * out.samples, 0.0)
            self.epoch_samples = self.epoch_samples + keep * out.samples
            if out.correct is not None:
                self.epoch_correct = self.epoch_correct + torch.where(keep, out.correct, 0)
        elif not out.nonfinite:
            self.epoch_loss_sum = self.epoch_loss_sum + out.loss * out.samples
            self.epoch_samples += out.samples
            if out.correct is not None:
                self.epoch_correct = self.epoch_correct + out.correct

    def log(self, msg: str) -> None:
        self.log_fn(msg)

    @property
    def epoch_complete(self) -> bool:
        """True once every update of the current epoch has run (False after a stop mid-epoch)."""
        return self.step_in_epoch >= self.steps_per_epoch

    def epoch_sums(self) -> dict[str, Any]:
        """The epoch's running sums as saved in a checkpoint: the tensors themselves (resume adds to the very
        same fp32 values, so the resumed epoch's train metrics are bit-identical), or the initial numbers."""
        loss_sum, correct = (v.detach().cpu() if isinstance(v, torch.Tensor) else v
                             for v in (self.epoch_loss_sum, self.epoch_correct))
        return {"loss_sum": loss_sum, "samples": int(self.epoch_samples), "correct": correct}

    def loss_is_finite(self) -> bool:
        """The last update's loss and the epoch's sum are finite (an update skipped as non-finite is not
        counted in the sum). Reads two scalars: call it where a host sync is paid anyway."""
        out = self.output
        last_ok = out is None or getattr(out, "nonfinite", False) or math.isfinite(float(out.loss))
        return last_ok and math.isfinite(float(torch.as_tensor(self.epoch_loss_sum)))


class Callback:
    """Override the hook points you need. A callback whose progress matters for an exact resume returns it
    from `state_dict` (tensors and plain values); checkpoints carry it and `load_state_dict` gets it back
    before `on_train_begin` of the resumed run."""

    def on_train_begin(self, state: TrainState) -> None: ...
    def on_train_epoch_begin(self, state: TrainState) -> None: ...
    def on_train_step_end(self, state: TrainState) -> None: ...
    def on_train_epoch_end(self, state: TrainState) -> None: ...
    def on_train_end(self, state: TrainState) -> None: ...

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None: ...


def keyed_callbacks(callbacks: Sequence[Callback]) -> Iterator[tuple[str, Callback]]:
    """(key, callback) with keys `ClassName`, `ClassName#2`, ...: stable when a resumed run adds or
    reorders callbacks of other classes."""
    seen: dict[str, int] = {}
    for cb in callbacks:
        name = type(cb).__name__
        seen[name] = seen.get(name, 0) + 1
        yield (name if seen[name] == 1 else f"{name}#{seen[name]}"), cb


def summarize_epoch(state: TrainState) -> dict[str, Any]:
    """Train-side epoch metrics from the tensors accumulated during the epoch (one sync, at epoch end)."""
    n = max(int(state.epoch_samples), 1)
    out = {"train_loss": float(torch.as_tensor(state.epoch_loss_sum).item()) / n}
    if not isinstance(state.epoch_correct, (int, float)) or state.epoch_correct:
        out["train_top_1_accuracy"] = float(torch.as_tensor(state.epoch_correct).item()) / n
    return out
