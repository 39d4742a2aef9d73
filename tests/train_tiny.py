"""Tiny networks, data and callbacks shared by the tests of torchboost.train (fast on one CPU thread)."""

from __future__ import annotations

import torch
from torch import nn

from torchboost.train.model import Model
from torchboost.train.state import Callback


def tiny_net(seed: int = 0, dropout: float = 0.0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Dropout(dropout),
                         nn.Linear(4 * 6 * 6, 5))


def tiny_data(n: int = 48, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """n images 1×6×6 whose label is learnable (the brightest quadrant's index, 5 classes with noise)."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 5, (n,), generator=g)
    x = torch.randn(n, 1, 6, 6, generator=g) * 0.5
    x[:, 0, 0, :] += y[:, None].float()  # the label is written faintly in the first row
    return x, y


def batches(n_batches: int = 6, size: int = 8, seed: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    x, y = tiny_data(n_batches * size, seed)
    return [(x[i * size:(i + 1) * size], y[i * size:(i + 1) * size]) for i in range(n_batches)]


def tiny_model(seed: int = 0, lr: float = 0.1, dropout: float = 0.0, **kw) -> Model:
    net = tiny_net(seed, dropout)
    return Model(net, nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9),
                 device="cpu", **kw)


class Capture(Callback):
    """Collects every logged line (put it first: it redirects the run's log)."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def on_train_begin(self, state) -> None:
        state.log_fn = self.lines.append


class StopAt(Callback):
    """Stops training after global update `step` (mid-epoch when it is not an epoch's last)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_step_end(self, state) -> None:
        if state.global_step == self.step:
            state.stop_training = True


class Scripted(Callback):
    """Replaces Model.train's results with scripted ones: `eval_results` per epoch (1-based) and fixed
    data/step times per update, so callbacks downstream see reproducible numbers."""

    def __init__(self, results: dict[int, dict] | None = None, times: tuple[float, float] = (0.001, 0.004)) -> None:
        self.results, self.times = results or {}, times

    def on_train_step_end(self, state) -> None:
        state.data_time, state.step_time = self.times

    def on_train_epoch_end(self, state) -> None:
        state.eval_results.update(self.results.get(state.epoch + 1, {}))
