"""`torchboost race`: one recipe, several optimizers, each over a small lr grid, raced fairly.

Every (optimizer, lr, seed) run gets the same initial weights (seeded per seed), batch order and
augmentation (the sampler's per-seed stream), the recipe's lr schedule shape over the same epoch budget and
the same training step (`TrainStep`). A racer may carry its own budget (`Racer.epochs`; its schedule then
anneals over those epochs): the epoch count is a hyperparameter of time-to-accuracy, as MindSpore's THOR
recipe trains ResNet-50 for fewer epochs than its SGD recipe, so each racer can be given a budget grid.
Runs are interleaved epoch by epoch - epoch 1 of every run, then epoch 2 of every run, in an order rotated
each round - so load on a shared machine hits all alike.
Seconds are training only: each epoch's batches are fetched (and moved to the device) before its clock
starts (data loading is the same for every optimizer), the clock stops after the device finished the
epoch's work, and evaluation is excluded. The race runs on `train.device` (auto: the GPU when there is one)
in fp32, the same for every racer. A run stops at the epoch budget, its own
training-time budget, divergence, or (by default) once it reached and held every target (`reached_at`).
"""

from __future__ import annotations

import copy
import dataclasses
import math
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset

from torchboost.data import build_loader, set_epoch
from torchboost.errors import ConfigError, TrainingError
from torchboost.optim.registry import get_optimizer
from torchboost.recipe.build import build_loss, build_model, build_schedule, optimizer_from_config, with_optimizer
from torchboost.recipe.config import Config, merge, parse_override
from torchboost.recipe.data import input_norm
from torchboost.recipe.optimizers import race_policy
from torchboost.race.trace import layer_trace, traced_weights
from torchboost.plaindata import ascii_number
from torchboost.race.names import parse_racer
from torchboost.recipe.resolve import MIN_UPDATES, fit_batch, more_updates
from torchboost.recipe.validation import validate
from torchboost.seed import seed_everything
from torchboost.train.device import resolve_device, sync
from torchboost.train.eval_weights import to_eval_weights, to_train_weights
from torchboost.train.step import TrainStep, prepare_input
from torchboost.train.tta import with_tta

# (model, lr, updates per epoch, epochs) -> optimizer
BuildFn = Callable[[nn.Module, float, int, int], torch.optim.Optimizer]
RACE_SETS = ("name", "lr")  # optim keys the race itself sets for every racer (variant_racer refuses them)


@dataclass
class Racer:
    """One contender: a name, its lr grid and how to build it. `make_step(model, loss_fn, optimizer,
    schedule)` may replace TrainStep for optimizers that drive forward/backward themselves (K-FAC peers);
    it returns a callable (x, y, update index) -> loss."""

    name: str
    lrs: tuple[float, ...]
    build: BuildFn
    make_step: Callable | None = None
    epochs: int | None = None  # its own epoch budget (the schedule's length); None: the race's
    hold_lr: bool = False  # after the warm-up the lr holds at its peak (schedule-free: `RacePolicy.hold_lr`)


def race_setup(recipe: str, cfg: Config, images: int, epochs: int | str) -> tuple[Config, list[str]]:
    """(the config raced: its batch fitted to the data as `train` fits it, the lines that say what is raced:
    the recipe, data, batch and updates per epoch, and a warning when those are too few to rank by).
    `epochs`: the race's budget, or what to say when every racer has its own."""
    cfg, note = fit_batch(cfg, images, 1)
    batch = cfg.data.batch_size
    updates = images // batch  # the race's loaders drop the last partial batch, as training does
    where = f"{cfg.data.dataset} {cfg.data.path}" if cfg.data.path else cfg.data.dataset
    lines = [f"note: {note}"] if note else []
    lines.append(f"racing recipe {recipe} on {where} ({images} training images): batch {batch}, {updates} "
                 f"updates/epoch, {epochs} epochs")
    if updates < MIN_UPDATES:
        lines.append(f"warning: {updates} updates per epoch are too few for a meaningful ranking; "
                     + more_updates(images, cfg.model.name, "race"))
    return cfg, lines


