"""Callbacks with MindSpore's names and hook points: LossMonitor, TimeMonitor, ModelCheckpoint, ...

Each hook receives the `TrainState`; a callback stops training by setting `state.stop_training = True`.
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch

from torchboost.dist import get_world_size, is_main as is_main_process
from torchboost.train.checkpoint import atomic_save, checkpoint_name, prune_checkpoints
from torchboost.train.state import Callback, TrainState


class LossMonitor(Callback):
    """Prints MindSpore's line `epoch: 1 step: 5004, loss is 4.4182425` every `per_print_times` updates."""

    def __init__(self, per_print_times: int = 1, show_accuracy: bool = True) -> None:
        self.per_print_times = max(per_print_times, 1)
        self.show_accuracy = show_accuracy  # the batch's top-1, when the step computes it

    def on_train_step_end(self, state: TrainState) -> None:
        if state.step_in_epoch % self.per_print_times and state.step_in_epoch != state.steps_per_epoch:
            return
        out = state.output
        loss = out.loss.item()
        msg = f"epoch: {state.epoch + 1} step: {state.step_in_epoch}, loss is {loss:.7f}"
        if out.correct is not None and self.show_accuracy:
            msg += f", batch accuracy {out.correct.item() / max(out.samples, 1):.4f}"
        if out.skipped:
            msg += " (update skipped: gradient overflow)"
        if not math.isfinite(loss):
            msg += " — loss is not finite: lower the learning rate or enable loss scaling"
        state.log(msg)


class TimeMonitor(Callback):
    """Per-epoch time, ms per update and images/s (data wait: `torchboost.profiling.DataStarvationMonitor`)."""

    def on_train_epoch_begin(self, state: TrainState) -> None:
        self._t0, self._steps, self._samples = time.perf_counter(), 0, 0

    def on_train_step_end(self, state: TrainState) -> None:
        self._steps += 1
        self._samples += state.output.samples

    def on_train_epoch_end(self, state: TrainState) -> None:
        elapsed = state.eval_results.get("train_time_s") or (time.perf_counter() - self._t0)
        steps = max(self._steps, 1)
        world = get_world_size()
        state.log(f"epoch time: {elapsed * 1000:.1f} ms, per step time: {elapsed * 1000 / steps:.3f} ms, "
                  f"{self._samples * world / max(elapsed, 1e-9):.1f} images/s")


@dataclass
class CheckpointConfig:
    """MindSpore's CheckpointConfig: save every N updates and/or every N epochs; keep the newest N files."""

    save_checkpoint_steps: int = 0
    save_checkpoint_epochs: int = 1
    keep_checkpoint_max: int = 5


class ModelCheckpoint(Callback):
    """Writes `{prefix}-{epoch}_{step}.ckpt` atomically (rank 0 only) and prunes to keep_checkpoint_max."""

    def __init__(self, prefix: str = "checkpoint", directory: str | Path = "ckpt",
                 config: Optional[CheckpointConfig] = None) -> None:
        self.prefix, self.directory = prefix, Path(directory)
        self.config = config or CheckpointConfig()
        self.last_path: Optional[Path] = None

    def _save(self, state: TrainState, epoch_complete: bool) -> None:
        if not is_main_process():
            return
        path = self.directory / checkpoint_name(self.prefix, state.epoch + 1, state.step_in_epoch)
        self.last_path = atomic_save(state.model.checkpoint_state(state, epoch_complete), path)
        prune_checkpoints(self.directory, self.prefix, self.config.keep_checkpoint_max)

    def on_train_step_end(self, state: TrainState) -> None:
        every = self.config.save_checkpoint_steps
        if every and state.global_step % every == 0 and state.step_in_epoch != state.steps_per_epoch:
            self._save(state, epoch_complete=False)

    def on_train_epoch_end(self, state: TrainState) -> None:
        every = self.config.save_checkpoint_epochs
        last = state.epoch + 1 == state.epochs
        if (every and (state.epoch + 1) % every == 0) or last or state.stop_training:
            self._save(state, epoch_complete=True)


