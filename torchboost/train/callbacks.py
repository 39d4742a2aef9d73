"""Callbacks with MindSpore's names and hook points: LossMonitor, TimeMonitor, ModelCheckpoint, ...

Each hook receives the `TrainState`; a callback stops training by setting `state.stop_training = True`.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, TextIO

import torch

from torchboost.distributed import get_world_size, is_main as is_main_process
from torchboost.errors import ConfigError, TrainingError
from torchboost.fileio import atomic_same, remove_file, remove_stale_temps
from torchboost.train.checkpoint import (atomic_save, checkpoint_name, classifier_head, is_checkpoint_name,
                                         weights_finite)
from torchboost.train.history import History  # re-exported: the callbacks' home for `from ... import`
from torchboost.train.tensorboard import TensorBoard  # re-exported likewise
from torchboost.train.metrics import BestValue, monitor_mode, resolve_monitor
from torchboost.train.state import Callback, TrainState

__all__ = ["LossMonitor", "TimeMonitor", "CheckpointConfig", "ModelCheckpoint", "History", "EarlyStopping", "ChanceMonitor",
           "TensorBoard", "ProgressBar", "is_main_process"]


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
        if out.nonfinite:
            msg += " (update skipped: non-finite loss)"
        elif out.skipped:
            msg += " (update skipped: gradient overflow)"
        elif not math.isfinite(loss):
            msg += " — loss is not finite: lower the learning rate or enable loss scaling"
        state.log(msg)


class TimeMonitor(Callback):
    """Per-epoch time, ms per update and images/s (data wait: `torchboost.train.profiling.DataStarvationMonitor`).

    The epoch's time is what `Model.train` measured (carried across a resume); ms per update is the device's
    clock over the epoch's updates (`StepClock`: CUDA events, read here, not after each update) and images/s
    the rate it gives to the epoch's images per update."""

    def on_train_epoch_end(self, state: TrainState) -> None:
        elapsed = state.eval_results["train_time_s"]
        # per update: the device's clock over this epoch's updates (CUDA events), else the epoch's wall time
        per_update = state.clock.per_update_s() if state.clock is not None else None
        per_update = per_update if per_update is not None else elapsed / max(state.step_in_epoch, 1)
        images = int(state.epoch_samples) * get_world_size() / max(state.step_in_epoch, 1)  # per update
        lr = state.eval_results.get("lr")
        state.log(f"epoch time: {elapsed * 1000:.1f} ms, per step time: {per_update * 1000:.3f} ms, "
                  f"{images / max(per_update, 1e-12):.1f} images/s" + (f", lr {lr:.6g}" if lr is not None else ""))


@dataclass
class CheckpointConfig:
    """MindSpore's CheckpointConfig: save every N updates and/or every N epochs; keep the newest N files."""

    save_checkpoint_steps: int = 0
    save_checkpoint_epochs: int = 1
    keep_checkpoint_max: int = 5


