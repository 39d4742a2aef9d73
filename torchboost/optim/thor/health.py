"""Whether THOR's mechanisms act: per layer and side, the damping against the factor's eigenvalues, and for
EKFAC / thor_soap the share of divisor coordinates its epsilon dominates.

A factor F damped by d is inverted as (F + d I)^-1: along an eigen-direction with eigenvalue l < d the damping
decides the step, not F. When nearly every direction is so (`INERT`), that side preconditions nothing: on
ResNet-20, MindSpore's absolute sqrt(damping/T) is 20-10^5 x G's mean eigenvalue, so THOR is one-sided. A divisor
s + eps (EKFAC) or sqrt(v_hat) + eps (thor_soap) whose eps exceeds s almost everywhere divides by a constant:
rotate-divide-unrotate is then the identity times a number.

The eigenvalues are those of the block-diagonal factors THOR keeps (split_dim), in float64.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from torchboost.optim.thor.eigen import block_eigh
from torchboost.optim.thor.layer import ThorLayer, factor_dampings
from torchboost.optim.thor.preconditioner import PreconditionedProtocol, ThorPreconditioner
from torchboost.optim.thor.soap import ThorSOAP

INERT = 0.95  # a side or divisor whose damping dominates more than this share of its directions is inert


@dataclass(frozen=True)
class SideHealth:
    """One factor (A or G) of a layer: its eigenvalues' range, the damping added to it (None: its eigenbasis is
    used undamped, EKFAC / thor_soap), damping / mean eigenvalue, and the share of eigenvalues below the damping."""

    side: str
    eig_min: float
    eig_mean: float
    eig_max: float
    damping: float | None = None
    ratio: float | None = None
    dominated: float | None = None

    @property
    def inert(self) -> bool:
        return self.dominated is not None and self.dominated > INERT


@dataclass(frozen=True)
class DivisorHealth:
    """EKFAC's s + eps or thor_soap's sqrt(v_hat) + eps: the mean epsilon, the median of what it is added to, and
    the share of coordinates where the epsilon is larger."""

    kind: str  # "s" (EKFAC) or "sqrt(v)" (thor_soap)
    eps: float
    median: float
    dominated: float

    @property
    def inert(self) -> bool:
        return self.dominated > INERT


@dataclass(frozen=True)
class LayerHealth:
    name: str
    sides: tuple[SideHealth, ...]
    divisor: DivisorHealth | None = None

    def inert(self) -> list[str]:
        """The names of what is inert here: "A", "G", "divisor"."""
        return [s.side for s in self.sides if s.inert] + (["divisor"] if self.divisor and self.divisor.inert else [])


def _side(side: str, blocks: Tensor, n: int, damping: float | Tensor | None) -> SideHealth:
    evals = block_eigh(blocks.double(), n)[0]  # (groups, n)
    lo, mean, hi = float(evals.min()), float(evals.mean()), float(evals.max())
    if damping is None:
        return SideHealth(side, lo, mean, hi)
    d = torch.as_tensor(damping, dtype=torch.float64).reshape(-1, 1).expand(evals.shape[0], 1)
    d_mean = float(d.mean())
    return SideHealth(side, lo, mean, hi, d_mean, d_mean / mean if mean > 0 else float("inf"),
                      float((evals < d).double().mean()))


def _divisor(kind: str, values: Tensor, eps: float | Tensor) -> DivisorHealth:
    values = values.double()
    eps = torch.as_tensor(eps, dtype=torch.float64)
    return DivisorHealth(kind, float(eps.mean()), float(values.median()), float((values < eps).double().mean()))


def _preconditioner(optimizer: object) -> ThorPreconditioner | None:
    if isinstance(optimizer, ThorPreconditioner):
        return optimizer
    return optimizer.preconditioner if isinstance(optimizer, PreconditionedProtocol) else None


def thor_health(optimizer: object) -> list[LayerHealth]:
    """The report of every THOR layer with factors (THOR, thor_ekfac, thor_muon, thor_soap, or a
    ThorPreconditioner) at the damping of the latest update; [] for any other optimizer or before a refresh."""
    pre = _preconditioner(optimizer)
    if pre is None:
        return []
    damping = pre.damping_at(max(pre.update_index - 1, 0))
    mode = pre.options.damping_mode
    divisors = optimizer.divisors() if isinstance(optimizer, ThorSOAP) else {}
    report = []
    for layer in pre.layers.values():
        if layer.A is None or layer.G is None:
            continue
        n_in, n_out = layer.sizes
        d_a, d_g = (None, None) if pre.keeps_bases else factor_dampings(layer.A, layer.G, n_in, n_out, damping,
                                                                         layer.T, mode)
        sides = (_side("A", layer.A, n_in, d_a), _side("G", layer.G, n_out, d_g))
        report.append(LayerHealth(layer.name, sides, _layer_divisor(layer, pre, damping, divisors)))
    return report


def _layer_divisor(layer: ThorLayer, pre: ThorPreconditioner, damping: float,
                   divisors: dict[str, tuple[Tensor, Tensor]]) -> DivisorHealth | None:
    if layer.name in divisors:
        return _divisor("sqrt(v)", *divisors[layer.name])
    if pre.options.ekfac_decay is not None and layer.eigen is not None:
        return _divisor("s", layer.eigen.s, layer.eigen.epsilon(damping, pre.options.damping_mode == "trace"))
    return None


def _share(values: list[float]) -> str:
    return f"{min(values):.0%}-{max(values):.0%}" if values else "-"


def health_summary(report: list[LayerHealth]) -> str:
    """One line: per side and for the divisors, the range over layers of the share of directions the damping
    dominates and of damping / mean eigenvalue, and how many layers have it inert."""
    parts = []
    for i, side in enumerate(("A", "G")):
        rows = [r.sides[i] for r in report if r.sides[i].dominated is not None]
        if rows:
            ratios = [s.ratio for s in rows]
            parts.append(f"{side}: damping dominates {_share([s.dominated for s in rows])} of directions, "
                         f"damping/mean eig {min(ratios):.3g}-{max(ratios):.3g}, inert in "
                         f"{sum(s.inert for s in rows)}/{len(rows)} layers")
    divs = [r.divisor for r in report if r.divisor is not None]
    if divs:
        parts.append(f"divisor: eps dominates {_share([d.dominated for d in divs])} of coordinates, inert in "
                     f"{sum(d.inert for d in divs)}/{len(divs)} layers")
    return "THOR health: " + ("; ".join(parts) if parts else "no factors yet")


def health_warning(report: list[LayerHealth]) -> str | None:
    """One line naming each inert side or divisor with its layers (None when every one acts)."""
    inert: dict[str, list[str]] = {}
    for r in report:
        for what in r.inert():
            inert.setdefault(what, []).append(r.name)
    if not inert:
        return None
    words = {"A": "A's eigen-directions", "G": "G's eigen-directions", "divisor": "the divisor's coordinates"}
    said = "; ".join(f"{words[what]} in {len(names)}/{len(report)} layers ({', '.join(names[:4])}"
                     f"{', ...' if len(names) > 4 else ''})" for what, names in inert.items())
    return (f"warning: THOR's damping dominates more than {INERT:.0%} of {said}: that part preconditions nothing "
            "(damping_mode trace scales the damping to each factor)")


def health_rows(report: list[LayerHealth]) -> list[dict]:
    """The report as plain rows (for JSON)."""
    return [{"layer": r.name, "sides": [vars(s) | {"inert": s.inert} for s in r.sides],
             "divisor": None if r.divisor is None else vars(r.divisor) | {"inert": r.divisor.inert}} for r in report]
