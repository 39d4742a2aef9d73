"""torchboost: train image classifiers faster on PyTorch.

Progressive disclosure: `Model(net, loss_fn, optimizer).train(epochs, data)` for the common case,
`TrainStep` to customise one update, and every piece (THOR, EMA, Adasum, callbacks) usable alone.
`torchboost.recipe` runs whole jobs from YAML recipes (what the `torchboost` command does).

The names below are imported from their modules on first use (`torchboost.Model` imports the training
library then): `import torchboost` and the `torchboost` command's start import no torch, so
`torchboost --help` answers at once. `_EXPORTS` is the one list of them; `__all__` is its keys.
"""

from __future__ import annotations


from torchboost.errors import (CheckpointError, ConfigError, DataError, DistributedError, OutputError,
                               TorchboostError, TrainingError)
from torchboost.lazy import lazy_exports

__version__ = "0.1.0"

# public name -> the module it is imported from on first use
_EXPORTS = {
    "CrossEntropySmooth": "torchboost.losses",
    "create_model": "torchboost.models", "list_models": "torchboost.models",
    "THOR": "torchboost.optim", "get_thor_lr": "torchboost.optim",
    "get_thor_damping": "torchboost.optim",
    "seed_everything": "torchboost.seed",
    **dict.fromkeys(("Model", "TrainStep", "StepOptions", "TrainState", "StepHook", "Callback", "LossMonitor",
                     "TimeMonitor", "CheckpointConfig", "ModelCheckpoint", "History", "EarlyStopping", "TensorBoard", "ProgressBar",
                     "DataStarvationMonitor", "ProfilerCallback", "ModelEMA", "FixedGradScaler"),
                    "torchboost.train"),
    # MindSpore's names (torchboost.compat.mindspore translates them to the ones above)
    **dict.fromkeys(("thor", "FixedLossScaleManager", "DynamicLossScaleManager"), "torchboost.compat.mindspore"),
}

__all__ = [
    "__version__", "TorchboostError", "ConfigError", "DataError", "CheckpointError", "DistributedError",
    "OutputError", "TrainingError", *_EXPORTS,
]


__getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)
