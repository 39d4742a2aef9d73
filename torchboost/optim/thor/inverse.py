"""Damped block-diagonal inverses of THOR factors and their application to a gradient.

A factor is held as its diagonal blocks of `split_dim` (MindSpore's hardware-driven split: O(n*b^2)
instead of O(n^3)), shape (groups, n_blocks, b, b); the zero padding of the last block gets identity, so
all blocks have one size and invert as one batch. `split_dim=None` is one block: the whole matrix.
Inverses have the same layout and are applied without ever forming the block-diagonal matrix.
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


def _cholesky_inverse(blocks: Tensor, damping: float, max_retries: int) -> tuple[Tensor, int]:
    """Invert (B, b, b) SPD blocks + damping*I by Cholesky; a failing block is retried with 10x its
    damping (up to max_retries times) rather than returning NaN. Returns (inverse, retries used)."""
    eye = torch.eye(blocks.shape[-1], dtype=blocks.dtype, device=blocks.device)
    damp = torch.full((blocks.shape[0], 1, 1), damping, dtype=blocks.dtype, device=blocks.device)
    chol, info = torch.linalg.cholesky_ex(blocks + damp * eye)
    retries = 0
    while bool((info != 0).any()):
        if retries == max_retries:
            raise torch.linalg.LinAlgError(f"Cholesky failed after {max_retries} damping increases")
        bad = info != 0
        # 10x the damping; a zero damping starts from a small fraction of the block's mean diagonal
        floor = 1e-6 * blocks[bad].diagonal(dim1=-2, dim2=-1).abs().mean(-1).clamp_min(1e-12)
        damp[bad] = torch.maximum(damp[bad] * 10, floor[:, None, None])
        chol_bad, info_bad = torch.linalg.cholesky_ex(blocks[bad] + damp[bad] * eye)
        chol[bad], info[bad] = chol_bad, info_bad
        retries += 1
    return torch.cholesky_inverse(chol), retries


def damped_inverse(blocks: Tensor, n: int, damping: float, scale: float,
                   max_retries: int = MAX_DAMPING_RETRIES) -> tuple[Tensor, int]:
    """scale * (blocks + damping*I)^-1 for the (g, nb, b, b) diagonal blocks of an n x n factor (the
    padding beyond n becomes identity); also returns the Cholesky retries used."""
    g, nb, b, _ = blocks.shape
    pad = nb * b - n
    if pad:
        blocks = blocks.clone()
        idx = torch.arange(b - pad, b, device=blocks.device)
        blocks[:, -1, idx, idx] += 1.0
    flat = blocks.reshape(-1, b, b)
    inv, retries = _cholesky_inverse(flat, damping, max_retries)
    return (inv * scale).reshape(g, -1, *inv.shape[-2:]), retries


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
