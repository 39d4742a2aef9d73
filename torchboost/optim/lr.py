"""The learning rate has one source of truth: each param group's `lr`, which the update reads. A schedule
writes it through `set_lr` (times the group's `lr_scale`): TrainStep's `lr_schedule` before each update, or,
in a plain loop, `follow_schedule` on torch's public step pre-hook (how THOR takes MindSpore's per-update lr
arrays). An optimizer follows at most one schedule: TrainStep refuses a second (`follows_schedule`)."""

from __future__ import annotations

import contextlib
import weakref
from typing import Callable, Iterator

import torch
from torch.utils.hooks import RemovableHandle

from torchboost.optim.protocol import lr_scale

_FOLLOWING: "weakref.WeakSet[torch.optim.Optimizer]" = weakref.WeakSet()


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Every param group's lr = lr x its lr_scale (a head at 10x the backbone's, AdamW beside Muon)."""
    for g in optimizer.param_groups:
        g["lr"] = lr * lr_scale(g)


def follow_schedule(optimizer: torch.optim.Optimizer, schedule: Callable[[int], float],
                    index: Callable[[], int]) -> RemovableHandle:
    """Before each `optimizer.step()`, `set_lr(optimizer, schedule(index()))`; `index()` is the update about
    to run (state the optimizer checkpoints, so a resumed run reads the schedule where it stopped)."""
    _FOLLOWING.add(optimizer)
    return optimizer.register_step_pre_hook(lambda opt, args, kwargs: set_lr(opt, schedule(index())))


@contextlib.contextmanager
def lrs_as_tensors(optimizer: torch.optim.Optimizer, tensors: list[torch.Tensor]) -> Iterator[None]:
    """Each group's lr as a 0-d tensor (from `tensors`, one per group, refilled) for the duration: a compiled
    step reads a float as a constant of its graph and would recompile at every new value of a schedule. The
    groups get their plain numbers back after (checkpoints, schedulers)."""
    groups = optimizer.param_groups
    floats = [g["lr"] for g in groups]
    for g, t, lr in zip(groups, tensors, floats):
        g["lr"] = t.fill_(lr)
    try:
        yield
    finally:
        for g, lr in zip(groups, floats):
            g["lr"] = lr


def follows_schedule(optimizer: torch.optim.Optimizer) -> bool:
    """Whether `follow_schedule` put a schedule on this optimizer."""
    return optimizer in _FOLLOWING