class ModelCheckpoint(Callback):
    """Writes `{prefix}-{epoch}_{step}.pt` atomically (rank 0 only) and keeps the newest keep_checkpoint_max
    of the files this run wrote (a resumed run counts the files of the run it continues); other files in
    the folder are never deleted. With `save_best` (an epoch result such as "val_top_1_accuracy"; mode: max
    for accuracies, min for losses unless given) it also writes `{prefix}-best.pt` whenever that improves;
    the best checkpoint is never pruned. A state whose loss is not finite is never written."""

    def __init__(self, prefix: str = "checkpoint", directory: str | Path = "ckpt",
                 config: Optional[CheckpointConfig] = None, *, save_best: Optional[str] = None,
                 mode: Optional[str] = None) -> None:
        self.prefix, self.directory = prefix, Path(directory)
        self.config = config or CheckpointConfig()
        self.last_path: Optional[Path] = None
        self.written: list[Path] = []  # this run's checkpoints, oldest first (the best one is not among them)
        self.best = None
        if save_best is not None:
            name = resolve_monitor(save_best)
            self.best = BestValue(name, monitor_mode(name, mode))

    @property
    def best_path(self) -> Path:
        return self.directory / f"{self.prefix}-best.pt"

    def on_train_begin(self, state: TrainState) -> None:
        if is_main_process():
            remove_stale_temps(self.directory)

    def _save(self, state: TrainState, path: Path, epoch_complete: bool) -> Path:
        # TrainStep stops first; this guards custom steps, policies and a save between two deferred checks
        # (the weights too: another rank's non-finite gradients reach these through the all-reduce)
        if not state.loss_is_finite() or not weights_finite(state.model.module):
            raise TrainingError(f"refusing to write {path.name}: the loss or the weights at epoch {state.epoch + 1} "
                                f"step {state.step_in_epoch} are not finite", "resume from the last checkpoint "
                                "with a lower learning rate, gradient clipping or loss scaling")
        return atomic_save(state.model.checkpoint_state(state, epoch_complete), path)

    def _save_numbered(self, state: TrainState) -> None:
        if not is_main_process():
            return
        path = self.directory / checkpoint_name(self.prefix, state.epoch + 1, state.step_in_epoch)
        # The list is settled before writing, so the checkpoint holds exactly the files that remain once
        # it is written (a resumed run then owns them); the pruned files go only after a successful write.
        listed = [p for p in self.written if p != path] + [path]
        keep = self.config.keep_checkpoint_max
        doomed = listed[:-keep] if keep > 0 else []
        before, self.written = self.written, listed[len(doomed):]
        try:
            self.last_path = self._save(state, path, state.epoch_complete)
        except BaseException:
            self.written = before
            raise
        for p in doomed:
            remove_file(p)

    def on_train_step_end(self, state: TrainState) -> None:
        every = self.config.save_checkpoint_steps
        if every and state.global_step % every == 0 and not state.epoch_complete:
            self._save_numbered(state)

    def on_train_epoch_end(self, state: TrainState) -> None:
        # the best value first: this epoch's numbered checkpoint then records it, so a run resumed from that file
        # compares the next epochs with this one (not the epoch before) before replacing the best checkpoint
        value = state.eval_results.get(self.best.monitor) if self.best is not None else None
        improved = value is not None and self.best.update(float(value), state.epoch + 1)
        every = self.config.save_checkpoint_epochs
        numbered = bool(every and (state.epoch + 1) % every == 0) or state.epoch + 1 == state.epochs \
            or state.stop_training
        if numbered:
            self._save_numbered(state)
        if improved and is_main_process():
            if numbered:  # the same state: its file again, not a second serialization (a big network's seconds)
                atomic_same(self.last_path, self.best_path)
            else:
                self._save(state, self.best_path, state.epoch_complete)

    def state_dict(self) -> dict:
        state: dict = {"files": [p.name for p in self.written]}
        if self.best is not None:
            state["best"] = self.best.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        # A checkpoint is data from whoever shared it, never a list of paths to act on: only bare names of
        # this prefix's numbered checkpoints that exist in this folder are taken (pruning deletes them later).
        files = state.get("files", [])
        names = [n for n in files if is_checkpoint_name(n, self.prefix)] if isinstance(files, list) else []
        self.written = [self.directory / n for n in dict.fromkeys(names) if (self.directory / n).is_file()]
        if self.best is not None and "best" in state:
            self.best.load_state_dict(state["best"])


def _start_momentum(optimizer: torch.optim.Optimizer) -> None:
    """Give parameters that join after a freeze the zero momentum buffer the others started from: torch's
    foreach/fused SGD refuses a step where only some parameters have one (zero + the first gradient is
    exactly SGD's own first step with dampening 0)."""
    state = optimizer.state
    if not any("momentum_buffer" in s for s in state.values()):
        return
    for group in optimizer.param_groups:
        for p in group["params"]:
            if "momentum_buffer" not in state.get(p, {}):
                state[p]["momentum_buffer"] = torch.zeros_like(p)


