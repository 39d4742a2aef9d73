"""`torchboost race`: one recipe, several optimizers, each over a small lr grid, raced fairly.

Every (optimizer, lr, seed) run gets the same initial weights (seeded per seed), batch order and
augmentation (the sampler's per-seed stream), the recipe's lr schedule shape over the same epoch budget and
the same training step (`TrainStep`). Runs are interleaved epoch by epoch - epoch 1 of every run, then
epoch 2 of every run, in an order rotated each round - so load on a shared machine hits all alike.
Seconds are training only: each epoch's batches are fetched before its clock starts (data loading is the
same for every optimizer) and evaluation is excluded. A run stops at the epoch budget, its own
training-time budget, divergence, or (by default) once it reached every target.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

import numpy as np
import torch
from torch import nn

from torchboost.data import build_loader, load_builtin, load_mnist_idx, load_paddle_json
from torchboost.errors import ConfigError, suggest
from torchboost.losses import CrossEntropySmooth
from torchboost.models import create_model
from torchboost.optim import THOR, build_lr_schedule, muon_optimizer, param_groups
from torchboost.optim.thor import thor_muon
from torchboost.recipe.config import Config
from torchboost.seed import seed_everything
from torchboost.train.step import TrainStep

BuildFn = Callable[[nn.Module, float, int], torch.optim.Optimizer]  # (model, lr, total updates) -> optimizer
DEFAULT_LRS = {"sgd": (0.01, 0.02, 0.05), "adamw": (0.001, 0.002, 0.005), "muon": (0.01, 0.02, 0.05),
               "thor": (0.01, 0.02, 0.05), "thor-muon": (0.01, 0.02, 0.05)}


@dataclass
class Racer:
    """One contender: a name, its lr grid and how to build it. `make_step(model, loss_fn, optimizer,
    schedule)` may replace TrainStep for optimizers that drive forward/backward themselves (K-FAC peers);
    it returns a callable (x, y, update index) -> loss."""

    name: str
    lrs: tuple[float, ...]
    build: BuildFn
    make_step: Callable | None = None


def builtin_racer(name: str, cfg: Config, lrs: Iterable[float] | None = None) -> Racer:
    """sgd | adamw | muon | thor | thor-muon, with the recipe's momentum, nesterov, weight decay and
    `optim.thor` (Muon keeps its own momentum 0.95 and nesterov)."""
    o = cfg.optim
    wd = o.weight_decay

    def sgd(model: nn.Module, lr: float, total: int) -> torch.optim.Optimizer:
        groups = param_groups(model, wd, o.decay_bn_and_bias)
        return torch.optim.SGD(groups, lr=lr, momentum=o.momentum, nesterov=o.nesterov)

    def adamw(model: nn.Module, lr: float, total: int) -> torch.optim.Optimizer:
        return torch.optim.AdamW(param_groups(model, wd, o.decay_bn_and_bias), lr=lr)

    def muon(model: nn.Module, lr: float, total: int) -> torch.optim.Optimizer:
        return muon_optimizer(model, lr=lr, weight_decay=wd)  # Muon's own momentum 0.95, nesterov

    def thor(model: nn.Module, lr: float, total: int) -> torch.optim.Optimizer:
        kw = {"damping": 0.03, **o.thor}
        return THOR(model, lr=lr, momentum=o.momentum, weight_decay=wd, use_nesterov=o.nesterov, **kw)

    def thor_muon_(model: nn.Module, lr: float, total: int) -> torch.optim.Optimizer:
        return thor_muon(model, lr, weight_decay=wd, **{"damping": 0.03, **o.thor})

    builders = {"sgd": sgd, "adamw": adamw, "muon": muon, "thor": thor, "thor-muon": thor_muon_}
    if name not in builders:
        raise ConfigError(f"unknown race optimizer '{name}'", suggest(name, list(builders)))
    return Racer(name, tuple(lrs or DEFAULT_LRS[name]), builders[name])


def race_data(cfg: Config) -> tuple:
    """(training set, evaluation images, evaluation labels) of an in-memory data set."""
    d = cfg.data
    loaders = {"mnist5k": lambda s: load_builtin("mnist5k", s), "digits": lambda s: load_builtin("digits", s),
               "mnist_idx": lambda s: load_mnist_idx(Path(d.path), s),
               "paddle_json": lambda s: load_paddle_json(Path(d.path), s)}
    if d.dataset not in loaders:
        raise ConfigError(f"race runs on in-memory data sets, not data.dataset={d.dataset}",
                          f"use one of {', '.join(loaders)} (export a folder with `torchboost export-folder`)")
    train, test = loaders[d.dataset]("train"), loaders[d.dataset]("test")
    train.shift = d.random_shift
    test.set_stats(train.mean, train.std)  # evaluate with the training statistics, as training does
    x, y = test.__getitems__(range(len(test)))
    return train, x, y


def race_model(cfg: Config, image_size: int) -> nn.Module:
    """The recipe's network (in-memory data: its native image size)."""
    m = cfg.model
    if m.name == "mnist_cnn":
        kw: dict = {"image_size": image_size}
    else:
        kw = {"small_input": m.small_input, "zero_init_last_bn": m.zero_init_last_bn}
        if m.init is not None:
            kw["init"] = m.init
    return create_model(m.name, num_classes=m.num_classes, in_chans=m.in_chans, **kw)