def builtin_racer(name: str, cfg: Config, lrs: Iterable[float] | None = None) -> Racer:
    """A registered optimizer (torchboost.optim.registry), built exactly as `torchboost train` builds it
    (same builder, fused kernels, options), over `lrs` or its race lr grid (`recipe.optimizers.race_policy`)."""
    policy = race_policy(name)
    racer_cfg = with_optimizer(cfg, name)

    def build(model: nn.Module, lr: float, steps: int, epochs: int) -> torch.optim.Optimizer:
        run = dataclasses.replace(racer_cfg, train=dataclasses.replace(racer_cfg.train, epochs=epochs))
        return optimizer_from_config(run, model, lr, steps)

    return Racer(name, tuple(lrs or policy.lr_grid), build, hold_lr=policy.hold_lr)


def variant_racer(spec: str, cfg: Config, lrs: Iterable[float] | None = None) -> Racer:
    """A registered optimizer with some of its options changed, named by them: `thor[graft=muon_step]`,
    `muon[weight_norm=pin]`, `thor[graft=muon_step,weight_norm=pin]`. A key of the optimizer's own section
    (`optim.thor`) is set there, any other in `optim`; values are read as --set reads them and the result
    passes the one validation pass, so a variant is exactly a config `train` could run. A plain name is
    `builtin_racer`'s."""
    racer = parse_racer(spec)
    if racer.epochs is not None:
        raise ConfigError(f"racer {spec[:80]!r} names its budget", f"race it with --budget {racer.spec}={racer.epochs}")
    if not racer.options:
        return builtin_racer(racer.base, cfg, lrs)
    entry = get_optimizer(racer.base)
    section = cfg.optim.options.get(entry.options_key) if entry.options_key else None
    own = {f.name for f in dataclasses.fields(section)} if section is not None else set()
    variant = copy.deepcopy(with_optimizer(cfg, racer.base))  # its own optimizer first: a recipe of SGD races THOR's
    for key, value in racer.options:
        if key in RACE_SETS:  # the race sets these per lane: a variant's value would be silently overruled
            raise ConfigError(f"racer {spec[:80]!r} sets optim.{key}, which the race sets for every racer",
                              "give the lr with --lr NAME=LR, the optimizer by the racer's name")
        where = f"optim.{entry.options_key}." if key in own else "optim."
        merge(variant, parse_override(f"{where}{key}={value}"))
    validate(variant)
    return dataclasses.replace(builtin_racer(racer.base, variant, lrs), name=spec)


def parse_lr_grids(items: Iterable[str]) -> dict[str, tuple[float, ...]]:
    """["sgd=0.01,0.02", "muon=0.02", "sgd=0.05"] -> {"sgd": (0.01, 0.02, 0.05), "muon": (0.02,)}."""
    grids = {}
    for item in items:
        name, _, values = item.rpartition("=")
        try:
            lrs = tuple(float(ascii_number(v)) for v in values.split(","))
        except ValueError:
            raise ConfigError(f"bad lr grid '{item}'", "write NAME=LR[,LR...], e.g. sgd=0.01,0.02,0.05") from None
        if not all(math.isfinite(lr) and lr > 0 for lr in lrs):
            raise ConfigError(f"lr grid '{item}' holds a value that is not a finite number > 0",
                              "write NAME=LR[,LR...], e.g. sgd=0.01,0.02,0.05")
        grids[name.strip()] = tuple(dict.fromkeys(grids.get(name.strip(), ()) + lrs))  # repeats add up
    return grids


