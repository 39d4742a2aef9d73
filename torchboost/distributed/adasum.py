"""Adasum: adaptive summation of per-rank weight deltas (Adasum paper, MLSys 2021; Horovod), per parameter tensor:

    Adasum(a, b) = (1 - a·b / (2‖a‖²)) a + (1 - a·b / (2‖b‖²)) b     (coefficient 1 when ‖·‖² < 1e-8)

a sum when a ⟂ b, an average when a ∥ b. For N = 2^k ranks: Adasum(Adasum(first half), Adasum(second
half)), recursively. Any other N, with P the largest power of two ≤ N: each extra rank r ≥ P is first
combined with its partner, g'_{r-P} = Adasum(g_{r-P}, g_r), the P-rank recursion runs on the g', and
the partners send the result back. Every delta enters through the same pairwise rule (nothing is summed
or dropped), at the price of two full-buffer transfers per extra rank.

Communication (Horovod's VHDD): at level ℓ = 1, 2, 4, … a rank pairs with rank ^ ℓ and the pair swap
halves of their current segment (the lower rank keeps the lower half): n/2 + n/4 + … sent per rank, like
a ring all-reduce. The per-tensor partial (a·b, ‖a‖², ‖b‖²) of the kept pieces are summed over the 2ℓ
ranks that have met so far by recursive doubling with point-to-point sends (3 float64 per tensor), not
by cached `new_group`s: no extra process groups (gloo opens a full mesh per group and every rank must
create every group), it works inside any `group`, and pairwise additions commute exactly, so all ranks
compute bit-identical coefficients. A reverse exchange (all-gather) reassembles the result.

Precision: the buffer travels as float32 (float64 if an input is float64); dots and norms accumulate in
float64; each level's combination is one multiply-add per element; outputs return in each input's
dtype, so fp16/bf16 deltas do not overflow as in Horovod. A non-finite input on any rank is seen by all
(a count rides with the last level's scalars): `adasum_combine` returns the flag, `adasum_reduce`
returns NaN-filled tensors on every rank.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch import Tensor

from torchboost.distributed.group import get_world_size, guard, info
from torchboost.errors import DistributedError

_NORM_EPS = 1e-8
_CHUNK = 1 << 16  # elements per float64 cast (2 × 512 KB: stays in cache)
_GROUPS: dict[int, tuple] = {}


def _pieces(offsets: list[int], start: int, end: int, chunk: int | None = None) -> Iterator[tuple[int, int, int]]:
    """(tensor index, lo, hi) covering the flat range [start, end), cut at tensor boundaries (and every
    `chunk` elements)."""
    t, pos = bisect.bisect_right(offsets, start) - 1, start
    while pos < end:
        while offsets[t + 1] <= pos:  # skip empty tensors
            t += 1
        hi = min(end, offsets[t + 1], pos + chunk if chunk else end)
        yield t, pos, hi
        pos = hi


def _stats(a: Tensor, b: Tensor, offsets: list[int], start: int) -> Tensor:
    """Per-tensor (a·b, ‖a‖², ‖b‖²) of the pieces a, b (flat range [start, start + len(a))): float64 (T, 3).

    Chunk by chunk, a and b are cast into one float64 (2, chunk) buffer whose Gram matrix (one GEMM)
    holds all three sums: whole-segment float64 temporaries cost more in page faults than the math.
    """
    gram = torch.zeros(len(offsets) - 1, 2, 2, dtype=torch.float64, device=a.device)
    buf = torch.empty(2, min(_CHUNK, a.numel()), dtype=torch.float64, device=a.device)
    for t, lo, hi in _pieces(offsets, start, start + a.numel(), _CHUNK):
        v = buf[:, :hi - lo]
        v[0].copy_(a[lo - start:hi - start])
        v[1].copy_(b[lo - start:hi - start])
        gram[t].addmm_(v, v.T)
    return torch.stack([gram[:, 0, 1], gram[:, 0, 0], gram[:, 1, 1]], dim=1)


def _combine(a: Tensor, b: Tensor, stats: Tensor, offsets: list[int], start: int) -> Tensor:
    """The Adasum pair rule on the pieces a, b, given full-tensor stats (one rounding to a's dtype)."""
    dot, na, nb = stats.unbind(1)
    ca = torch.where(na < _NORM_EPS, 1.0, 1 - dot / (2 * na)).tolist()  # NaN stats stay NaN (not < eps)
    cb = torch.where(nb < _NORM_EPS, 1.0, 1 - dot / (2 * nb)).tolist()
    out = torch.empty_like(a)
    for t, lo, hi in _pieces(offsets, start, start + a.numel()):
        piece = out[lo - start:hi - start]
        torch.mul(a[lo - start:hi - start], ca[t], out=piece).add_(b[lo - start:hi - start], alpha=cb[t])
    return out


def _finite(flat: Tensor) -> bool:
    """No inf/NaN in `flat`: they make the sum non-finite (a plain sum is ~15x faster than isfinite
    here). A finite buffer whose sum overflows (elements ~1e31 in float32) also counts as non-finite;
    no real update is that large."""
    return bool(torch.isfinite(flat.sum()))


def _exchange(send: Tensor, recv: Tensor, peer: int, group: dist.ProcessGroup | None) -> Tensor:
    """Send `send` to global rank `peer` while receiving `recv` from it; returns recv."""
    ops = []
    if send.numel():  # empty messages are skipped on both sides (both know the sizes)
        ops.append(dist.P2POp(dist.isend, send.contiguous(), peer, group))
    if recv.numel():
        ops.append(dist.P2POp(dist.irecv, recv, peer, group))
    if ops:
        for work in dist.batch_isend_irecv(ops):
            work.wait()
    return recv


def _adasum_flat(flat: Tensor, offsets: list[int], group: dist.ProcessGroup | None) -> tuple[Tensor, bool]:
    """Adasum of this rank's flat buffer with every other rank's in `group`; (result, all finite)."""
    rank, n_ranks = dist.get_rank(group), dist.get_world_size(group)
    glob = (lambda r: r) if group is None else (lambda r: dist.get_global_rank(group, r))
    n, none = flat.numel(), flat[:0]
    bad = torch.tensor([0.0 if _finite(flat) else 1.0], dtype=flat.dtype, device=flat.device)
    p = 1 << (n_ranks.bit_length() - 1)
    if rank >= p:  # extra rank: hand the delta to the partner, get the final result back
        _exchange(torch.cat([flat, bad]), none, glob(rank - p), group)
        back = _exchange(none, flat.new_empty(n + 1), glob(rank - p), group)
        return back[:n], bool(back[n] == 0)
    if rank + p < n_ranks:
        theirs = _exchange(none, flat.new_empty(n + 1), glob(rank + p), group)
        bad = bad + theirs[n:]
        flat = _combine(flat, theirs[:n], _stats(flat, theirs[:n], offsets, 0), offsets, 0)
    cur, start, end, history, bit = flat, 0, n, [], 1
    while bit < p:  # reduce-scatter levels
        peer, lower, mid = rank ^ bit, not rank & bit, start + (end - start) // 2
        keep, give = ((start, mid), (mid, end)) if lower else ((mid, end), (start, mid))
        theirs = _exchange(cur[give[0] - start:give[1] - start], flat.new_empty(keep[1] - keep[0]),
                           glob(peer), group)
        mine = cur[keep[0] - start:keep[1] - start]
        a, b = (mine, theirs) if lower else (theirs, mine)  # a is always the lower ranks' vector
        scalars = _stats(a, b, offsets, keep[0]).flatten()
        if 2 * bit == p:  # last level spans all p ranks: let the non-finite count ride along
            scalars = torch.cat([scalars, bad.double()])
        sub = 1
        while sub <= bit:  # recursive doubling over the 2·bit ranks that have met so far
            scalars = scalars + _exchange(scalars, torch.empty_like(scalars), glob(rank ^ sub), group)
            sub <<= 1
        if 2 * bit == p:
            bad, scalars = scalars[-1:].to(flat.dtype), scalars[:-1]
        cur = _combine(a, b, scalars.view(-1, 3), offsets, keep[0])
        history.append((start, end, mid, peer, lower))
        start, end = keep
        bit <<= 1
    result = flat.new_empty(n)
    result[start:end] = cur
    for start, end, mid, peer, lower in reversed(history):  # all-gather levels, in place
        mine, sibling = (slice(start, mid), slice(mid, end)) if lower else (slice(mid, end), slice(start, mid))
        _exchange(result[mine], result[sibling], glob(peer), group)
    if rank + p < n_ranks:
        _exchange(torch.cat([result, bad]), none, glob(rank + p), group)
    return result, bool(bad.item() == 0)


def adasum_combine(tensors: list[Tensor], group: dist.ProcessGroup | None = None, *,
                   node_group: dist.ProcessGroup | None = None) -> tuple[list[Tensor], bool]:
    """Adasum-combine this rank's `tensors` with every rank's; returns (combined, all_finite).

    Results are identical on every rank, in each input's dtype and shape. all_finite is False on every
    rank when any rank's input held inf/NaN (the caller then skips the step). With `node_group`, inputs
    are first averaged within the node and Adasum runs over `group`, which must then be the cross-node
    group of this rank (see `hierarchical_groups`).
    """
    if not tensors:
        return [], True
    wire = torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32
    flat = torch.cat([t.detach().reshape(-1).to(wire) for t in tensors])
    offsets = [0, *itertools.accumulate(t.numel() for t in tensors)]
    with guard("adasum_reduce"):
        if node_group is not None and dist.get_world_size(node_group) > 1:
            dist.all_reduce(flat, group=node_group)
            flat /= dist.get_world_size(node_group)
        if dist.is_initialized() and dist.get_world_size(group) > 1:
            flat, finite = _adasum_flat(flat, offsets, group)
        else:
            finite = _finite(flat)
    pieces = flat.split([t.numel() for t in tensors])
    return [x.view(t.shape).to(t.dtype) for x, t in zip(pieces, tensors)], finite


def adasum_reduce(tensors: list[Tensor], group: dist.ProcessGroup | None = None) -> list[Tensor]:
    """Adasum-combined `tensors` (this rank's list), identical on every rank of `group`.

    If any rank's input holds inf/NaN, every rank gets NaN-filled outputs, so `torch.isfinite` on the
    result is a skip test that all ranks agree on (use `adasum_combine` to get the flag directly).
    """
    out, finite = adasum_combine(tensors, group)
    return out if finite else [torch.full_like(t, float("nan")) for t in out]


def hierarchical_groups(local_world_size: int | None = None) -> tuple[dist.ProcessGroup, dist.ProcessGroup]:
    """(node group, cross-node group) of this rank; created once, collectively on every rank.

    torchrun numbers ranks node by node, so node i holds ranks [i·L, (i+1)·L).
    """
    if not dist.is_initialized():
        raise DistributedError("hierarchical Adasum needs a process group", "call init_distributed() first")
    world, local = get_world_size(), local_world_size or info().local_world_size
    if world % local:
        raise DistributedError(f"{world} ranks do not split into nodes of {local}",
                               "run the same number of processes on every node")
    if local not in _GROUPS:
        with guard("creating Adasum process groups"):
            node, _ = dist.new_subgroups_by_enumeration([list(range(i, i + local)) for i in range(0, world, local)])
            cross, _ = dist.new_subgroups_by_enumeration([list(range(j, world, local)) for j in range(local)])
        _GROUPS[local] = (node, cross)
    return _GROUPS[local]
