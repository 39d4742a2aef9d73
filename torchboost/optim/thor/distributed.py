"""THOR under torch.distributed: average factors across ranks, spread the inversion work.

MindSpore averages the per-rank INVERSES, which is not the inverse of the averaged Fisher. We average the
FACTORS before inversion (so N ranks with batch b give the factors of one batch N*b), then each layer's
inverse is computed on one rank, chosen greedily by cost (longest job to the least-loaded rank), and
shared: every rank fills only the slots it owns in one flat buffer and a SUM all-reduce plays the part of
one broadcast per layer in a single collective. Per-rank inversion cost falls with world size.
"""

from __future__ import annotations

import itertools
from typing import Sequence

import torch
import torch.distributed as dist
from torch import Tensor


def world_size(group: dist.ProcessGroup | None = None) -> int:
    """World size of `group`, 1 when torch.distributed is not initialized."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(group)
    return 1


def _chunks(n: int, split_indices: Sequence[int] | None) -> list[range]:
    """Fusion groups as MindSpore's split_indices: [26, 53] -> layers 0..26 and 27..53 (inclusive)."""
    bounds = sorted(i + 1 for i in (split_indices or []) if 0 <= i < n - 1) + [n]
    starts = [0] + bounds[:-1]
    return [range(s, e) for s, e in zip(starts, bounds) if e > s]


Shapes = list[tuple[torch.Size, torch.Size]]


def average_factors(entries: list[tuple[Tensor, Tensor, float] | None], shapes: Shapes, dtype: torch.dtype,
                    device: torch.device, group: dist.ProcessGroup | None = None,
                    split_indices: Sequence[int] | None = None) -> list[tuple[Tensor, Tensor, float] | None]:
    """Average (A, G, T) over the ranks that have them; a layer no rank saw stays None.

    Every rank passes the same layer list (same shapes); a missing entry contributes zeros and a zero
    presence count, so uneven participation (a branch not taken on one rank) still averages correctly.
    Ranks are weighted equally, as DDP weights their gradients: exact for equal per-rank batches.
    """
    out: list[tuple[Tensor, Tensor, float] | None] = [None] * len(entries)
    for chunk in _chunks(len(entries), split_indices):
        parts = []
        for i in chunk:
            (sa, sg), e = shapes[i], entries[i]
            if e is None:
                parts += [torch.zeros(sa.numel() + sg.numel() + 2, dtype=dtype, device=device)]
            else:
                extra = torch.tensor([e[2], 1.0], dtype=dtype, device=device)
                parts += [e[0].reshape(-1).to(dtype), e[1].reshape(-1).to(dtype), extra]
        buf = torch.cat(parts)
        dist.all_reduce(buf, group=group)
        views, offset = [], 0
        for i in chunk:
            sa, sg = shapes[i]
            end_a, end_g = offset + sa.numel(), offset + sa.numel() + sg.numel()
            views.append((buf[offset:end_a].view(sa), buf[end_a:end_g].view(sg), end_g))
            offset = end_g + 2
        # one host sync per chunk for all (T, count) pairs
        scalars = buf[torch.tensor([v[2] + k for v in views for k in (0, 1)], device=device)].tolist()
        for j, (i, (a, g, _)) in enumerate(zip(chunk, views)):
            t_sum, count = scalars[2 * j], scalars[2 * j + 1]
            if count > 0:
                out[i] = (a / count, g / count, t_sum / count)
    return out


def assign_owners(costs: list[float], world: int) -> list[int]:
    """Longest-processing-time assignment: costliest layer first, each to the least-loaded rank."""
    load = [0.0] * world
    owners = [0] * len(costs)
    for i in sorted(range(len(costs)), key=lambda i: -costs[i]):
        rank = min(range(world), key=lambda r: load[r])
        owners[i] = rank
        load[rank] += costs[i]
    return owners


def share_inverses(inverses: list[tuple[Tensor, Tensor] | None], shapes: Shapes, dtype: torch.dtype,
                   device: torch.device,
                   group: dist.ProcessGroup | None = None) -> list[tuple[Tensor, Tensor] | None]:
    """Give every rank the inverses computed by their owners (None on non-owners) in one all-reduce.

    A trailing flag per layer tells whether its owner succeeded, so a failed inversion stays None
    everywhere and every rank keeps the same previous inverse.
    """
    parts = []
    for inv, (sa, sg) in zip(inverses, shapes):
        if inv is None:
            parts.append(torch.zeros(sa.numel() + sg.numel() + 1, dtype=dtype, device=device))
        else:
            parts += [inv[0].reshape(-1).to(dtype), inv[1].reshape(-1).to(dtype),
                      torch.ones(1, dtype=dtype, device=device)]
    if not parts:
        return []
    buf = torch.cat(parts)
    dist.all_reduce(buf, group=group)
    views, offset = [], 0
    for sa, sg in shapes:
        views.append((buf[offset: offset + sa.numel()].view(sa),
                      buf[offset + sa.numel(): offset + sa.numel() + sg.numel()].view(sg)))
        offset += sa.numel() + sg.numel() + 1
    ends = itertools.accumulate(sa.numel() + sg.numel() + 1 for sa, sg in shapes)
    ok = buf[torch.tensor(list(ends), device=device) - 1].tolist()  # one host sync for all flags
    return [(a.clone(), g.clone()) if flag > 0 else None for (a, g), flag in zip(views, ok)]
