"""Per-layer THOR state: factors, inverses (or EKFAC's eigenbases) and refresh bookkeeping of one Conv2d/Linear."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import Tensor, nn

from torchboost.errors import CheckpointError
from torchboost.optim.thor.eigen import EigenState, block_eigh
from torchboost.optim.thor.factors import LayerCapture, factor_dtype
from torchboost.optim.thor.inverse import Factor, block_shape, block_size, precondition

# Saved by state_dict; everything else is rebuilt from the model. Other keys in a saved state are ignored, so a
# state with keys of options since removed (ThorOptions.REMOVED) still loads.
_STATE_KEYS = ("A", "G", "T", "A_inv", "G_inv", "next_inverse", "refreshes")


@dataclass
class ThorLayer:
    """Curvature state of one layer. A and G are the diagonal blocks (g, n_blocks, b, b) of the input and
    output-gradient factors (g = conv groups, b = split_dim or the whole size); inverses have the same
    layout and already carry the conv sqrt(1/T) factor. `next_inverse`: the update of its next refresh. With
    EKFAC (`ekfac_decay`) `eigen` holds the eigenbases and second moment instead of the inverses."""

    name: str
    module: nn.Module
    capture: LayerCapture
    A: Tensor | None = None
    G: Tensor | None = None
    T: float = 1.0
    A_inv: Tensor | None = None
    G_inv: Tensor | None = None
    next_inverse: int = 0
    refreshes: int = 0
    eigen: EigenState | None = None
    radial: bool = False  # BatchNorm-fed, so scale-invariant: project_radial drops its update's radial part
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

    def to_invert(self, damping: float, mode: str = "absolute", root: int = 1) -> tuple[Factor, Factor]:
        """A's and G's damped inversions (to the power -1/`root`), for `damped_inverses` (which batches every
        layer's). Conv with T positions per sample (MindSpore's rule): F ~ T * A (x) G = (sqrt(T) A) (x)
        (sqrt(T) G), so the damping is set for the sqrt(T) multiples (absolute: sqrt(damping) on each, i.e.
        sqrt(damping/T) on each factor; `factor_dampings`) and each power carries T^(-1/(2 root)); T = 1 for
        linear layers."""
        assert self.A is not None and self.G is not None
        n_in, n_out = self.sizes
        d_a, d_g = factor_dampings(self.A, self.G, n_in, n_out, damping, self.T, mode)
        s = math.sqrt(1.0 / self.T) ** (1.0 / root)  # root 1: sqrt(1/T) exactly (x ** 1.0 is x)
        return (self.A, n_in, d_a, s), (self.G, n_out, d_g, s)

    def eigenbases(self) -> tuple[Tensor, Tensor, int]:
        """EKFAC's refresh: the block eigenbases Q_A, Q_G of the factors (no retries: eigh needs no damping)."""
        assert self.A is not None and self.G is not None
        n_in, n_out = self.sizes
        return block_eigh(self.A, n_in)[1], block_eigh(self.G, n_out)[1], 0

    def set_eigenbases(self, q_a: Tensor, q_g: Tensor) -> None:
        """EKFAC's state from fresh eigenbases of the current factors (s: their T-scaled Kronecker eigenvalues)."""
        n_in, n_out = self.sizes
        self.eigen = EigenState.from_bases(q_a, q_g, self.A, self.G, self.T, n_in, n_out)

    def _plain(self) -> bool:
        """True (warning once) while the layer has no curvature yet: its gradient stays as it is."""
        if self.A_inv is not None and self.G_inv is not None or self.eigen is not None:
            return False
        if not self.warned:
            self.warned = True
            warnings.warn(f"THOR: layer '{self.name}' has no curvature estimate yet (not run with "
                          "gradients on a refresh step); it gets the plain gradient", stacklevel=4)
        return True

    def precondition(self, grad: Tensor) -> Tensor:
        """G^-1 grad A^-1 on the weight gradient (reshaped to groups x out x in), in factor precision."""
        if self._plain():
            return grad
        g = self.groups
        w = grad.reshape(g, grad.shape[0] // g, -1).to(self.A_inv.dtype)
        return precondition(w, self.G_inv, self.A_inv).reshape(grad.shape).to(grad.dtype)

    def precondition_eigen(self, grad: Tensor, damping: float, decay: float, moment_scale: float,
                           root: int = 1, relative: bool = False) -> Tensor:
        """EKFAC's Q_G (W' / (s + epsilon)^(1/root)) Q_A^T, its second moment updated first (`eigen.EigenState`;
        `relative`: epsilon = damping x the mean s)."""
        if self._plain():
            return grad
        g = self.groups
        w = grad.reshape(g, grad.shape[0] // g, -1).to(self.eigen.s.dtype)
        out = self.eigen.precondition(w, damping, decay, moment_scale, root, relative)
        return out.reshape(grad.shape).to(grad.dtype)

    def state(self) -> dict:
        state = {k: getattr(self, k) for k in _STATE_KEYS}
        if self.eigen is not None:
            state["eigen"] = self.eigen.state()
        return state

    def load(self, state: dict) -> None:
        device, dtype = self.module.weight.device, factor_dtype(self.module.weight)
        a_shape, g_shape = self.factor_shapes()
        for k in _STATE_KEYS:
            v = state[k]
            if isinstance(v, Tensor):
                want = a_shape if k.startswith("A") else g_shape
                if v.shape != want:
                    raise CheckpointError(f"THOR state of layer '{self.name}': {k} has shape {tuple(v.shape)}, "
                                          f"expected {tuple(want)}", "use the split_dim the state was saved with")
                v = v.to(device=device, dtype=dtype)
            setattr(self, k, v)
        eigen, n_in, n_out = state.get("eigen"), *self.sizes
        shapes = dict(Q_A=a_shape, Q_G=g_shape, s=torch.Size((self.groups, n_out, n_in)))
        self.eigen = None if eigen is None else EigenState.load(eigen, shapes, device, dtype, f"layer '{self.name}'")


def mean_eigenvalues(blocks: Tensor, n: int) -> Tensor:
    """tr(F) / n of each group's n x n factor F from its (groups, n_blocks, b, b) diagonal blocks, shape (groups,)
    (the capture's padding is zero, so it adds nothing)."""
    return blocks.diagonal(dim1=-2, dim2=-1).sum((-2, -1)) / n


def factor_dampings(a: Tensor, g: Tensor, n_in: int, n_out: int, damping: float, t: float,
                    mode: str) -> tuple[float | Tensor, float | Tensor]:
    """What `damping_mode` `mode` adds to A's and G's diagonals (one number, or one per group) for THOR's damping
    and T positions per sample: absolute sqrt(damping/T) to each; trace damping x each factor's mean eigenvalue
    (relative, so T, a factor's scale and the loss's do not change it); pi (Martens & Grosse 2015, 6.3)
    sqrt(damping/T) times pi on A and over pi on G, pi = sqrt(mean eig A / mean eig G), so each factor is damped
    in proportion to its own scale with the same product as absolute (pi = 1 where a factor is zero)."""
    if mode == "absolute":
        d = math.sqrt(damping / t)
        return d, d
    mean_a, mean_g = mean_eigenvalues(a, n_in), mean_eigenvalues(g, n_out)
    if mode == "trace":
        return damping * mean_a, damping * mean_g
    pi = torch.where((mean_a > 0) & (mean_g > 0), (mean_a / mean_g).sqrt(), torch.ones_like(mean_a))
    d = math.sqrt(damping / t)
    return pi * d, d / pi


def find_layers(model: nn.Module, split_dim: int | None, grad_scale: Callable[[], float],
                forward_id: Callable[[], int], max_samples: int | None = None) -> dict[str, ThorLayer]:
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
        blocks = block_size(w[0].numel(), split_dim), block_size(w.shape[0] // getattr(m, "groups", 1), split_dim)
        layers[name] = ThorLayer(name, m, LayerCapture(m, blocks, grad_scale, forward_id, max_samples))
    return layers
