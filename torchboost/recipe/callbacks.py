"""Config -> the callbacks of a training run (monitors, checkpoints, history, TensorBoard, profiling)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

from torch.utils.data import DataLoader

from torchboost.recipe.config import Config
from torchboost.recipe.kinds import get_kind
from torchboost.train.callbacks import (CheckpointConfig, EarlyStopping, FreezeBackbone, History, LossMonitor,
                                        ModelCheckpoint, ProgressBar, TensorBoard, TimeMonitor)
from torchboost.train.profiling import DataStarvationMonitor, ProfilerCallback
from torchboost.train.state import Callback


def build_callbacks(cfg: Config, out: Path, train_loader: DataLoader, profile: Optional[str],
                    log: Callable[[str], None]) -> tuple[list[Callback], ModelCheckpoint]:
    """(callbacks in the order they must run, the checkpoint callback). Order matters: the data-starvation
    monitor adds the figures History records, and EarlyStopping sees the epoch's evaluation first."""
    t, c = cfg.train, cfg.checkpoint
    ckpt_cb = ModelCheckpoint(c.prefix, out / "ckpt", CheckpointConfig(c.save_every_steps, c.save_every_epochs,
                                                                       c.keep_max),
                              save_best=t.monitor if c.save_best else None)
    callbacks: list[Callback] = [ProgressBar(None if t.progress_bar else False),
                                 LossMonitor(t.log_every, show_accuracy=t.per_batch_accuracy), TimeMonitor(),
                                 DataStarvationMonitor(loader=train_loader, decodes=not get_kind(cfg.data.dataset).in_memory)]
    if t.early_stopping_patience or t.restore_best:  # restore_best alone: patience None watches, never stops
        callbacks.append(EarlyStopping(monitor=t.monitor, patience=t.early_stopping_patience,
                                       restore_best=t.restore_best))
    if t.freeze_backbone_epochs:
        callbacks.insert(0, FreezeBackbone(t.freeze_backbone_epochs))
    callbacks += [ckpt_cb, History(out)]
    if profile is not None:
        callbacks.append(ProfilerCallback(profile or out / "profile"))
    try:
        callbacks.append(TensorBoard(out / "tensorboard"))
    except ImportError:
        log("note: TensorBoard not installed; `pip install tensorboard` for event files")
    return callbacks, ckpt_cb
