"""Schedule-free SGD and AdamW (Defazio et al. 2024, "The Road Less Scheduled"; the `schedulefree` package) behind
the trainer protocol. The step moves an interpolation y between the SGD/Adam iterate z and the running average x
of the iterates, and x is what to evaluate and save: `eval_weights()` puts x in the parameters, `train_weights()`
puts y back (the package's own `eval()` / `train()`), and the trainer recomputes BatchNorm's statistics at x
(`train.eval_weights`). Built in training mode, so a hand-written loop steps at once.

Imported only when one is built: `schedulefree` is an optional package (`pip install 'torchboost[optimizers]'`).
"""

from __future__ import annotations

import schedulefree

from torchboost.optim.protocol import TrainerProtocol


class _ScheduleFree(TrainerProtocol):
    swaps_weights = True
    compilable = False  # the step reads and writes host numbers in its groups (k, weight_sum, lr_max) every update

    def train_weights(self) -> None:
        self.train()

    def eval_weights(self) -> None:
        self.eval()


class ScheduleFreeSGD(schedulefree.SGDScheduleFree, _ScheduleFree):
    """schedulefree.SGDScheduleFree, in training mode from the start, with the trainer's protocol."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.train()


class ScheduleFreeAdamW(schedulefree.AdamWScheduleFree, _ScheduleFree):
    """schedulefree.AdamWScheduleFree, in training mode from the start, with the trainer's protocol."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.train()
