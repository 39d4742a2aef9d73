"""Any torch optimizer preconditioned by THOR, as one Optimizer object (for trainers and checkpoints)."""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import Tensor, nn

from torchboost.errors import ConfigError
from torchboost.optim.muon import muon_optimizer
from torchboost.optim.closure import evaluate_closure
from torchboost.optim.thor.args import ThorOptions
from torchboost.optim.thor.preconditioner import PreconditionedProtocol, ThorPreconditioner


class ThorPreconditioned(PreconditionedProtocol, torch.optim.Optimizer):
    """`step()` = `preconditioner.step()` then `optimizer.step()`. Shares the inner optimizer's param groups and state, so lr schedules, `zero_grad` and
    `lr_scale` keys act on it directly; torch's step hooks registered on it fire around the whole step."""

    def __init__(self, optimizer: torch.optim.Optimizer, preconditioner: ThorPreconditioner) -> None:
        # torch's own initialisation (hooks, step patching) over the inner optimizer's groups: add_param_group
        # keeps the very dicts it is given, so both objects see one set of groups; the state is shared the
        # same way (Optimizer's public attributes).
        graft = preconditioner.options.graft
        if graft in ("sgd_step", "muon_step"):  # they size THOR's own update, not an inner one
            raise ConfigError(f"graft={graft} sizes THOR's own momentum step, and a preconditioner in "
                              "front of another optimizer takes that optimizer's step",
                              "use graft=grad or none here, or the thor optimizer with graft=sgd_step/muon_step")
        if preconditioner.options.decoupled_decay:
            raise ConfigError("decoupled_decay orders THOR's own weight decay, and a preconditioner in front of "
                              "another optimizer leaves weight decay to that optimizer (Muon's is decoupled)",
                              "leave decoupled_decay unset here")
        super().__init__(optimizer.param_groups, optimizer.defaults)
        self.param_groups, self.state = optimizer.param_groups, optimizer.state
        self.optimizer, self.preconditioner = optimizer, preconditioner

    @torch.no_grad()
    def step(self, closure: Callable[[], Tensor] | None = None) -> Tensor | None:
        loss = evaluate_closure(closure)
        self.preconditioner.step()
        self.optimizer.step()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none)

    def state_dict(self) -> dict:
        return {"optimizer": self.optimizer.state_dict(), "thor": self.preconditioner.state_dict()}

    def load_state_dict(self, state_dict: dict) -> None:
        self.optimizer.load_state_dict(state_dict["optimizer"])
        self.preconditioner.load_state_dict(state_dict["thor"])


def thor_muon(model: nn.Module, lr: float, options: ThorOptions | None = None, *, momentum: float = 0.95,
              weight_decay: float = 0.0, nesterov: bool = True, input_layer: str = "adamw",
              row_beta: float | None = None, **preconditioner: Any) -> ThorPreconditioned:
    """Muon (hidden weights) + AdamW (input layer, head, biases; see `muon_split`) on THOR-preconditioned
    gradients: G^-1 grad A^-1 is orthogonalised instead of the raw gradient (`row_beta`: NorMuon). `options`
    and `**preconditioner` (ThorOptions fields by name, or its Python-only arguments) go to ThorPreconditioner."""
    pre = ThorPreconditioner(model, options, **preconditioner)
    inner = muon_optimizer(model, lr, momentum, weight_decay, nesterov, input_layer=input_layer, row_beta=row_beta)
    return ThorPreconditioned(inner, pre)
