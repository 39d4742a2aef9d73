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


def _cholesky_inverse(blocks: Tensor, damping: Tensor, max_retries: int) -> tuple[Tensor, Tensor]:
    """Invert (B, b, b) SPD blocks + damping[i]*I by Cholesky; a failing block is retried with 10x its damping
    (up to max_retries times) rather than returning NaN. Returns (inverse, retries per block: max_retries + 1
    where the block still failed)."""
    eye = torch.eye(blocks.shape[-1], dtype=blocks.dtype, device=blocks.device)
    damp = damping.to(blocks.dtype).reshape(-1, 1, 1).clone()
    chol, info = torch.linalg.cholesky_ex(blocks + damp * eye)
    tries = torch.zeros(blocks.shape[0], dtype=torch.long, device=blocks.device)
    bad = info != 0
    for _ in range(max_retries):
        if not bool(bad.any()):  # the refresh's one host read per block size (and per retry)
            break
        # 10x the damping; a zero damping starts from a small fraction of the block's mean diagonal
        floor = 1e-6 * blocks[bad].diagonal(dim1=-2, dim2=-1).abs().mean(-1).clamp_min(1e-12)
        damp[bad] = torch.maximum(damp[bad] * 10, floor[:, None, None])
        tries[bad] += 1
        chol_bad, info_bad = torch.linalg.cholesky_ex(blocks[bad] + damp[bad] * eye)
        chol[bad], info[bad] = chol_bad, info_bad
        bad = info != 0
    tries[bad] = max_retries + 1
    return torch.cholesky_inverse(chol), tries


Factor = tuple[Tensor, int, float, float]  # (blocks (g, nb, b, b), n, damping, scale)


def damped_inverses(factors: list[Factor], max_retries: int = MAX_DAMPING_RETRIES
                    ) -> list[tuple[Tensor, int] | None]:
    """scale * (blocks + damping*I)^-1 for each factor's (g, nb, b, b) diagonal blocks of an n x n matrix (the
    padding beyond n becomes identity), with the Cholesky retries it used; None for a factor whose blocks still
    fail after max_retries. Blocks of one size are inverted as one batch across factors: a refresh of every
    layer is a few batched calls, not two per layer (on a GPU each call is launches and a host read)."""
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
    for members in groups.values():
        sizes = [flats[i].shape[0] for i in members]
        damping = torch.cat([torch.full((k,), factors[i][2], dtype=torch.float64) for i, k in zip(members, sizes)])
        inv, tries = _cholesky_inverse(torch.cat([flats[i] for i in members]), damping.to(flats[members[0]].device),
                                       max_retries)
        used_by = torch.stack([t.max() for t in tries.split(sizes)]).tolist()  # one host read per block size
        for i, inv_i, used in zip(members, inv.split(sizes), used_by):
            if used <= max_retries:
                blocks, _, _, scale = factors[i]
                out[i] = ((inv_i * scale).reshape(blocks.shape[0], -1, *inv_i.shape[-2:]), used)
    return out


def damped_inverse(blocks: Tensor, n: int, damping: float, scale: float,
                   max_retries: int = MAX_DAMPING_RETRIES) -> tuple[Tensor, int]:
    """One factor's `damped_inverses`; raises LinAlgError when its blocks still fail after max_retries."""
    result = damped_inverses([(blocks, n, damping, scale)], max_retries)[0]
    if result is None:
        raise torch.linalg.LinAlgError(f"Cholesky failed after {max_retries} damping increases")
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