class History(Callback):
    """history.jsonl (one JSON line per epoch) and history.png (loss and accuracy, train vs validation)."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self.records: list[dict] = []

    def on_train_begin(self, state: TrainState) -> None:
        path = self.directory / "history.jsonl"
        if path.exists():  # a resumed run continues its history
            done = state.epoch
            self.records = [r for r in map(json.loads, path.read_text().splitlines()) if r["epoch"] <= done]

    def on_train_epoch_end(self, state: TrainState) -> None:
        record = {"epoch": state.epoch + 1, "global_step": state.global_step}
        record.update({k: v for k, v in state.eval_results.items() if isinstance(v, (int, float))})
        self.records.append(record)
        if not is_main_process():
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        (self.directory / "history.jsonl").write_text("".join(json.dumps(r) + "\n" for r in self.records))
        self.plot(self.directory / "history.png")

    def plot(self, path: Path) -> None:
        import matplotlib

        matplotlib.use("Agg")  # headless: never needs a display
        import matplotlib.pyplot as plt

        epochs = [r["epoch"] for r in self.records]
        fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(10, 4))
        for key, ax, label in (("train_loss", ax_loss, "train"), ("val_loss", ax_loss, "validation"),
                               ("train_top_1_accuracy", ax_acc, "train top-1"),
                               ("val_top_1_accuracy", ax_acc, "validation top-1"),
                               ("val_top_5_accuracy", ax_acc, "validation top-5"),
                               ("val_ema_top_1_accuracy", ax_acc, "validation top-1 (EMA)")):
            pts = [(r["epoch"], r[key]) for r in self.records if key in r]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=label)
        ax_loss.set(xlabel="epoch", ylabel="loss", title="loss")
        ax_acc.set(xlabel="epoch", ylabel="accuracy", title="accuracy (gap = overfitting)")
        for ax in (ax_loss, ax_acc):
            ax.grid(alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                ax.legend()
            if epochs:
                ax.set_xticks(epochs if len(epochs) <= 20 else epochs[:: max(len(epochs) // 10, 1)])
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)


class EarlyStopping(Callback):
    """Stops when `monitor` has not improved by `min_delta` for `patience` evaluated epochs."""

    def __init__(self, monitor: str = "val_top_1_accuracy", patience: int = 3, mode: str = "max",
                 min_delta: float = 0.0) -> None:
        self.monitor, self.patience, self.mode, self.min_delta = monitor, patience, mode, min_delta
        self.best: Optional[float] = None
        self.bad_epochs = 0

    def on_train_epoch_end(self, state: TrainState) -> None:
        value = state.eval_results.get(self.monitor)
        if value is None:
            return
        better = self.best is None or (value > self.best + self.min_delta if self.mode == "max"
                                       else value < self.best - self.min_delta)
        if better:
            self.best, self.bad_epochs = value, 0
        else:
            self.bad_epochs += 1
            if self.bad_epochs >= self.patience:
                state.log(f"early stopping: {self.monitor} has not improved for {self.patience} epochs "
                          f"(best {self.best:.4f})")
                state.stop_training = True


class TensorBoard(Callback):
    """Scalars to TensorBoard when it is installed (rank 0 only); silently absent otherwise is NOT done:
    constructing it without tensorboard raises an ImportError with the install command."""

    def __init__(self, log_dir: str | Path, every: int = 10) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:  # pragma: no cover - depends on the environment
            raise ImportError("TensorBoard logging needs `pip install tensorboard`") from e
        self.writer = SummaryWriter(str(log_dir)) if is_main_process() else None
        self.every = every

    def on_train_step_end(self, state: TrainState) -> None:
        if self.writer and state.global_step % self.every == 0:
            self.writer.add_scalar("train/loss", state.output.loss.item(), state.global_step)
            lr = state.model.optimizer.param_groups[0]["lr"]
            self.writer.add_scalar("train/lr", lr, state.global_step)

    def on_train_epoch_end(self, state: TrainState) -> None:
        if self.writer:
            for k, v in state.eval_results.items():
                if isinstance(v, (int, float)):
                    self.writer.add_scalar(f"epoch/{k}", v, state.epoch + 1)
            self.writer.flush()

    def on_train_end(self, state: TrainState) -> None:
        if self.writer:
            self.writer.close()


class ProgressBar(Callback):
    """A tqdm bar per epoch; off when stdout is not a terminal (logs stay clean in CI and files)."""

    def __init__(self, enabled: Optional[bool] = None) -> None:
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self.bar = None

    def on_train_begin(self, state: TrainState) -> None:
        if self.enabled and is_main_process():
            from tqdm import tqdm

            log = state.log_fn

            def write(msg: str) -> None:  # keep log lines from tearing the bar
                with tqdm.external_write_mode():
                    log(msg)

            state.log_fn = write

    def on_train_epoch_begin(self, state: TrainState) -> None:
        if self.enabled and is_main_process():
            from tqdm import tqdm

            self.bar = tqdm(total=state.steps_per_epoch, initial=state.step_in_epoch,
                            desc=f"epoch {state.epoch + 1}/{state.epochs}", leave=False, dynamic_ncols=True)

    def on_train_step_end(self, state: TrainState) -> None:
        if self.bar is not None:
            self.bar.update(1)
            if state.step_in_epoch % 20 == 0:
                self.bar.set_postfix(loss=f"{state.output.loss.item():.4f}")

    def on_train_epoch_end(self, state: TrainState) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
