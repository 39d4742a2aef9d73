"""Determinism helper."""

from __future__ import annotations

import os
import random

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (CPU and CUDA). DataLoader workers derive their seeds from torch's
    generator, and torchboost's augmentations from (seed, epoch, index), so this is all a run needs."""
    os.environ["PYTHONHASHSEED"] = str(seed)
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
