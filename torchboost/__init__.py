"""torchboost: train image classifiers faster on PyTorch.

Progressive disclosure: `Model(net, loss_fn, optimizer).train(epochs, data)` for the common case,
`TrainStep` to customise one update, and every piece (THOR, EMA, Adasum, callbacks) usable alone.
"""

from .errors import CheckpointError, ConfigError, DataError, DistributedError, TorchboostError
from .losses import CrossEntropySmooth
from .models import create_model, list_models
from .seed import seed_everything
from .train.callbacks import (Callback, CheckpointConfig, EarlyStopping, History, LossMonitor, ModelCheckpoint,
                              TimeMonitor)
from .train.ema import ModelEMA
from .train.hooks import StepHook
from .train.loss_scale import DynamicLossScaleManager, FixedLossScaleManager
from .train.model import Model
from .train.step import TrainStep

__version__ = "0.1.0"


def __getattr__(name: str):
    # THOR is imported on first use: most runs never need it.
    if name in ("THOR", "thor", "get_thor_lr", "get_thor_damping"):
        from .optim import thor as _thor, thor_schedules as _sched

        return getattr(_thor, name, None) or getattr(_sched, name)
    raise AttributeError(f"module 'torchboost' has no attribute {name!r}")
