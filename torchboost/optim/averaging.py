"""Weight averaging around any optimizer (`train.average`): SWA (Izmailov et al. 2018) and Lookahead (Zhang et al.
2019), the two averaging schemes beside EMA that time-to-accuracy recipes use (airbench uses both kinds).

- `SWA`: from update `start` on, every `every` updates, the weights join an equal-weight running average; the
  average is what evaluations and checkpoints see (`swaps_weights`: swapped in through the trainer protocol,
  BatchNorm's statistics then recomputed at it by `train.eval_weights`, as for schedule-free's average), while
  the step keeps moving the live weights (kept in the state while the average is in the parameters).
- `Lookahead`: every `k` updates the slow weights move `alpha` of the way to the fast ones, and the fast ones
  restart from there. The step's weights are the fast ones, evaluated as they are (timm's Lookahead does the
  same); what is averaged becomes the weights at each sync.

Both keep their tensors in the wrapped optimizer's per-parameter state (`swa_average`, `lookahead_slow`: one
per weight, the weight's shape) and their counts in its param groups, so a checkpoint is the wrapped
optimizer's own `state_dict()` — torch's format, resumed and checked as any other (`train.checkpoint`).
Written here rather than taken from `torch.optim.swa_utils.AveragedModel` or timm's `Lookahead`: AveragedModel
is a second module beside the network (its checkpoint, evaluation and BatchNorm would each need a path of their
own), and timm cannot be imported against this torch; the arithmetic is three lines each.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch
from torch import Tensor

from torchboost.errors import ConfigError
from torchboost.optim.protocol import TrainerProtocol, protocol_of

COUNT = "average_updates"  # a param-group key: the updates the wrapper has seen (saved with the groups)


class _Wrapped(TrainerProtocol, torch.optim.Optimizer):
    """An optimizer that runs `base`'s step and then its own: the same param groups (a schedule's lr reaches the
    base), the same state and checkpoint, the base's protocol answers where the wrapper has none of its own."""

    compilable = False  # its step reads host counts; train.compile refuses it in one line (TrainStep._compile)

    def __init__(self, base: torch.optim.Optimizer) -> None:  # torch's __init__ would copy the groups
        if protocol_of(base).swaps_weights or isinstance(base, _Wrapped):
            raise ConfigError(f"{type(base).__name__} already evaluates other weights than it trains",
                              "average one optimizer that does not (set train.average=none for schedule-free)")
        self.base = base
        # the base's own groups, state and defaults (shared, not copied); step, zero_grad and the state dict are the
        # base's too, so none of torch's Optimizer machinery runs on the wrapper itself
        self.param_groups, self.state, self.defaults = base.param_groups, base.state, base.defaults
        for g in self.param_groups:
            g.setdefault(COUNT, 0)

    @property
    def needs_closure(self) -> bool:  # type: ignore[override]
        return protocol_of(self.base).needs_closure

    def eager_forward(self) -> bool:
        return protocol_of(self.base).eager_forward()

    def attach_grad_scaler(self, scaler: torch.amp.GradScaler | None) -> None:
        protocol_of(self.base).attach_grad_scaler(scaler)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.base.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        return self.base.state_dict()

    def load_state_dict(self, state_dict: dict) -> None:
        self.base.load_state_dict(state_dict)
        self.param_groups, self.state = self.base.param_groups, self.base.state

    def params(self) -> list[Tensor]:
        return [p for g in self.param_groups for p in g["params"]]

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], Tensor]] = None) -> Any:
        loss = self.base.step(closure) if closure is not None else self.base.step()
        for g in self.param_groups:
            g[COUNT] += 1
        self.after_step(self.param_groups[0][COUNT])
        return loss

    def after_step(self, updates: int) -> None:
        raise NotImplementedError


class SWA(_Wrapped):
    """Stochastic weight averaging: the equal-weight average of the weights after update `start`, `start + every`,
    ... evaluated and saved in their place (BatchNorm recomputed at it)."""

    def __init__(self, base: torch.optim.Optimizer, start: int, every: int = 1) -> None:
        if start < 0 or every < 1:
            raise ConfigError(f"SWA start={start}, every={every}", "start >= 0 updates, every >= 1")
        super().__init__(base)
        self.start, self.every = start, every

    @property
    def swaps_weights(self) -> bool:  # type: ignore[override]
        """True once there is an average to evaluate (before it, the live weights are evaluated as they are)."""
        return any("swa_average" in self.state.get(p, {}) for p in self.params())

    def after_step(self, updates: int) -> None:
        if updates <= self.start or (updates - self.start - 1) % self.every:
            return
        for p in self.params():
            state = self.state[p]
            if "swa_average" not in state:
                state["swa_average"] = p.detach().clone()
                # a count on the device (no host read per update), exact far past any run's length
                state["swa_count"] = torch.ones((), dtype=torch.float64 if p.device.type != "mps" else torch.float32,
                                                device=p.device)
            else:
                state["swa_count"] += 1
                state["swa_average"].lerp_(p.detach(), (1 / state["swa_count"]).to(p.dtype))  # avg + (w - avg)/n

    def eval_weights(self) -> None:
        """The average in the parameters; the trained weights kept in the state (`swa_live`), so a checkpoint
        written now resumes them (the mode travels in state_dict(), as schedule-free's does)."""
        for p in self.params():
            state = self.state[p]
            if "swa_average" in state and "swa_live" not in state:
                state["swa_live"] = p.detach().clone()
                p.data.copy_(state["swa_average"])

    def train_weights(self) -> None:
        for p in self.params():
            live = self.state.get(p, {}).pop("swa_live", None)
            if live is not None:
                p.data.copy_(live)


class Lookahead(_Wrapped):
    """Every `k` updates: slow <- slow + alpha (fast - slow), and the fast weights restart at slow."""

    def __init__(self, base: torch.optim.Optimizer, k: int = 5, alpha: float = 0.5) -> None:
        if k < 1 or not 0 < alpha <= 1:
            raise ConfigError(f"Lookahead k={k}, alpha={alpha}", "k >= 1 updates, alpha in (0, 1]")
        super().__init__(base)
        self.k, self.alpha = k, alpha

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], Tensor]] = None) -> Any:
        for p in self.params():  # the slow weights start where training does
            if "lookahead_slow" not in self.state[p]:
                self.state[p]["lookahead_slow"] = p.detach().clone()
        return super().step(closure)

    def after_step(self, updates: int) -> None:
        if updates % self.k:
            return
        for p in self.params():
            slow = self.state[p]["lookahead_slow"]
            slow.lerp_(p.detach(), self.alpha)
            p.data.copy_(slow)


AVERAGES = ("none", "swa", "lookahead")


def averaged(optimizer: torch.optim.Optimizer, average: str, total_updates: int, start: float = 0.75,
             every: int = 1, k: int = 5, alpha: float = 0.5) -> torch.optim.Optimizer:
    """`optimizer` with `average` around it (`train.average`): SWA from `start` (a fraction of `total_updates`),
    Lookahead every `k`; "none": the optimizer itself."""
    if average == "swa":
        return SWA(optimizer, int(start * total_updates), every)
    if average == "lookahead":
        return Lookahead(optimizer, k, alpha)
    if average != "none":
        raise ConfigError(f"train.average={average!r}", f"use one of {', '.join(AVERAGES)}")
    return optimizer
