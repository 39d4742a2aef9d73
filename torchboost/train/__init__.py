"""Training library: `Model` (train/eval/predict), `TrainStep` (one update), callbacks, checkpoints, EMA,
loss scaling (torch.amp.GradScaler, FixedGradScaler), metrics and profiling callbacks. No config and no CLI here: `torchboost.recipe` builds these
from a recipe."""

from torchboost.train.callbacks import (CheckpointConfig, EarlyStopping, History, LossMonitor, ModelCheckpoint,
                                        ProgressBar, TensorBoard, TimeMonitor)
from torchboost.train.checkpoint import atomic_save, load_checkpoint, load_model_state
from torchboost.train.device import resolve_device
from torchboost.train.ema import ModelEMA
from torchboost.train.hooks import StepHook
from torchboost.train.loss_scale import FixedGradScaler
from torchboost.train.model import Model
from torchboost.train.profiling import DataStarvationMonitor, ProfilerCallback
from torchboost.train.state import Callback, TrainState
from torchboost.train.step import StepOptions, StepOutput, TrainStep

__all__ = [
    "Model", "TrainStep", "StepOptions", "StepOutput", "StepHook", "Callback", "TrainState", "LossMonitor", "TimeMonitor",
    "CheckpointConfig", "ModelCheckpoint", "History", "EarlyStopping", "TensorBoard", "ProgressBar",
    "DataStarvationMonitor", "ProfilerCallback", "ModelEMA", "FixedGradScaler", "atomic_save", "load_checkpoint", "load_model_state", "resolve_device",
]