class FreezeBackbone(Callback):
    """Fine-tuning: train only the classifier head (`classifier_head`, or the names given) for the first
    `epochs` epochs, then everything. Frozen parameters get no gradient, so their backward work is skipped."""

    def __init__(self, epochs: int, head: Optional[list[str]] = None) -> None:
        self.epochs, self.head = epochs, head

    def on_train_epoch_begin(self, state: TrainState) -> None:
        net = getattr(state.model.network, "module", state.model.network)  # under DDP: the wrapped network
        head = set(self.head if self.head is not None else classifier_head(net))
        frozen = state.epoch < self.epochs
        for name, p in net.named_parameters():
            if name not in head:
                p.requires_grad_(not frozen)
        if not frozen:
            _start_momentum(state.model.optimizer)
        if state.epoch == 0 and frozen or state.epoch == self.epochs and self.epochs:
            state.log(f"fine-tuning: {'only the head (' + ', '.join(sorted(head)) + ') trains' if frozen else 'the whole network trains from now on'}")


class EarlyStopping(Callback):
    """Stops when `monitor` has not improved by `min_delta` for `patience` evaluated epochs (mode: max for
    accuracies, min for losses unless given; patience None: never stops, only watches). With
    `restore_best`, the network ends with the weights of its best epoch (kept in memory as a CPU copy)."""

    def __init__(self, monitor: str = "val_top_1_accuracy", patience: Optional[int] = 3,
                 mode: Optional[str] = None, min_delta: float = 0.0, restore_best: bool = False) -> None:
        if patience is not None and patience < 1:
            raise ConfigError(f"early stopping patience={patience}", "use 1 or more epochs")
        self.monitor = resolve_monitor(monitor)
        self.patience, self.restore_best = patience, restore_best
        self.best = BestValue(self.monitor, monitor_mode(self.monitor, mode), min_delta)
        self.bad_epochs = 0
        self.best_weights: Optional[dict[str, torch.Tensor]] = None

    def on_train_epoch_end(self, state: TrainState) -> None:
        value = state.eval_results.get(self.monitor)
        if value is None:
            return
        if self.best.update(float(value), state.epoch + 1):
            self.bad_epochs = 0
            if self.restore_best:
                self.best_weights = {k: v.detach().to("cpu", copy=True)
                                     for k, v in state.model.module.state_dict().items()}
            return
        self.bad_epochs += 1
        if self.patience is not None and self.bad_epochs >= self.patience:
            state.log(f"early stopping: {self.monitor} has not improved for {self.patience} epochs; best "
                      f"{self.best.value:.4f} at epoch {self.best.epoch}")
            state.stop_training = True

    def on_train_end(self, state: TrainState) -> None:
        if not self.restore_best or self.best.value is None:
            return
        if self.best_weights is None:  # the best epoch came before a resume: its weights were not kept
            state.log(f"early stopping: the weights of the best epoch {self.best.epoch} are not in memory after "
                      "the resume; keeping the last weights (ModelCheckpoint(save_best=...) saves them)")
            return
        state.model.module.load_state_dict(self.best_weights)
        state.log(f"early stopping: restored the weights of epoch {self.best.epoch} "
                  f"({self.monitor}={self.best.value:.4f})")

    def state_dict(self) -> dict:
        return {"best": self.best.state_dict(), "bad_epochs": self.bad_epochs}

    def load_state_dict(self, state: dict) -> None:
        self.best.load_state_dict(state["best"])
        if type(state["bad_epochs"]) is not int or state["bad_epochs"] < 0:
            raise ValueError(f"bad_epochs {str(state['bad_epochs'])[:20]!r} is not a count")
        self.bad_epochs = state["bad_epochs"]