def parse_budgets(items: Iterable[str]) -> dict[str, tuple[int, ...]]:
    """["thor=6,8", "sgd=15"] -> {"thor": (6, 8), "sgd": (15,)}: epoch budgets, each raced as its own racer."""
    budgets = {}
    fix = "write NAME=EPOCHS[,EPOCHS...], e.g. thor=8,10"
    for item in items:
        name, _, values = item.rpartition("=")
        parts = values.split(",")
        if not name.strip() or not all(p.strip().isascii() and p.strip().isdigit() and 1 <= int(p) <= 100_000
                                       for p in parts):  # isdigit() passes '²', which int() refuses
            raise ConfigError(f"bad epoch budget '{item[:60]}' (whole numbers of epochs from 1 to 100000)", fix)
        budgets[name.strip()] = tuple(dict.fromkeys(budgets.get(name.strip(), ()) + tuple(int(p) for p in parts)))
    return budgets


def budget_racers(racer: Racer, budgets: Iterable[int] | None) -> list[Racer]:
    """`racer` as one racer per epoch budget, named NAME@EPOCHS (or unchanged without budgets)."""
    if not budgets:
        return [racer]
    return [dataclasses.replace(racer, name=f"{racer.name}@{b}", epochs=b) for b in budgets]


TARGET_RULE = ("a target counts as reached at the first evaluation at or above it whose next evaluation is also at "
               "or above it (the run's last evaluation counts alone)")


def reached_at(history: Sequence[dict], target: float) -> int | None:
    """The hold rule, the one definition of reaching a target (tables, selection, plot, JSON and the stop
    all use it): the index of the first evaluation at or above `target` whose NEXT evaluation is also at or
    above it; the run's last evaluation, with nothing after it, counts alone. None: never reached and held.
    A run that crossed the target and fell back at once (a collapse) has not reached it there."""
    accs = [r["val_top_1_accuracy"] for r in history]
    return next((i for i, a in enumerate(accs) if a >= target and (i + 1 == len(accs) or accs[i + 1] >= target)),
                None)


def held_every_target(history: Sequence[dict], targets: Sequence[float]) -> bool:
    """Every target reached and already confirmed by a later evaluation (not merely by being the last one so
    far): a run may stop here without the stop deciding the verdict."""
    at = reached_at(history, max(targets))  # held at the highest target: held at every lower one too
    return at is not None and at + 1 < len(history)


