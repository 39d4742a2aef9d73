"""torchboost: train image classifiers faster on PyTorch."""

__version__ = "0.1.0"