class ChanceMonitor(Callback):
    """Says once, in one line, when the first `epochs` evaluations all sit at chance for `num_classes` classes
    on the validation images: top-1 within two standard errors of 1/K, or the validation loss within 2% of ln K
    (the same distribution predicted for every image). With the training images at chance too, `advice` says
    the likely fix; while training accuracy is above chance, it watches on, and once training top-1 is halfway
    from chance to 1 with validation still at chance, the network learns what evaluation does not see
    (BatchNorm statistics, validation images unlike the training ones) and `mismatch` says it. Each is a
    string, or a function of the epoch's results that gives one. A run that learns nothing is otherwise only
    visible to someone reading every epoch's numbers."""

    def __init__(self, num_classes: int, advice: str | Callable[[dict], str], epochs: int = 2,
                 mismatch: str | Callable[[dict], str] | None = None) -> None:
        self.k, self.advice, self.epochs = num_classes, advice, epochs
        self.mismatch = mismatch
        self.flat = 0  # consecutive evaluated epochs with validation at chance, from the first; -1: left chance
        self.said = False

    def at_chance(self, top1: float, loss: Optional[float], n: int) -> bool:
        p = 1 / self.k
        near = top1 <= p + 2 * math.sqrt(p * (1 - p) / max(n, 1))
        uniform = loss is not None and abs(loss - math.log(self.k)) <= 0.02 * math.log(self.k)
        return near or uniform

    def on_train_epoch_end(self, state: TrainState) -> None:
        r = state.eval_results
        top1 = r.get("val_top_1_accuracy")
        if top1 is None or self.said or self.flat < 0:
            return
        if not self.at_chance(float(top1), r.get("val_loss"), int(r.get("val_samples") or 0)):
            self.flat = -1  # validation learnt something: never say it
            return
        self.flat += 1
        train = r.get("train_top_1_accuracy")
        learning = train is not None and not self.at_chance(float(train), None, int(state.epoch_samples))
        learnt = learning and float(train) >= (1 + 1 / self.k) / 2  # halfway from chance to every image right
        if self.flat < self.epochs or (learning and not learnt) or (learnt and self.mismatch is None):
            return  # a network learning its training set may only be slow to show it: watch on
        self.said = True
        said = f"validation top-1 {float(top1):.4f} (loss {r.get('val_loss', float('nan')):.4f}) is chance for " \
               f"{self.k} classes (1/K = {1 / self.k:.4f}, ln K = {math.log(self.k):.4f}) after {self.flat} epochs"
        if learnt:
            state.log(f"warning: {said} while training top-1 reached {float(train):.4f}: {_say(self.mismatch, r)}")
        else:
            state.log(f"warning: {said}: {_say(self.advice, r)}")

    def state_dict(self) -> dict:
        return {"flat": self.flat, "said": self.said}

    def load_state_dict(self, state: dict) -> None:
        if type(state.get("flat")) is not int or type(state.get("said")) is not bool:
            raise ValueError("ChanceMonitor state is not a count and a flag")
        self.flat, self.said = state["flat"], state["said"]


def _say(advice: str | Callable[[dict], str], results: dict) -> str:
    return advice if isinstance(advice, str) else advice(results)


class ProgressBar(Callback):
    """A tqdm bar per epoch on `file` (default stderr); by default off when that is not a terminal (logs
    stay clean in CI and files)."""

    def __init__(self, enabled: Optional[bool] = None, file: Optional[TextIO] = None) -> None:
        self.file = file if file is not None else sys.stderr
        self.enabled = self.file.isatty() if enabled is None else enabled
        self.bar = None

    def on_train_begin(self, state: TrainState) -> None:
        if self.enabled and is_main_process():
            from tqdm import tqdm

            log = state.log_fn

            def write(msg: str) -> None:  # keep log lines from tearing the bar
                with tqdm.external_write_mode(file=self.file):
                    log(msg)

            state.log_fn = write

    def on_train_epoch_begin(self, state: TrainState) -> None:
        if self.enabled and is_main_process():
            from tqdm import tqdm

            self.bar = tqdm(total=state.steps_per_epoch, initial=state.step_in_epoch,
                            desc=f"epoch {state.epoch + 1}/{state.epochs}", leave=False, dynamic_ncols=True,
                            file=self.file)

    def on_train_step_end(self, state: TrainState) -> None:
        if self.bar is not None:
            self.bar.update(1)
            if state.step_in_epoch % 20 == 0:
                self.bar.set_postfix(loss=f"{state.output.loss.item():.4f}")

    def on_train_epoch_end(self, state: TrainState) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