def fell_to_chance(history: Sequence[dict], classes: int) -> bool:
    """A run that learned (20 points above chance, 1/`classes`) and whose last evaluation is back within 5 points
    of chance: it diverged with a finite loss (it named no cause before: its final read as an 'epoch budget' one)."""
    accs = [r["val_top_1_accuracy"] for r in history]
    return bool(accs) and max(accs) >= 1 / classes + 0.2 and accs[-1] <= 1 / classes + 0.05


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
    budget: int = 0  # epochs this run may train (its racer's budget, else the race's)
    device: torch.device = torch.device("cpu")
    optimizer: torch.optim.Optimizer | None = None
    trace: bool = False  # race --trace: each epoch's row gets the layers' last update (race.trace)
    before: dict | None = field(default=None, repr=False)  # with trace: the weights before that update
    traced: dict | None = field(default=None, repr=False)  # with trace: the epoch's row of layer_trace
    input_norm: tuple | None = None  # (mean, std) of uint8 batches, normalised on the device as the step does
    tta: str = "none"  # eval.tta: how every evaluation sees the model (flip: logits averaged with the mirror's)

    def train_epoch(self, epoch: int, checkpoints: int = 1,
                    at_checkpoint: Callable[[float, float], None] | None = None) -> float:
        """Train one epoch; `checkpoints` evenly spaced points in it (the last at its end, which is the caller's)
        each stop the clock and call `at_checkpoint(epochs so far, the last loss)` (an evaluation, untimed). Each
        evaluation sees the weights the optimizer evaluates (`train.eval_weights`: schedule-free's average, its
        BatchNorm statistics recomputed from the epoch's batches, untimed as the evaluation is)."""
        set_epoch(self.loader, epoch)
        # Fetched and on the device before the clock starts: identical for every optimizer.
        batches = [(x.to(self.device), y.to(self.device)) for x, y in self.loader]
        inside = {round(len(batches) * (k + 1) / checkpoints) - 1 for k in range(checkpoints - 1)}
        self.model.train()
        to_train_weights(self.optimizer)
        loss = torch.zeros(())
        sync(self.device)
        start = time.perf_counter()
        self.before, self.traced = None, None
        try:
            for i, (x, y) in enumerate(batches):
                if self.trace and i == len(batches) - 1:  # the weights before the epoch's last update, untimed
                    sync(self.device)
                    self.seconds += time.perf_counter() - start
                    self.before = traced_weights(self.model)
                    start = time.perf_counter()
                loss = self.step(x, y, self.updates)
                self.updates += 1
                if at_checkpoint is not None and i in inside:
                    sync(self.device)
                    self.seconds += time.perf_counter() - start
                    to_eval_weights(self.optimizer, self.model, lambda: self._inputs(batches))
                    at_checkpoint(epoch + (i + 1) / len(batches), float(loss))
                    to_train_weights(self.optimizer)
                    self.model.train()
                    start = time.perf_counter()
        except TrainingError:  # a non-finite loss: in a race this lr diverged, the race goes on
            loss = torch.tensor(float("nan"))
            self.before = None
        sync(self.device)  # GPU kernels run asynchronously: the epoch ends when the device is done
        self.seconds += time.perf_counter() - start
        if self.before is not None:  # the last update between the weights the step moved, before any swap
            self.traced = layer_trace(self.model, self.before, self.optimizer)
        to_eval_weights(self.optimizer, self.model, lambda: self._inputs(batches))  # for the caller's evaluation
        return float(loss)

    def _inputs(self, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> Iterable[torch.Tensor]:
        """The epoch's inputs as the model sees them (BatchNorm's statistics are recomputed from them)."""
        return (prepare_input(x, self.device, input_norm=self.input_norm) for x, _ in batches)

    @torch.no_grad()
    def evaluate(self, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
        self.model.eval()
        model = with_tta(self.model, self.tta)
        hits = sum(int((model(x).argmax(1) == y).sum()) for x, y in batches)
        return hits / sum(len(y) for _, y in batches)


def _lane(cfg: Config, racer: Racer, lr: float, seed: int, train_ds: Dataset, device: torch.device) -> Lane:
    if racer.epochs is not None:  # this racer's own budget: its schedule anneals over its epochs
        cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, epochs=racer.epochs))
    if racer.hold_lr:  # the recipe's warm-up, then its peak lr to the end (cosine from the peak to the peak)
        cfg = dataclasses.replace(cfg, schedule=dataclasses.replace(cfg.schedule, mode="cosine", lr_end=cfg.optim.lr))
    seed_everything(seed)  # the same initial weights for every racer and lr of this seed
    loader = build_loader(train_ds, cfg.data.batch_size, True, seed=seed)
    model = build_model(cfg, loader).to(device)
    steps = len(loader)
    schedule = build_schedule(relative_schedule(cfg, lr), lr, steps)
    opt = racer.build(model, lr, steps, cfg.train.epochs)
    loss_fn = build_loss(cfg)
    norm = input_norm(cfg.data)
    if racer.make_step is not None:
        step = racer.make_step(model, loss_fn, opt, schedule)
    else:
        train_step = TrainStep(model, loss_fn, opt, lr_schedule=schedule, input_norm=norm, device=device)
        step = lambda x, y, k: train_step([(x, y)], k).loss  # noqa: E731
    return Lane(racer.name, lr, seed, model, step, loader, budget=cfg.train.epochs, device=device, optimizer=opt,
                input_norm=norm, tta=cfg.eval.tta)


def relative_schedule(cfg: Config, lr: float) -> Config:
    """The recipe's schedule for a racer at `lr`: its warm-up start and end lrs (absolute in a recipe, written
    for the recipe's own optim.lr) scaled by lr / optim.lr, so every racer warms up from the same fraction of
    its own lr (an absolute 0.005 would start AdamW at 1e-3 five times above its peak)."""
    ratio = lr / cfg.optim.lr
    s = dataclasses.replace(cfg.schedule, lr_init=cfg.schedule.lr_init * ratio, lr_end=cfg.schedule.lr_end * ratio)
    return dataclasses.replace(cfg, schedule=s)


