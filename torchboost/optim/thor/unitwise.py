"""BatchNorm scale and shift preconditioned unit-wise: one 2x2 Fisher block per channel (ASDL's unit-wise shape).

A BatchNorm output is y = gamma * x_hat + beta per channel, so one sample's gradients of channel c are
(sum over positions of dy * x_hat, sum over positions of dy). Their 2x2 second moment over the samples is
channel c's Fisher block F_c; the (gamma_c, beta_c) gradient becomes (F_c + damping * I)^-1 times itself.
As for the Kronecker layers, dy is the per-sample gradient (the mean-reduced loss's 1/n multiplied back,
any loss scale divided out), and the damping is THOR's damping (the constant term of the Kronecker layers'
damped product). Blocks are 2x2, so their inversion costs nothing next to the conv factors'.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor, nn
from torch.nn.modules.batchnorm import _BatchNorm

from torchboost.errors import CheckpointError
from torchboost.optim.thor.factors import DetachedHook, factor_dtype

_STATE_KEYS = ("F", "F_inv", "next_factor", "next_inverse", "refreshes")


def normalized_input(bn: _BatchNorm, x: Tensor, rows: int) -> Tensor:
    """x_hat of the first `rows` samples, normalised as the layer does it: by the whole batch's statistics in
    training (or without running statistics), by the running ones otherwise."""
    dims = [0] + list(range(2, x.dim()))
    shape = [1, -1] + [1] * (x.dim() - 2)
    if bn.training or bn.running_mean is None or bn.running_var is None:
        var, mean = torch.var_mean(x, dim=dims, unbiased=False, keepdim=True)
    else:
        mean, var = bn.running_mean.to(x.dtype).view(shape), bn.running_var.to(x.dtype).view(shape)
    return (x[:rows] - mean) * torch.rsqrt(var + bn.eps)


class BatchNormCapture:
    """Sums one BatchNorm's per-sample (gamma, beta) gradient second moments, (C, 2, 2), until `consume()`;
    `grad_scale` is the Kronecker captures' (see `factors.LayerCapture`). Calls of one module pool."""

    def __init__(self, module: _BatchNorm, grad_scale: Callable[[], float], mean_loss: bool = True,
                 max_samples: int | None = None) -> None:
        self.module, self.grad_scale, self.mean_loss, self.max_samples = module, grad_scale, mean_loss, max_samples
        self.dtype = factor_dtype(module.weight)
        self.enabled = False
        self.f_sum: Tensor | None = None
        self.samples = 0
        self.handle = module.register_forward_hook(DetachedHook(self._on_forward))

    def _on_forward(self, module: nn.Module, inputs: tuple, output: Tensor) -> None:
        if not (self.enabled and torch.is_grad_enabled() and isinstance(output, Tensor) and output.requires_grad):
            return
        x = inputs[0].detach()
        n = x.shape[0]
        m = n if self.max_samples is None else min(n, self.max_samples)
        with torch.autocast(x.device.type, enabled=False):
            x_hat = normalized_input(self.module, x.to(self.dtype), m)
        output.register_hook(lambda grad: self._on_grad(grad, x_hat, n, m))

    def _on_grad(self, grad: Tensor, x_hat: Tensor, n: int, m: int) -> None:
        mult = (n if self.mean_loss else 1) / self.grad_scale()
        with torch.autocast(grad.device.type, enabled=False):
            dy = grad.detach()[:m].to(self.dtype) * mult
            dims = list(range(2, dy.dim()))
            g_scale = (dy * x_hat).sum(dims) if dims else dy * x_hat  # (m, C)
            g_shift = dy.sum(dims) if dims else dy
            g = torch.stack((g_scale, g_shift), dim=-1)  # (m, C, 2)
            f = torch.einsum("nci,ncj->cij", g, g)
        self.f_sum = f if self.f_sum is None else self.f_sum + f
        self.samples += m

    def consume(self) -> Tensor | None:
        """The (C, 2, 2) Fisher blocks averaged over samples, and clear the sums; None when nothing was seen."""
        f, samples = self.f_sum, self.samples
        self.f_sum, self.samples = None, 0
        return None if f is None or samples == 0 else f / samples

    def remove(self) -> None:
        self.handle.remove()


@dataclass
class UnitWiseLayer:
    """Curvature state of one BatchNorm: Fisher blocks F (C, 2, 2), their damped inverses and refresh
    bookkeeping (the same names as `ThorLayer`'s, so the preconditioner schedules both alike)."""

    name: str
    module: _BatchNorm
    capture: BatchNormCapture
    F: Tensor | None = None
    F_inv: Tensor | None = None
    next_factor: int = 0
    next_inverse: int = 0
    refreshes: int = 0

    @property
    def F_shape(self) -> torch.Size:
        return torch.Size((self.module.num_features, 2, 2))

    def set_factors(self, f: Tensor, decay: float | None) -> None:
        self.F = f if decay is None or self.F is None else decay * self.F + (1 - decay) * f

    def invert(self, damping: float) -> None:
        assert self.F is not None
        eye = torch.eye(2, dtype=self.F.dtype, device=self.F.device)
        # F is PSD and damping > 0, so F + damping * I is positive definite: no failure path
        self.F_inv = torch.linalg.inv(self.F + damping * eye)
        self.refreshes += 1

    def precondition(self) -> tuple[Tensor, Tensor] | None:
        """(gamma, beta) gradients times F_inv per channel; None without gradients or curvature yet."""
        w, b = self.module.weight.grad, self.module.bias.grad
        if self.F_inv is None or w is None or b is None:
            return None
        g = torch.stack((w, b), dim=-1).to(self.F_inv.dtype)  # (C, 2)
        out = (self.F_inv @ g.unsqueeze(-1)).squeeze(-1).to(w.dtype)
        return out[:, 0], out[:, 1]

    def state(self) -> dict:
        return {k: getattr(self, k) for k in _STATE_KEYS}

    def load(self, state: dict) -> None:
        want = tuple(self.F_shape)
        for k in _STATE_KEYS:
            v = state[k]
            if isinstance(v, Tensor):
                if tuple(v.shape) != want:
                    raise CheckpointError(f"THOR state of BatchNorm '{self.name}': {k} has shape {tuple(v.shape)}, "
                                          f"expected {want}", "load the optimizer state saved for this model")
                v = v.to(device=self.module.weight.device, dtype=factor_dtype(self.module.weight))
            setattr(self, k, v)


def find_batchnorms(model: nn.Module, grad_scale: Callable[[], float], mean_loss: bool,
                    max_samples: int | None = None) -> dict[str, UnitWiseLayer]:
    """Every BatchNorm (1d/2d/3d, SyncBatchNorm) with a trainable scale and shift."""
    return {name: UnitWiseLayer(name, m, BatchNormCapture(m, grad_scale, mean_loss, max_samples))
            for name, m in model.named_modules()
            if isinstance(m, _BatchNorm) and m.affine and m.weight.requires_grad and m.bias.requires_grad}
