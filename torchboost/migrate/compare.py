"""Tensor-pair comparison metrics and the pass rule (Ascend msprobe / TroubleShooter conventions).

Metrics are computed in float64 over the elements that are finite on both sides; NaN/inf positions are
judged separately (same positions and same values on both sides is not a divergence, anything else is).
Relative error is |ours - ref| / |ref|, with 0/0 = 0 and x/0 = inf (a value where the reference has an
exact zero is infinitely wrong in relative terms; the absolute error says how much that matters).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import torch

RTOL = ATOL = 1e-4  # the allclose ratio's tolerances


@dataclass
class Metrics:
    cosine: float
    max_abs: float
    max_rel: float
    rel_lt_1e3: float  # share of elements with relative error < 1e-3
    rel_lt_5e3: float  # share of elements with relative error < 5e-3
    allclose: float  # share of elements with |ours - ref| <= ATOL + RTOL * |ref|
    numel: int
    nonfinite_mismatch: bool = False  # NaN/inf at different places (or of different kinds) on the two sides
    shape_mismatch: bool = False

    def to_dict(self) -> dict[str, Any]:
        # JSON has no inf/NaN: write them as strings so the report stays standard JSON.
        return {k: (v if not isinstance(v, float) or math.isfinite(v) else str(v)) for k, v in asdict(self).items()}


def _cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    na, nb = float(torch.linalg.vector_norm(a)), float(torch.linalg.vector_norm(b))
    if na == 0 and nb == 0:
        return 1.0  # two all-zero tensors agree perfectly
    if na == 0 or nb == 0:
        return 0.0  # one side all zeros, the other not: no alignment at all
    return float(torch.dot(a, b)) / (na * nb)


def _share(mask: torch.Tensor) -> float:
    return int(mask.sum()) / mask.numel()


def compare_tensors(ours: torch.Tensor, ref: torch.Tensor) -> Metrics:
    """All the comparison metrics for one tensor pair (any dtype/device; computed in float64 on CPU)."""
    n = ours.numel()
    if tuple(ours.shape) != tuple(ref.shape):
        return Metrics(0.0, math.inf, math.inf, 0.0, 0.0, 0.0, n, shape_mismatch=True)
    a = ours.detach().reshape(-1).to("cpu", torch.float64)
    b = ref.detach().reshape(-1).to("cpu", torch.float64)
    mismatch = False
    fa, fb = torch.isfinite(a), torch.isfinite(b)
    if not (bool(fa.all()) and bool(fb.all())):  # rare: keep the mask work off the common path
        same_nan = torch.isnan(a) & torch.isnan(b)
        # Non-finite on one side only, or different non-finite values (inf vs -inf, inf vs NaN).
        mismatch = bool(((fa != fb) | (~fa & ~fb & ~same_nan & (a != b))).any())
        both = fa & fb
        a, b = a[both], b[both]
    if torch.equal(a, b):  # identical (or nothing finite to compare): skip the arithmetic
        return Metrics(1.0, 0.0, 0.0, 1.0, 1.0, 1.0, n, nonfinite_mismatch=mismatch)
    diff = (a - b).abs_()
    ref_abs = b.abs()
    rel = (diff / ref_abs).masked_fill_(diff == 0, 0.0)  # x/0 = inf, 0/0 = 0
    return Metrics(
        cosine=_cosine(a, b), max_abs=float(diff.max()), max_rel=float(rel.max()),
        rel_lt_1e3=_share(rel < 1e-3), rel_lt_5e3=_share(rel < 5e-3),
        allclose=_share(diff <= ATOL + RTOL * ref_abs), numel=n, nonfinite_mismatch=mismatch)


def judge(m: Metrics) -> tuple[bool, str]:
    """(passed, reason). Fails when (cosine < 0.99 and max abs > 1e-3) or cosine < 0.9 or max abs > 1 or
    NaN/inf on one side only — the rule msprobe applies — and also when most elements differ by >= 5e-3
    relative with max abs > 1e-3 (a difference of scale, which cosine cannot see)."""
    if m.shape_mismatch:
        return False, "shape mismatch"
    if m.nonfinite_mismatch:
        return False, "NaN/inf on one side only"
    if m.cosine < 0.9:
        return False, f"cosine {m.cosine:.4f} < 0.9"
    if m.max_abs > 1:
        return False, f"max abs error {m.max_abs:.3g} > 1"
    if m.cosine < 0.99 and m.max_abs > 1e-3:
        return False, f"cosine {m.cosine:.4f} < 0.99 and max abs error {m.max_abs:.3g} > 1e-3"
    # Cosine cannot see scale: a loss scalar, or an update from twice the lr, has cosine 1. Rounding noise
    # leaves most elements within 5e-3 relative; a systematic difference moves most of them.
    if m.rel_lt_5e3 < 0.5 and m.max_abs > 1e-3:
        return False, f"{1 - m.rel_lt_5e3:.0%} of elements differ by >= 5e-3 relative (max abs error {m.max_abs:.3g})"
    return True, ""
