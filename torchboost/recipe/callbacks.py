"""Config -> the callbacks of a training run (monitors, THOR's health report, checkpoints, and the loggers
train.loggers names: TensorBoard, the history files, MLflow; profiling)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

from torch.utils.data import DataLoader

from torchboost import distributed as dist
from torchboost.recipe.config import Config
from torchboost.recipe.diff import flatten
from torchboost.recipe.final_test import FinalTest
from torchboost.recipe.kinds import get_kind
from torchboost.train.callbacks import (CheckpointConfig, EarlyStopping, FreezeBackbone, History, LossMonitor,
                                        ModelCheckpoint, ProgressBar, TensorBoard, TimeMonitor)
from torchboost.train.profiling import DataStarvationMonitor, ProfilerCallback
from torchboost.train.state import Callback
from torchboost.train.thor_health import ThorHealthMonitor
from torchboost.train.tracking import (MLflowLogger, artifact_folder, artifacts_here, local_store,
                                      tracking_uri_from_env)


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
                                 DataStarvationMonitor(loader=train_loader, decodes=not get_kind(cfg.data.dataset).in_memory),
                                 ThorHealthMonitor(out)]  # silent unless the optimizer has THOR's factors
    if t.early_stopping_patience or t.restore_best:  # restore_best alone: patience None watches, never stops
        callbacks.append(EarlyStopping(monitor=t.monitor, patience=t.early_stopping_patience,
                                       restore_best=t.restore_best))
    if t.freeze_backbone_epochs:
        callbacks.insert(0, FreezeBackbone(t.freeze_backbone_epochs))
    loggers = t.loggers
    callbacks.append(ckpt_cb)
    # after the checkpoints, before the loggers; images drawn at random have no split to test on
    if t.test_at_end and not get_kind(cfg.data.dataset).drawn and dist.is_main():
        callbacks.append(FinalTest(cfg, out, ckpt_cb, log, dist.get_world_size()))
    if "csv" in loggers:
        callbacks.append(History(out))
    if profile is not None:
        callbacks.append(ProfilerCallback(profile or out / "profile"))
    if "tensorboard" in loggers:
        try:
            callbacks.append(TensorBoard(out / "tensorboard"))
        except ImportError:
            log("note: TensorBoard not installed; `pip install tensorboard` for event files")
    if "mlflow" in loggers:  # last: it logs what the others added to the epoch's results
        callbacks.append(mlflow_logger(cfg, out, ckpt_cb))
    return callbacks, ckpt_cb


def mlflow_logger(cfg: Config, out: Path, ckpt_cb: ModelCheckpoint) -> MLflowLogger:
    """The store: train.mlflow.tracking_uri, else MLFLOW_TRACKING_URI, else OUTPUT/mlflow (a SQLite file and its
    artifacts, nothing written outside the run folder). A database or file store of the user's own creates its
    experiments with their artifacts in OUTPUT/mlflow/artifacts (MLflow's default is ./mlruns of the current
    folder); a tracking server keeps them where it says. Parameters: the resolved config, flat; artifacts at the
    end: the best checkpoint (else the last) and config.yaml."""
    m = cfg.train.mlflow
    uri = m.tracking_uri or tracking_uri_from_env()
    location, confine = None, None
    if uri is None:
        (uri, location), confine = local_store(out), out
    elif artifacts_here(uri):  # the user's database or file store: artifacts in the run folder, not ./mlruns
        location = artifact_folder(out)

    def artifacts() -> list[tuple[Optional[Path], Optional[str]]]:
        best = ckpt_cb.best_path if ckpt_cb.best is not None and ckpt_cb.best_path.is_file() else ckpt_cb.last_path
        return [(best, "checkpoints"), (out / "config.yaml", None)]

    return MLflowLogger(uri, m.experiment or cfg.name, run_name=Path(out).resolve().name,
                        params=flatten(cfg.to_dict()), tags={"torchboost.output": str(Path(out).resolve())},
                        artifacts=artifacts, artifact_location=location, confine=confine, rank=dist.get_rank())
