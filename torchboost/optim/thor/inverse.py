"""Damped block-diagonal inverses of THOR factors and their application to a gradient.

A factor is held as its diagonal blocks of `split_dim` (MindSpore's hardware-driven split: O(n*b^2)
instead of O(n^3)), shape (groups, n_blocks, b, b); the zero padding of the last block gets identity, so
all blocks have one size and invert as one batch. `split_dim=None` is one block: the whole matrix.
Inverses have the same layout and are applied without ever forming the block-diagonal matrix. The inverse
is Cholesky's; `inverse_root=2` takes each damped block's inverse square root from its eigendecomposition
instead (the identity padding stays identity: a function of a block-diagonal matrix is block-diagonal).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

MAX_DAMPING_RETRIES = 3  # a block whose Cholesky fails is retried with 10x its damping this many times


def block_size(n: int, split_dim: int | None) -> int:
    """A factor smaller than split_dim is one block of its own size (as in MindSpore)."""
    return n if split_dim is None else min(n, split_dim)


def block_shape(groups: int, n: int, b: int) -> torch.Size:
    """(groups, n_blocks, b, b) of an n x n factor held in blocks of b."""
    return torch.Size((groups, math.ceil(n / b), b, b))


def _cholesky(m: Tensor) -> tuple[tuple[Tensor, ...], Tensor]:
    """Cholesky factors of (B, b, b) blocks and whether each succeeded (positive definite)."""
    chol, info = torch.linalg.cholesky_ex(m)
    return (chol,), info == 0


def _eigh(m: Tensor) -> tuple[tuple[Tensor, ...], Tensor]:
    """Eigendecompositions of (B, b, b) symmetric blocks and whether each is positive definite (ascending
    eigenvalues: the first one > 0)."""
    evals, evecs = torch.linalg.eigh(m)
    return (evals, evecs), evals[:, 0] > 0


def _inverse_sqrt(evals: Tensor, evecs: Tensor) -> Tensor:
    """Q diag(l^-1/2) Q^T of each block."""
    return (evecs * evals.rsqrt()[:, None, :]) @ evecs.mT


# root -> (decomposition with its success flags, the damped block's -1/root power from it)
_POWERS = {1: (_cholesky, torch.cholesky_inverse), 2: (_eigh, _inverse_sqrt)}


def _damped_power(blocks: Tensor, damping: Tensor, max_retries: int, root: int = 1) -> tuple[Tensor, Tensor]:
    """(B, b, b) SPD blocks + damping[i]*I to the power -1/root (1: Cholesky; 2: an eigendecomposition); a block
    that is not positive definite is retried with 10x its damping (up to max_retries times) rather than
    returning NaN. Returns (power, retries per block: max_retries + 1 where the block still failed)."""
    decompose, power = _POWERS[root]
    eye = torch.eye(blocks.shape[-1], dtype=blocks.dtype, device=blocks.device)
    damp = damping.to(blocks.dtype).reshape(-1, 1, 1).clone()
    parts, ok = decompose(blocks + damp * eye)
    tries = torch.zeros(blocks.shape[0], dtype=torch.long, device=blocks.device)
    bad = ~ok
    for _ in range(max_retries):
        if not bool(bad.any()):  # the refresh's one host read per block size (and per retry)
            break
        # 10x the damping; a zero damping starts from a small fraction of the block's mean diagonal
        floor = 1e-6 * blocks[bad].diagonal(dim1=-2, dim2=-1).abs().mean(-1).clamp_min(1e-12)
        damp[bad] = torch.maximum(damp[bad] * 10, floor[:, None, None])
        tries[bad] += 1
        parts_bad, ok_bad = decompose(blocks[bad] + damp[bad] * eye)
        for part, part_bad in zip(parts, parts_bad):
            part[bad] = part_bad
        ok[bad] = ok_bad
        bad = ~ok
    tries[bad] = max_retries + 1
    return power(*parts), tries


Factor = tuple[Tensor, int, float | Tensor, float]  # (blocks (g, nb, b, b), n, damping (one, or (g,)), scale)


def _block_damping(damping: float | Tensor, g: int, nb: int, device: torch.device) -> Tensor:
    """(g * nb,) float64 damping of every block of a factor: one number for all, or one per group."""
    if isinstance(damping, Tensor):
        return damping.to(device=device, dtype=torch.float64).repeat_interleave(nb)
    return torch.full((g * nb,), damping, dtype=torch.float64).to(device)


def damped_inverses(factors: list[Factor], max_retries: int = MAX_DAMPING_RETRIES, root: int = 1
                    ) -> list[tuple[Tensor, int] | None]:
    """scale * (blocks + damping*I)^(-1/root) for each factor's (g, nb, b, b) diagonal blocks of an n x n matrix
    (the padding beyond n becomes identity), with the retries it used; None for a factor whose blocks still
    fail after max_retries. `damping`: a number, or a (g,) tensor, one per group. Blocks of one size are
    inverted as one batch across factors: a refresh of every layer is a few batched calls, not two per layer
    (on a GPU each call is launches and a host read)."""
    flats = []
    for blocks, n, _, _ in factors:
        g, nb, b, _ = blocks.shape
        pad = nb * b - n
        if pad:
            blocks = blocks.clone()
            idx = torch.arange(b - pad, b, device=blocks.device)
            blocks[:, -1, idx, idx] += 1.0
        flats.append(blocks.reshape(-1, b, b))
    groups: dict[tuple, list[int]] = {}
    for i, f in enumerate(flats):
        groups.setdefault((f.shape[-1], f.dtype, f.device), []).append(i)
    out: list[tuple[Tensor, int] | None] = [None] * len(factors)
    for (_, _, device), members in groups.items():
        sizes = [flats[i].shape[0] for i in members]
        damping = torch.cat([_block_damping(factors[i][2], *factors[i][0].shape[:2], device) for i in members])
        inv, tries = _damped_power(torch.cat([flats[i] for i in members]), damping, max_retries, root)
        used_by = torch.stack([t.max() for t in tries.split(sizes)]).tolist()  # one host read per block size
        for i, inv_i, used in zip(members, inv.split(sizes), used_by):
            if used <= max_retries:
                blocks, _, _, scale = factors[i]
                out[i] = ((inv_i * scale).reshape(blocks.shape[0], -1, *inv_i.shape[-2:]), used)
    return out


def damped_inverse(blocks: Tensor, n: int, damping: float | Tensor, scale: float,
                   max_retries: int = MAX_DAMPING_RETRIES, root: int = 1) -> tuple[Tensor, int]:
    """One factor's `damped_inverses`; raises LinAlgError when its blocks still fail after max_retries."""
    result = damped_inverses([(blocks, n, damping, scale)], max_retries, root)[0]
    if result is None:
        raise torch.linalg.LinAlgError(f"damped factor not positive definite after {max_retries} damping increases")
    return result


def _blockdiag_times(inv: Tensor, w: Tensor) -> Tensor:
    """blockdiag(inv) @ w for inv (g, nb, b, b) and w (g, rows, cols): one batched matmul over blocks."""
    g, rows, cols = w.shape
    nb, b = inv.shape[1], inv.shape[2]
    if nb == 1 and b == rows:
        return inv[:, 0] @ w
    w = F.pad(w, (0, 0, 0, nb * b - rows)).reshape(g, nb, b, cols)
    return (inv @ w).reshape(g, nb * b, cols)[:, :rows]


def precondition(grad: Tensor, g_inv: Tensor, a_inv: Tensor) -> Tensor:
    """G^-1 @ grad @ A^-1 per group, for grad (g, out, in); inverses are symmetric block stacks, so
    grad @ A^-1 == (A^-1 @ grad^T)^T. The G side goes last so the result comes out contiguous: a
    transposed result made the momentum/weight updates that read it several times slower."""
    right = _blockdiag_times(a_inv, grad.transpose(1, 2)).transpose(1, 2)
    return _blockdiag_times(g_inv, right).contiguous()
