"""Per-layer THOR state: factors, inverses and refresh bookkeeping of one Conv2d/Linear."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import Tensor, nn

from torchboost.errors import CheckpointError
from torchboost.optim.thor.factors import LayerCapture, factor_dtype
from torchboost.optim.thor.inverse import block_shape, block_size, damped_inverse, precondition

# Saved by state_dict; everything else is rebuilt from the model.
_STATE_KEYS = ("A", "G", "T", "A_inv", "G_inv", "trace_ref", "next_factor", "next_inverse",
               "interval_mult", "refreshes", "skipped")


@dataclass
class ThorLayer:
    """Curvature state of one layer. A and G are the diagonal blocks (g, n_blocks, b, b) of the input and
    output-gradient factors (g = conv groups, b = split_dim or the whole size); inverses have the same
    layout and already carry the conv sqrt(1/T) factor."""

    name: str
    module: nn.Module
    capture: LayerCapture
    A: Tensor | None = None
    G: Tensor | None = None
    T: float = 1.0
    A_inv: Tensor | None = None
    G_inv: Tensor | None = None
    trace_ref: float | None = None
    next_factor: int = 0
    next_inverse: int = 0
    interval_mult: int = 1
    refreshes: int = 0
    skipped: int = 0
    warned: bool = field(default=False, repr=False)

    @property
    def groups(self) -> int:
        return getattr(self.module, "groups", 1)

    @property
    def sizes(self) -> tuple[int, int]:
        """(in, out) sizes of one group's A and G."""
        w = self.module.weight
        return w[0].numel(), w.shape[0] // self.groups

    def factor_shapes(self) -> tuple[torch.Size, torch.Size]:
        """Block shapes of A and G (and of their inverses), as the capture builds them."""
        n_in, n_out = self.sizes
        return (block_shape(self.groups, n_in, self.capture.a_block),
                block_shape(self.groups, n_out, self.capture.g_block))

    def inverse_cost(self) -> float:
        """Flops-proportional cost of inverting both factors (blocks * b^3)."""
        return float(sum(s[0] * s[1] * s[2] ** 3 for s in self.factor_shapes()))

    def set_factors(self, a: Tensor, g: Tensor, t: float, decay: float | None) -> None:
        """Store fresh factors, or blend them into a running average when `decay` is set."""
        if decay is None or self.A is None or self.G is None:
            self.A, self.G, self.T = a, g, t
        else:
            self.A = decay * self.A + (1 - decay) * a
            self.G = decay * self.G + (1 - decay) * g
            self.T = decay * self.T + (1 - decay) * t

    def trace_product(self) -> Tensor:
        """sum over groups of tr(A) * tr(G): the paper's cheap proxy for how much the curvature moved."""
        assert self.A is not None and self.G is not None
        tr_a = self.A.diagonal(dim1=-2, dim2=-1).sum((1, 2))
        return (tr_a * self.G.diagonal(dim1=-2, dim2=-1).sum((1, 2))).sum()

    def invert(self, damping: float, method: str, max_retries: int) -> tuple[Tensor, Tensor, int]:
        """Damped inverses. Conv with T positions per sample (MindSpore's rule): F ~ T * A (x) G, so each factor
        gets damping sqrt(damping/T) and each inverse the factor sqrt(1/T); T = 1 for linear layers."""
        assert self.A is not None and self.G is not None
        d, s = math.sqrt(damping / self.T), math.sqrt(1.0 / self.T)
        n_in, n_out = self.sizes
        a_inv, ra = damped_inverse(self.A, n_in, d, s, method, max_retries)
        g_inv, rg = damped_inverse(self.G, n_out, d, s, method, max_retries)
        return a_inv, g_inv, ra + rg

    def precondition(self, grad: Tensor) -> Tensor:
        """G^-1 grad A^-1 on the weight gradient (reshaped to groups x out x in), in factor precision."""
        if self.A_inv is None or self.G_inv is None:
            if not self.warned:
                self.warned = True
                warnings.warn(f"THOR: layer '{self.name}' has no curvature estimate yet (not run with "
                              "gradients on a refresh step); it gets the plain gradient", stacklevel=3)
            return grad
        g = self.groups
        w = grad.reshape(g, grad.shape[0] // g, -1).to(self.A_inv.dtype)
        return precondition(w, self.G_inv, self.A_inv).reshape(grad.shape).to(grad.dtype)

    def state(self) -> dict:
        return {k: getattr(self, k) for k in _STATE_KEYS}

    def load(self, state: dict) -> None:
        device, dtype = self.module.weight.device, factor_dtype(self.module.weight)
        a_shape, g_shape = self.factor_shapes()
        for k in _STATE_KEYS:
            v = state[k]
            if isinstance(v, Tensor):
                want = a_shape if k.startswith("A") else g_shape
                if v.shape != want:
                    raise CheckpointError(f"THOR state of layer '{self.name}': {k} has shape {tuple(v.shape)}, "
                                          f"expected {tuple(want)}", "use the split_dim and max_dim the state was saved "
                                          "with")
                v = v.to(device=device, dtype=dtype)
            setattr(self, k, v)


def find_layers(model: nn.Module, split_dim: int | None, grad_scale: Callable[[], float],
                forward_id: Callable[[], int], mean_loss: bool, max_samples: int | None = None,
                max_dim: int | None = None) -> dict[str, ThorLayer]:
    """Every trainable Conv2d/Linear (subclasses included) becomes a THOR layer. A weight shared by two
    modules keeps the plain gradient (its two Kronecker estimates would disagree), with a warning."""
    layers: dict[str, ThorLayer] = {}
    owner: dict[int, str] = {}
    for name, m in model.named_modules():
        if not isinstance(m, (nn.Conv2d, nn.Linear)) or not m.weight.requires_grad:
            continue
        if id(m.weight) in owner:
            warnings.warn(f"THOR: weight of '{name}' is shared with '{owner[id(m.weight)]}'; "
                          "it gets the plain gradient", stacklevel=3)
            first = layers.pop(owner[id(m.weight)], None)
            if first is not None:
                first.capture.remove()
            continue
        owner[id(m.weight)] = name
        w = m.weight
        blocks = (block_size(w[0].numel(), split_dim, max_dim),
                  block_size(w.shape[0] // getattr(m, "groups", 1), split_dim, max_dim))
        layers[name] = ThorLayer(name, m, LayerCapture(m, blocks, grad_scale, forward_id, mean_loss,
                                                                 max_samples))
    return layers
