"""Extension points of `TrainStep`: boost algorithms, Adasum and user code plug in here.

One optimizer update of `TrainStep` calls, in order:

    hook.before_update(step)        # before the first micro-batch's forward (e.g. grad_freeze toggles
                                    # requires_grad here so frozen layers skip backward work)
    ... forward / scaled backward for every micro-batch ...
    hook.on_gradients(model)        # gradients unscaled and finite, before clipping
                                    # (e.g. gradient centralization)
    ... clip ...
    hook.before_optimizer(model)    # right before optimizer.step (e.g. Adasum snapshots w_old)
    ... optimizer.step ...
    hook.after_optimizer(model)     # right after optimizer.step (e.g. Adasum combines weight deltas)

A hook that is not needed is simply not overridden. `on_gradients`, `before_optimizer` and
`after_optimizer` are skipped for updates dropped by the loss scaler (overflow).
"""

from __future__ import annotations

from torch import nn


class StepHook:
    """Base class with no-op extension points (override the ones you need)."""

    def before_update(self, step: int) -> None:
        """Called once per optimizer update, with the global update index, before any forward."""

    def on_gradients(self, model: nn.Module) -> None:
        """Called with unscaled, finite gradients, before gradient clipping."""

    def before_optimizer(self, model: nn.Module) -> None:
        """Called right before `optimizer.step()`."""

    def after_optimizer(self, model: nn.Module) -> None:
        """Called right after `optimizer.step()`."""

    def state_dict(self) -> dict:
        """Plain tensors/values to save in checkpoints (resume must be exact)."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore what `state_dict` returned."""
