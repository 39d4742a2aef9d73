"""thor_soap: SOAP (Vyas et al. 2024, arXiv 2409.11321) in the eigenbasis of THOR's Kronecker factors.

SOAP runs Adam in the eigenbasis of Shampoo's factors (L = sum W W^T, R = sum W^T W); here the basis is that of
THOR's K-FAC factors instead (A: the layer's input statistics, G: its output gradients'), refreshed every
`frequency` updates by the `ThorPreconditioner` (with `factor_decay`: of their moving average over refreshes).
Per Conv2d/Linear weight, per conv group, with W the gradient as out x in:

    W' = Q_G^T W Q_A                                  (`eigen.rotate`, block-diagonal bases at split_dim)
    m <- beta1 m + (1 - beta1) W';  v <- beta2 v + (1 - beta2) W'^2;  t = the update's number, from 1
    m_hat = m / (1 - beta1^t);  v_hat = v / (1 - beta2^t)
    P = Q_G (m_hat / (sqrt(v_hat) + eps)) Q_A^T;  w <- w (1 - lr wd) - lr P   (AdamW's decoupled weight decay)

eps is THOR's damping (`damping_mode: absolute`, Adam's epsilon) or damping x the mean of sqrt(v_hat) over the
layer (`trace`: relative, so a loss multiplied by a constant takes the same step). At a refresh m is carried
into the new basis (rotated back with the old one, forward with the new one) and v is kept, as the paper's
code does. Every other parameter (biases, BatchNorm) gets the same Adam update without a rotation, as SOAP
leaves 1-D parameters unpreconditioned. beta1 is the optimizer's momentum, beta2 `soap_beta2`.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

import torch
import torch.distributed as dist
from torch import Tensor, nn

from torchboost.errors import CheckpointError, ConfigError
from torchboost.optim.closure import evaluate_closure
from torchboost.optim.thor.args import ThorArgs, ThorOptions, check_thor_args, thor_options
from torchboost.optim.thor.eigen import EigenState, rotate, unrotate
from torchboost.optim.thor.layer import ThorLayer
from torchboost.optim.thor.preconditioner import PreconditionedProtocol, ThorPreconditioner


def adam_divisor(v: Tensor, t: int, beta2: float, damping: float, relative: bool) -> tuple[Tensor, Tensor]:
    """(sqrt(v_hat), eps) after update t: the bias-corrected root second moment and the epsilon added to it,
    `damping` or (relative) damping x the mean of sqrt(v_hat)."""
    root = (v / (1.0 - beta2 ** t)).sqrt()
    return root, damping * root.mean() if relative else torch.tensor(damping, dtype=v.dtype)


def adam_direction(m: Tensor, v: Tensor, t: int, betas: tuple[float, float], damping: float,
                   relative: bool) -> Tensor:
    """m_hat / (sqrt(v_hat) + eps) from the moments after update t (bias-corrected; eps: `adam_divisor`)."""
    root, eps = adam_divisor(v, t, betas[1], damping, relative)
    return (m / (1.0 - betas[0] ** t)) / (root + eps)


class ThorSOAP(PreconditionedProtocol, torch.optim.Optimizer):
    """Adam in the eigenbasis of THOR's factors (see the module). `params`: the model's parameters or param groups
    (each may set `lr`, `weight_decay`); `options` / `**overrides`: THOR's curvature options (`frequency`,
    `split_dim`, `factor_decay`, `factor_samples`, `damping` and `damping_mode` for the epsilon, `soap_beta2`).
    Python-only, passed to the preconditioner: `accumulation_steps`, `grad_scaler`, `process_group`."""

    def __init__(self, model: nn.Module, params: Iterable, lr: float, options: ThorOptions | None = None, *,
                 momentum: float = 0.9, weight_decay: float = 0.0, accumulation_steps: int = 1,
                 grad_scaler: torch.amp.GradScaler | None = None, process_group: dist.ProcessGroup | None = None,
                 **overrides: Any) -> None:
        check_thor_args(dict(lr=lr, momentum=momentum, weight_decay=weight_decay))
        options = thor_options(options, overrides, ThorArgs)
        if (options.damping_mode == "pi" or options.ekfac_decay is not None or options.graft != "none"
                or options.decoupled_decay):
            raise ConfigError("thor_soap takes THOR's eigenbases and its own Adam step (its weight decay always "
                              "decoupled): damping_mode pi, ekfac_decay, graft and decoupled_decay do not apply",
                              "leave them unset (damping_mode absolute or trace)")
        if not momentum < 1:
            raise ConfigError(f"thor_soap's momentum is Adam's beta1 and must be < 1, got {momentum}",
                              "use e.g. 0.9")
        self.preconditioner = ThorPreconditioner(model, options, accumulation_steps=accumulation_steps,
                                                 grad_scaler=grad_scaler, process_group=process_group,
                                                 eigenbases=True)
        super().__init__(params, dict(lr=lr, weight_decay=weight_decay, betas=(momentum, options.soap_beta2)))
        self._layer_of = {id(p): l for p, l in self.preconditioner.layer_of}

    options = property(lambda self: self.preconditioner.options, doc="The curvature options (a ThorOptions).")
    layers = property(lambda self: self.preconditioner.layers)

    def _moment_shape(self, p: Tensor) -> torch.Size:
        layer = self._layer_of.get(id(p))
        return p.shape if layer is None else torch.Size((layer.groups, p.shape[0] // layer.groups, p[0].numel()))

    @torch.no_grad()
    def step(self, closure: Callable[[], Tensor] | None = None) -> Tensor | None:
        loss = evaluate_closure(closure)
        pre = self.preconditioner
        before = {id(l): l.eigen for l in pre.layers.values()}
        pre.refresh()
        damping, relative = pre.damping_at(), self.options.damping_mode == "trace"
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                layer = self._layer_of.get(id(p))
                if layer is not None and layer.eigen is None:
                    layer = None  # no curvature yet (not run on a refresh): plain Adam until it has
                self._update(p, group, layer, before.get(id(layer)), damping, relative)
        pre.advance()
        return loss

    def _update(self, p: Tensor, group: dict, layer: ThorLayer | None, old_bases: EigenState | None,
                damping: float, relative: bool) -> None:
        state = self.state[p]
        g = p.grad / self.options.loss_scale
        if layer is not None:
            g = rotate(g.reshape(self._moment_shape(p)).to(layer.eigen.Q_A.dtype), layer.eigen.Q_G, layer.eigen.Q_A)
        if state and state["exp_avg"].shape != g.shape:
            state.clear()  # the layer's first basis (it ran no refresh before): its moments start there
        if not state:
            state.update(step=0, exp_avg=torch.zeros_like(g), exp_avg_sq=torch.zeros_like(g))
        elif layer is not None and old_bases is not None and old_bases is not layer.eigen:
            # a refresh: the first moment follows the basis (back with the old one, forward with the new one)
            back = unrotate(state["exp_avg"], old_bases.Q_G, old_bases.Q_A)
            state["exp_avg"] = rotate(back, layer.eigen.Q_G, layer.eigen.Q_A)
        beta1, beta2 = group["betas"]
        state["step"] += 1
        state["exp_avg"].lerp_(g, 1.0 - beta1)
        state["exp_avg_sq"].mul_(beta2).addcmul_(g, g, value=1.0 - beta2)
        u = adam_direction(state["exp_avg"], state["exp_avg_sq"], state["step"], (beta1, beta2), damping,
                              relative)
        if layer is not None:
            u = unrotate(u, layer.eigen.Q_G, layer.eigen.Q_A).reshape(p.shape)
        if group["weight_decay"]:
            p.mul_(1.0 - group["lr"] * group["weight_decay"])
        p.add_(u.to(p.dtype), alpha=-group["lr"])

    def divisors(self) -> dict[str, tuple[Tensor, Tensor]]:
        """Per preconditioned layer with moments: (sqrt(v_hat), eps) of its latest update (the health report's)."""
        damping = self.preconditioner.damping_at(max(self.preconditioner.update_index - 1, 0))
        relative = self.options.damping_mode == "trace"
        out = {}
        for group in self.param_groups:
            for p in group["params"]:
                state, layer = self.state.get(p), self._layer_of.get(id(p))
                if layer is not None and state and layer.eigen is not None and \
                        state["exp_avg_sq"].shape == self._moment_shape(p):
                    out[layer.name] = adam_divisor(state["exp_avg_sq"], state["step"], group["betas"][1], damping,
                                                   relative)
        return out

    def load_state_dict(self, state_dict: dict) -> None:
        """torch's, then each moment's shape checked against its parameter's (rotated layers: groups x out x in)."""
        state_dict = dict(state_dict)
        thor = state_dict.pop("thor", None)
        if thor is None:
            raise CheckpointError("thor_soap state has no THOR curvature ('thor')",
                                  "load the optimizer state saved by thor_soap")
        super().load_state_dict(state_dict)
        for group in self.param_groups:
            for p in group["params"]:
                state, want = self.state.get(p, {}), self._moment_shape(p)
                for key in ("exp_avg", "exp_avg_sq"):
                    v = state.get(key)
                    if state and (not isinstance(v, Tensor) or v.shape != want):
                        got = tuple(v.shape) if isinstance(v, Tensor) else type(v).__name__
                        raise CheckpointError(f"thor_soap state: {key} has shape {got}, expected {tuple(want)}",
                                              "load the optimizer state saved for this model")
        self.preconditioner.load_state_dict(thor)

