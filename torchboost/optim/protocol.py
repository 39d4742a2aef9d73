"""What a trainer needs from an optimizer beyond `torch.optim.Optimizer`, declared in one place.

`TrainStep` drives any optimizer through these, never by probing for attributes:

- `step()` / `step(closure)`: torch's. `needs_closure` says the step re-evaluates the loss itself (DimReduce's
  line search) and must be given a closure.
- `compilable`: whether the step may be compiled with the rest of the update (`train.compile`).
- `maskable`: whether an applied step can be undone on the device by restoring the parameters, the state and
  param-group tensors (`train.undo`: the skip policy and overflow checks without a host read). Declared, never
  assumed: off for any optimizer that does not say so, on for torch's own known to keep their state in those
  tensors on the parameters' device (`maskable_of`).
- `compile_own_step(mode)` / `eager_forward()`: an optimizer that compiles part of its own step (THOR: the
  update between refreshes) and needs the forward eager on some updates (THOR's refreshes capture statistics).
- `swaps_weights`, `train_weights()` / `eval_weights()`: the step moves other parameters than the weights to
  evaluate and save (schedule-free optimizers evaluate an average of their iterates). The trainer calls
  `eval_weights()` before every evaluation and checkpoint, then recomputes BatchNorm's running statistics at those
  weights (they were gathered at the training ones; `train.eval_weights`), and `train_weights()` before the next
  update. The mode travels in `state_dict()`, so a checkpoint resumes in the mode it was saved in.
- `attach_grad_scaler(scaler)`: the trainer tells the optimizer the `torch.amp.GradScaler` that scales the
  backward pass (THOR divides its G factors by the live scale); called once, with None when there is none.
- per-group lr scale: a param group's `"lr_scale"` (default 1) multiplies the schedule's lr for that group
  (a head at 10x the backbone's lr); `optim.groups.param_groups` and `scale_lr_of` set it. Torch allows
  extra keys in param groups, and the trainer only reads it.
- checkpoint state: torch's `state_dict()` / `load_state_dict()`.

An optimizer of torchboost's declares its answers by deriving from `TrainerProtocol`; any other torch
optimizer gets the defaults (`protocol_of`), which are a plain optimizer's: no closure, no use for the scale.
"""

from __future__ import annotations

from typing import ClassVar

import torch

LR_SCALE = "lr_scale"


class TrainerProtocol:
    """Mixin for optimizers with needs of their own; the defaults are a plain torch optimizer's."""

    needs_closure: ClassVar[bool] = False
    # whether TrainStep may torch.compile the optimizer's step (StepOptions.compile): not for optimizers that
    # hook the model (THOR's capture hooks) or re-run the forward themselves
    compilable: ClassVar[bool] = True
    # whether TrainStep may undo an applied step on the device by restoring the parameters and the state and
    # param-group tensors: only where every value the step writes is such a tensor on its parameter's device (not
    # THOR's factors and refresh counters, DimReduce's line search, schedule-free's group numbers)
    maskable: ClassVar[bool] = False
    # whether the parameters the step moves differ from the weights to evaluate (train_weights / eval_weights swap
    # them): the trainer then recomputes BatchNorm's statistics at the evaluated weights
    swaps_weights: ClassVar[bool] = False

    def train_weights(self) -> None:
        """Put the weights the step moves in the parameters (schedule-free: y); a no-op when they are there."""

    def eval_weights(self) -> None:
        """Put the weights to evaluate and save in the parameters (schedule-free: the average x); a no-op when
        they are there."""

    def attach_grad_scaler(self, scaler: torch.amp.GradScaler | None) -> None:
        """Called by the trainer with the GradScaler of the backward pass (None: unscaled)."""

    def compile_own_step(self, mode: str) -> bool:
        """torch.compile (in `mode`) what can be compiled of the step, and say True; the trainer then calls
        step() as it is. False (the default): the trainer compiles step() whole."""
        return False

    def eager_forward(self) -> bool:
        """Whether the coming update's forward and backward must run uncompiled (THOR's capture hooks on a
        refresh update)."""
        return False


_PLAIN = TrainerProtocol()


def protocol_of(optimizer: torch.optim.Optimizer) -> TrainerProtocol:
    """The optimizer's own answers when it declares them, else a plain optimizer's."""
    return optimizer if isinstance(optimizer, TrainerProtocol) else _PLAIN


# torch's optimizers whose every state value is a tensor the step writes in place (the exact classes: a subclass
# may keep state elsewhere); Adam's and AdamW's step counter lives on the CPU unless fused or capturable, where an
# undo's flag would be copied to the host and waited for
MASKABLE_TORCH: dict[type, tuple[str, ...]] = {torch.optim.SGD: (), torch.optim.Adam: ("fused", "capturable"),
                                               torch.optim.AdamW: ("fused", "capturable")}


def maskable_of(optimizer: torch.optim.Optimizer) -> bool:
    """Whether an applied step of `optimizer` can be undone on the device (`TrainerProtocol.maskable`): its own
    declaration, else True only for torch's optimizers in MASKABLE_TORCH (with their state on the device)."""
    if isinstance(optimizer, TrainerProtocol):
        return optimizer.maskable
    needs = MASKABLE_TORCH.get(type(optimizer))
    if needs is None:
        return False
    on_cpu = all(p.device.type == "cpu" for g in optimizer.param_groups for p in g["params"])
    return not needs or on_cpu or any(optimizer.defaults.get(k) for k in needs)


def lr_scale(group: dict) -> float:
    """The share of the schedule's lr this param group takes (1 unless the group says otherwise)."""
    return float(group.get(LR_SCALE, 1.0))