def _eval_batches(cfg: Config, eval_ds: Dataset, device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The evaluation set, loaded once onto the device and shared by every run (a race is for quick sets)."""
    norm = input_norm(cfg.data)
    loader = build_loader(eval_ds, cfg.data.eval_batch_size, False, workers=cfg.data.workers)
    return [(prepare_input(x, device, input_norm=norm), y.to(device)) for x, y in loader]


def run_race(cfg: Config, train_ds: Dataset, eval_ds: Dataset, racers: list[Racer], seeds: Iterable[int],
             targets: tuple[float, ...],
             epochs: int | None = None, time_budget_s: float | None = None, stop_at_targets: bool = True,
             log: Callable[[str], None] = print,
             on_round: Callable[[list[Lane]], None] | None = None, trace: bool = False,
             evals_per_epoch: int = 1) -> list[Lane]:
    """Race every (racer, lr, seed) on a resolved config and its data sets (`recipe.load_resolved`),
    interleaved epoch by epoch; `on_round(lanes)` after each round of
    epochs. Returns the finished lanes (history per
    epoch: epoch, seconds (cumulative training time), val_top_1_accuracy, train_loss, order (position in
    the interleaved sequence of all runs' epochs); `evals_per_epoch` > 1 adds rows inside each epoch (its
    epoch a fraction), so a target's time is read finer than whole epochs; with `trace`, also the lr and each
    layer's last update of the epoch (race.trace.layer_trace)."""
    if not racers or not targets:
        raise ConfigError("a race needs at least one optimizer and one target", "pass --optimizers and --targets")
    if not all(0 < t <= 1 for t in targets):
        raise ConfigError(f"targets {list(targets)} are not all accuracies in (0, 1]", "e.g. --targets 0.975 0.98")
    if evals_per_epoch < 1:
        raise ConfigError(f"{evals_per_epoch} evaluations per epoch", "evaluate at least once an epoch")
    if any(r.epochs is not None and r.epochs < 1 for r in racers):
        raise ConfigError("an epoch budget below 1", "give each racer a budget of at least one epoch")
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, epochs=epochs or cfg.train.epochs))
    device = resolve_device(cfg.train.device)
    evaluation = _eval_batches(cfg, eval_ds, device)
    lanes = [_lane(cfg, r, lr, seed, train_ds, device) for seed in seeds for r in racers for lr in r.lrs]
    for lane in lanes:
        lane.trace = trace and lane.optimizer is not None
    epochs = max(l.budget for l in lanes)
    classes = cfg.model.num_classes  # resolved from the data (a config built in Python may leave it unset)
    order = 0  # global position of each trained epoch: the record of the interleaving
    for epoch in range(epochs):
        alive = [l for l in lanes if not l.stopped]
        if not alive:
            break
        shift = epoch % len(alive)  # rotate who goes first, so no racer always follows an evaluation
        for lane in alive[shift:] + alive[:shift]:
            def record(epochs: float, loss: float, lane: Lane = lane) -> None:  # untimed: the clock is stopped
                lane.history.append({"epoch": epochs, "seconds": lane.seconds, "val_top_1_accuracy":
                                     lane.evaluate(evaluation), "train_loss": loss, "order": order})

            loss = lane.train_epoch(epoch, evals_per_epoch, record)
            record(epoch + 1, loss)
            if lane.traced is not None:
                lane.history[-1].update(lane.traced)
            order += 1
            if not np.isfinite(loss) or (classes and fell_to_chance(lane.history, classes)):
                lane.stopped = "diverged"
            elif stop_at_targets and held_every_target(lane.history, targets):
                lane.stopped = "reached and held every target"
            elif time_budget_s is not None and lane.seconds >= time_budget_s:
                lane.stopped = "time budget"
            elif epoch + 1 >= lane.budget:
                lane.stopped = "epoch budget"
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
