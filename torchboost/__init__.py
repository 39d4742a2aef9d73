"""torchboost: train image classifiers faster on PyTorch.

Progressive disclosure: `Model(net, loss_fn, optimizer).train(epochs, data)` for the common case,
`TrainStep` to customise one update, and every piece (THOR, EMA, Adasum, callbacks) usable alone.
`torchboost.recipe` runs whole jobs from YAML recipes (what the `torchboost` command does).
"""

from torchboost.errors import (CheckpointError, ConfigError, DataError, DistributedError, OutputError,
                               TorchboostError, TrainingError)
from torchboost.losses import CrossEntropySmooth
from torchboost.models import create_model, list_models
from torchboost.optim import THOR, get_thor_damping, get_thor_lr, thor
from torchboost.seed import seed_everything
from torchboost.train import (Callback, CheckpointConfig, DataStarvationMonitor, DynamicLossScaleManager,
                              EarlyStopping, FixedLossScaleManager, History, LossMonitor, Model, ModelCheckpoint,
                              ModelEMA, ProfilerCallback, ProgressBar, StepHook, TensorBoard, TimeMonitor,
                              TrainState, TrainStep)

__version__ = "0.1.0"

__all__ = [
    "__version__", "TorchboostError", "ConfigError", "DataError", "CheckpointError", "DistributedError",
    "OutputError", "TrainingError",
    "CrossEntropySmooth", "create_model", "list_models", "THOR", "thor", "get_thor_lr", "get_thor_damping",
    "seed_everything", "Model", "TrainStep", "TrainState", "StepHook", "Callback", "LossMonitor", "TimeMonitor",
    "CheckpointConfig", "ModelCheckpoint", "History", "EarlyStopping", "TensorBoard", "ProgressBar",
    "DataStarvationMonitor", "ProfilerCallback", "ModelEMA", "FixedLossScaleManager", "DynamicLossScaleManager",
]
