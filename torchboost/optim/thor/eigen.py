"""Eigenvalue-corrected THOR (EKFAC: George et al. 2018, "Fast approximate natural gradient descent in a
Kronecker-factored eigenbasis"): THOR's factors give the eigenbasis, a running second moment gives the scale.

At a refresh each layer keeps the eigenbases of its (block) factors instead of their inverses,
A = Q_A diag(la) Q_A^T and G = Q_G diag(lg) Q_G^T (one eigh per diagonal block, batched), and at EVERY update
its weight gradient W (per conv group, out x in) is rotated into the Kronecker eigenbasis, rescaled per
coordinate and rotated back:

    W' = Q_G^T W Q_A                                   (block-wise: `_blockdiag_times` on each side)
    s  = T * lg[i] * la[j]                             at a refresh (the Kronecker eigenvalues, T-scaled)
    s <- beta * s + (1 - beta) * c * W'^2              at every other update (c: `moment_scale`, below)
    P  = Q_G (W' / (s + damping)) Q_A^T

Damping and T, against THOR (`ThorLayer.invert`): a conv with T positions per sample has F ~ T * A (x) G;
THOR damps each factor by d = sqrt(damping/T) and scales each inverse by sqrt(1/T), so

    P_thor = (1/T) (G + d I)^-1 W (A + d I)^-1 = Q_G (W' / (T (lg[i] + d)(la[j] + d))) Q_A^T,
    T (lg[i] + d)(la[j] + d) = T lg[i] la[j] + sqrt(damping * T) (lg[i] + la[j]) + damping.

EKFAC's denominator is s + damping (the paper's form): with beta = 1 (s never updated) it is
T lg[i] la[j] + damping, i.e. P = (T * G (x) A + damping * I)^-1 W, Tikhonov damping of the Kronecker
product itself; THOR's factored damping adds the cross term sqrt(damping * T) (lg[i] + la[j]) >= 0 to every
denominator (it damps more, most along the large eigenvalues of either factor). T = 1 for linear layers.

Units of the moment: s starts as a per-sample Fisher (THOR's G holds per-sample output gradients), while W is
the update's batch gradient: for W = w * sum_i g_i over N samples, E[W'^2] ~ w^2 N F' when the gradient noise
dominates, so `moment_scale` c = 1 / (w^2 N) puts W'^2 in the units of s (c = N / loss_scale^2 for a mean loss:
the caller knows N and w). The paper's moment uses per-example gradients, which a batch gradient estimates
only up to its squared mean (c W'^2 ~ F' + N * mean'^2).

Directions the loss does not see in training mode (a BatchNorm-fed conv's channel scale and, nearly, its
input-mean direction) get c W'^2 ~ 0, so after a few updates s there falls to ~0 and the step there is bounded
by the damping alone, where THOR's Kronecker denominator stays large: such moves change nothing in training
mode but do move BatchNorm's running statistics away from what the network now needs.

`damping_mode: trace` makes the epsilon relative: s + damping * mean(s) per conv group (the mean over the
layer's coordinates), so multiplying the loss by c (s by c^2, W' by c) leaves the update's direction as it is;
the absolute s + damping is the paper's form, and a fixed damping is dominated wherever s is small.

`inverse_root=2` divides by (s + damping)^(1/2) instead: Adam's root of a second moment, in THOR's eigenbasis
(SOAP's preconditioner without its eigenbasis momentum; thor_muon orthogonalises the result: a SOAP-Muon).

The first update after a refresh uses the fresh s as it is (exactly K-FAC's damped inverse in that basis);
later updates fold their gradient into s before using it (as Adam does). No bias correction: s never starts
from zero.

Padding: a factor whose size n is not a multiple of the block size b is zero-padded in its last block
(`inverse.block_shape`). Its eigenbasis is that block's own r x r eigenbasis (r = n - (n_blocks-1) b) with
identity on the padding, so no eigenvector mixes padding and features (eigh of the padded block would mix
them wherever an eigenvalue equals the padding's), the padding coordinates of a rotated gradient are exactly
zero, and s and W' need only the gradient's own shape (groups, out, in).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from torchboost.errors import CheckpointError
from torchboost.optim.thor.inverse import _blockdiag_times


def block_eigh(blocks: Tensor, n: int) -> tuple[Tensor, Tensor]:
    """Eigenvalues (groups, n) and eigenvectors (groups, n_blocks, b, b) of the (groups, n_blocks, b, b)
    diagonal blocks of an n x n PSD factor: eigenvalues clamped at 0 (PSD up to rounding), the padding's
    eigenvectors identity (eigenvalue 1, dropped from the values returned)."""
    g, nb, b, _ = blocks.shape
    r = n - (nb - 1) * b
    if r == b:
        evals, evecs = torch.linalg.eigh(blocks)
    else:  # the last block at its own size r, identity on its padding
        evals = blocks.new_ones(g, nb, b)
        evecs = torch.zeros_like(blocks)
        if nb > 1:
            evals[:, :-1], evecs[:, :-1] = torch.linalg.eigh(blocks[:, :-1])
        evals[:, -1, :r], evecs[:, -1, :r, :r] = torch.linalg.eigh(blocks[:, -1, :r, :r])
        idx = torch.arange(r, b, device=blocks.device)
        evecs[:, -1, idx, idx] = 1.0
    return evals.clamp_min(0).reshape(g, nb * b)[:, :n], evecs


def block_eigenvalues(blocks: Tensor, q: Tensor, n: int) -> Tensor:
    """(groups, n) eigenvalues diag(Q^T B Q) of each block B in eigenbasis q (its Rayleigh quotients, clamped at
    0): what a rank that received q from the rank that decomposed B computes, as every rank does (`from_bases`)."""
    g, nb, b, _ = blocks.shape
    return (q.mT @ blocks @ q).diagonal(dim1=-2, dim2=-1).clamp_min(0).reshape(g, nb * b)[:, :n]


def rotate(w: Tensor, q_g: Tensor, q_a: Tensor) -> Tensor:
    """Q_G^T w Q_A per group, for w (groups, out, in) and block eigenbases q_g, q_a (groups, n_blocks, b, b)."""
    right = _blockdiag_times(q_a.mT, w.mT).mT  # w Q_A = (Q_A^T w^T)^T
    return _blockdiag_times(q_g.mT, right)


def unrotate(w: Tensor, q_g: Tensor, q_a: Tensor) -> Tensor:
    """Q_G w Q_A^T per group (the inverse of `rotate`); contiguous, the G side last as in `precondition`."""
    right = _blockdiag_times(q_a, w.mT).mT
    return _blockdiag_times(q_g, right).contiguous()


_STATE_KEYS = ("Q_A", "Q_G", "s", "fresh")


@dataclass
class EigenState:
    """One layer's eigenbases Q_A, Q_G (block layout of A and G) and its second moment s (groups, out, in);
    `fresh`: the next update is the first since the refresh (s is used as it is)."""

    Q_A: Tensor
    Q_G: Tensor
    s: Tensor
    fresh: bool = True

    @classmethod
    def from_factors(cls, a: Tensor, g: Tensor, t: float, n_in: int, n_out: int) -> EigenState:
        """The eigenbases of block factors A (n_in wide) and G (n_out wide) and s = T * lg[i] * la[j]."""
        la, q_a = block_eigh(a, n_in)
        lg, q_g = block_eigh(g, n_out)
        return cls(q_a, q_g, t * lg[:, :, None] * la[:, None, :])

    @classmethod
    def from_bases(cls, q_a: Tensor, q_g: Tensor, a: Tensor, g: Tensor, t: float, n_in: int,
                   n_out: int) -> EigenState:
        """As `from_factors`, from eigenbases computed elsewhere (under torch.distributed, by the rank that owns
        the layer's decomposition): the eigenvalues are the bases' Rayleigh quotients of the factors, the same
        on every rank."""
        la, lg = block_eigenvalues(a, q_a, n_in), block_eigenvalues(g, q_g, n_out)
        return cls(q_a, q_g, t * lg[:, :, None] * la[:, None, :])

    def epsilon(self, damping: float, relative: bool) -> float | Tensor:
        """What the divisor adds to s: `damping`, or (relative) damping x each group's mean s, shape (groups, 1, 1)."""
        return damping * self.s.mean((-2, -1), keepdim=True) if relative else damping

    def precondition(self, w: Tensor, damping: float, beta: float, moment_scale: float = 1.0,
                     root: int = 1, relative: bool = False) -> Tensor:
        """Q_G (W' / (s + epsilon)^(1/root)) Q_A^T for w (groups, out, in) in the state's dtype (root 2: Adam's
        root of the second moment; epsilon: `epsilon`); updates s first (unless fresh or beta = 1): s <- beta s +
        (1 - beta) moment_scale W'^2."""
        rotated = rotate(w, self.Q_G, self.Q_A)
        if self.fresh:
            self.fresh = False
        elif beta != 1.0:
            self.s.mul_(beta).addcmul_(rotated, rotated, value=(1.0 - beta) * moment_scale)
        divisor = self.s + self.epsilon(damping, relative)
        if root != 1:
            divisor = divisor ** (1.0 / root)
        return unrotate(rotated / divisor, self.Q_G, self.Q_A)

    def state(self) -> dict:
        return {k: getattr(self, k) for k in _STATE_KEYS}

    @classmethod
    def load(cls, state: dict, shapes: dict[str, torch.Size], device: torch.device, dtype: torch.dtype,
             where: str) -> EigenState:
        """Rebuild from `state()`, each tensor checked against `shapes` (Q_A, Q_G, s); `where` names the layer."""
        if not isinstance(state, dict) or set(state) != set(_STATE_KEYS):
            keys = sorted(state) if isinstance(state, dict) else type(state).__name__
            raise CheckpointError(f"EKFAC state of {where} has keys {keys}, expected {list(_STATE_KEYS)}",
                                  "load the optimizer state saved for this optimizer")
        values = {}
        for k, want in shapes.items():
            v = state[k]
            if not isinstance(v, Tensor) or v.shape != want:
                got = tuple(v.shape) if isinstance(v, Tensor) else type(v).__name__
                raise CheckpointError(f"EKFAC state of {where}: {k} has shape {got}, expected {tuple(want)}",
                                      "use the split_dim and max_dim the state was saved with")
            values[k] = v.to(device=device, dtype=dtype)
        return cls(values["Q_A"], values["Q_G"], values["s"], bool(state["fresh"]))
