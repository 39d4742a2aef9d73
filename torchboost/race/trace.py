"""`race --trace`: per layer and epoch, how big the last update of the epoch was against the weight
(|dW| / |W|), |W|, the lr, and THOR's effective damping (damping x |W|^2: for a weight BatchNorm makes
scale-invariant, K-FAC's damping acts like that; Zhang et al. 2019) and THOR's health report (whether each
factor side and divisor acts) — to tell whether an optimizer's late plateau is its step size (a relative step
that does not fall with the lr) or its direction."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Sequence

import torch
from torch import nn

from torchboost.escape import plot_label
from torchboost.fileio import atomic_path
from torchboost.optim.thor.health import health_rows, health_summary, thor_health
from torchboost.optim.thor.preconditioner import PreconditionedProtocol
from torchboost.plotting import pyplot


def traced_weights(model: nn.Module) -> dict[str, torch.Tensor]:
    """A copy of every Conv2d/Linear weight, by module name."""
    return {name: m.weight.detach().clone() for name, m in model.named_modules()
            if isinstance(m, (nn.Conv2d, nn.Linear))}


def layer_trace(model: nn.Module, before: dict[str, torch.Tensor], optimizer: torch.optim.Optimizer) -> dict:
    """{"lr", "layers": {name: {"rel_step", "norm", "damping_eff"?}}, "health"?, "health_summary"?} for the update
    just taken from `before` (health: THOR's report, `optim.thor.health`)."""
    modules = dict(model.named_modules())
    damping = None
    if isinstance(optimizer, PreconditionedProtocol):  # the damping of the update just taken
        damping = optimizer.preconditioner.damping_at(max(optimizer.preconditioner.update_index - 1, 0))
    layers = {}
    for name, w0 in before.items():
        w = modules[name].weight.detach()
        norm = float(w.norm())
        row = {"rel_step": float((w - w0).norm() / w0.norm().clamp_min(1e-30)), "norm": norm}
        if damping is not None:
            row["damping_eff"] = damping * norm**2
        layers[name] = row
    row = {"lr": float(optimizer.param_groups[0]["lr"]), "layers": layers}
    report = thor_health(optimizer)
    if report:  # THOR's family: is each factor side and divisor acting (optim.thor.health)
        row.update(health=health_rows(report), health_summary=health_summary(report))
    return row


def _median(rows: list[dict], key: str) -> float:
    values = [r[key] for r in rows if key in r]
    return statistics.median(values) if values else float("nan")


def trace_figure_path(lanes: Sequence, summary: dict, path: Path) -> Path:
    """race-trace.png: per racer at its best lr for the first target (seed 0's run), per epoch, the median
    over layers of |dW|/|W|, of |W| and of THOR's effective damping, and the lr."""
    plt = pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(10, 7))
    panels = [("median over layers of |dW| / |W| (last update of the epoch)", "rel_step", True),
              ("median over layers of |W|", "norm", False),
              ("lr (first param group)", None, True),
              ("THOR: median of damping x |W|^2", "damping_eff", True)]
    rows = next(iter(summary["targets"].values()))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (name, row) in enumerate(rows.items()):
        runs = [l for l in lanes if l.racer == name and l.lr == row["lr"] and any("layers" in h for h in l.history)]
        if not runs:
            continue
        hist = [h for h in min(runs, key=lambda l: l.seed).history if "layers" in h]
        epochs = [h["epoch"] for h in hist]
        for ax, (title, key, log) in zip(axes.flat, panels):
            ys = [h["lr"] if key is None else _median(list(h["layers"].values()), key) for h in hist]
            if any(y == y for y in ys):  # skip a racer with no such value (NaN everywhere)
                ax.plot(epochs, ys, marker="o", ms=3, color=colors[i % len(colors)],
                        label=plot_label(f"{name} @ {row['lr']:g}"))
            ax.set_title(title, fontsize=9)
            ax.set_xlabel("epoch")
            if log:
                ax.set_yscale("log")
    for ax in axes.flat:
        ax.grid(True, alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=7)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=100, format="png")  # format: the temp name does not end in .png
    plt.close(fig)
    return path