def parse_lr_grids(items: Iterable[str]) -> dict[str, tuple[float, ...]]:
    """["sgd=0.01,0.02", "muon=0.02"] -> {"sgd": (0.01, 0.02), "muon": (0.02,)}."""
    grids = {}
    for item in items:
        name, _, values = item.rpartition("=")
        try:
            grids[name.strip()] = tuple(float(v) for v in values.split(","))
        except ValueError:
            raise ConfigError(f"bad lr grid '{item}'", "write NAME=LR[,LR...], e.g. sgd=0.01,0.02,0.05") from None
    return grids


@dataclass
class Lane:
    """One (racer, lr, seed) run in progress."""

    racer: str
    lr: float
    seed: int
    model: nn.Module
    step: Callable
    loader: torch.utils.data.DataLoader
    updates: int = 0
    seconds: float = 0.0
    history: list = field(default_factory=list)
    stopped: str = ""

    def train_epoch(self, epoch: int) -> float:
        self.loader.sampler.set_epoch(epoch)
        batches = list(self.loader)  # fetched before the clock starts: identical for every optimizer
        self.model.train()
        loss = torch.zeros(())
        start = time.perf_counter()
        for x, y in batches:
            loss = self.step(x, y, self.updates)
            self.updates += 1
        self.seconds += time.perf_counter() - start
        return float(loss)

    @torch.no_grad()
    def evaluate(self, x: torch.Tensor, y: torch.Tensor, batch: int = 1000) -> float:
        self.model.eval()
        hits = sum(int((self.model(x[i:i + batch]).argmax(1) == y[i:i + batch]).sum()) for i in range(0, len(x), batch))
        return hits / len(y)


def _lane(cfg: Config, racer: Racer, lr: float, seed: int, train_ds, epochs: int) -> Lane:
    seed_everything(seed)  # the same initial weights for every racer and lr of this seed
    model = race_model(cfg, train_ds.images.shape[-1])
    loader = build_loader(train_ds, cfg.data.batch_size, True, seed=seed)
    steps = len(loader)
    s = cfg.schedule
    schedule = build_lr_schedule(s.mode, lr, steps * epochs, steps, warmup_epochs=s.warmup_epochs,
                                 lr_init=s.lr_init, lr_end=s.lr_end, milestones=s.milestones, gamma=s.gamma,
                                 power=s.power)
    opt = racer.build(model, lr, steps * epochs)
    loss_fn = CrossEntropySmooth(sparse=True, reduction="mean", smooth_factor=cfg.train.label_smoothing,
                                 num_classes=cfg.model.num_classes)
    if racer.make_step is not None:
        step = racer.make_step(model, loss_fn, opt, schedule)
    else:
        train_step = TrainStep(model, loss_fn, opt, lr_schedule=schedule)
        step = lambda x, y, k: train_step([(x, y)], k).loss  # noqa: E731
    return Lane(racer.name, lr, seed, model, step, loader)


def run_race(cfg: Config, racers: list[Racer], seeds: Iterable[int], targets: tuple[float, ...],
             epochs: int | None = None, time_budget_s: float | None = None, stop_at_targets: bool = True,
             log: Callable[[str], None] = print,
             on_round: Callable[[list[Lane]], None] | None = None) -> list[Lane]:
    """Race every (racer, lr, seed), interleaved epoch by epoch; `on_round(lanes)` after each round of
    epochs. Returns the finished lanes (history per
    epoch: epoch, seconds (cumulative training time), val_top_1_accuracy, train_loss, order (position in
    the interleaved sequence of all runs' epochs))."""
    if not racers or not targets:
        raise ConfigError("a race needs at least one optimizer and one target", "pass --optimizers and --targets")
    if cfg.schedule.mode == "thor":
        raise ConfigError("race does not take schedule.mode=thor", "use cosine, poly, step or constant")
    epochs = epochs or cfg.train.epochs
    train_ds, xt, yt = race_data(cfg)
    lanes = [_lane(cfg, r, lr, seed, train_ds, epochs) for seed in seeds for r in racers for lr in r.lrs]
    order = 0  # global position of each trained epoch: the record of the interleaving
    for epoch in range(epochs):
        alive = [l for l in lanes if not l.stopped]
        if not alive:
            break
        shift = epoch % len(alive)  # rotate who goes first, so no racer always follows an evaluation
        for lane in alive[shift:] + alive[:shift]:
            loss = lane.train_epoch(epoch)
            acc = lane.evaluate(xt, yt)
            lane.history.append({"epoch": epoch + 1, "seconds": lane.seconds, "val_top_1_accuracy": acc,
                                 "train_loss": loss, "order": order})
            order += 1
            if not np.isfinite(loss):
                lane.stopped = "diverged"
            elif stop_at_targets and max(r["val_top_1_accuracy"] for r in lane.history) >= max(targets):
                lane.stopped = "reached every target"
            elif time_budget_s is not None and lane.seconds >= time_budget_s:
                lane.stopped = "time budget"
        best = {}
        for l in lanes:
            top = max((r["val_top_1_accuracy"] for r in l.history), default=0.0)
            best[l.racer] = max(best.get(l.racer, 0.0), top)
        log(f"epoch {epoch + 1}/{epochs}: {len(alive)} runs; best so far " +
            ", ".join(f"{k} {v:.2%}" for k, v in best.items()))
        if on_round is not None:  # e.g. save partial results: a stopped race keeps what it measured
            on_round(lanes)
    for lane in lanes:
        lane.stopped = lane.stopped or "epoch budget"
    return lanes
