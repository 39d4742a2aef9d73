"""Per-class results of an evaluation: every sample's prediction kept, then the confusion matrix, per-class
precision / recall / F1, the most confused pairs and the most confidently wrong samples, and the matrix as a
picture that stays readable at 100+ classes.

`Model.eval(data, tally=ClassTally(k))` fills one; it holds this process's samples (a sharded evaluation
gives each rank its share: the recipe reports per-class results from one process only).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from torchboost.escape import plot_label


@dataclass(frozen=True)
class ClassScore:
    precision: float  # of the samples predicted as the class, the share that is it (0 when none predicted)
    recall: float  # of the class's samples, the share predicted as it (0 when it has none)
    f1: float
    support: int  # the class's samples


class ClassTally:
    """Every evaluated sample's (true class, predicted class, predicted probability), in data order."""

    def __init__(self, num_classes: int) -> None:
        self.num_classes = num_classes
        self._true: list[np.ndarray] = []
        self._pred: list[np.ndarray] = []
        self._prob: list[np.ndarray] = []

    def update(self, logits: torch.Tensor, y: torch.Tensor) -> None:
        """One batch: logits N×K and labels N (class indices, or class probabilities N×K: their argmax)."""
        probs = torch.softmax(logits.detach().float(), 1)
        top, pred = probs.max(1)
        y = y.argmax(1) if y.ndim == 2 else y
        self._true.append(y.cpu().numpy().astype(np.int64))
        self._pred.append(pred.cpu().numpy().astype(np.int64))
        self._prob.append(top.cpu().numpy().astype(np.float64))

    @property
    def true(self) -> np.ndarray:
        return np.concatenate(self._true) if self._true else np.zeros(0, np.int64)

    @property
    def pred(self) -> np.ndarray:
        return np.concatenate(self._pred) if self._pred else np.zeros(0, np.int64)

    @property
    def prob(self) -> np.ndarray:
        return np.concatenate(self._prob) if self._prob else np.zeros(0)

    def confusion(self) -> np.ndarray:
        """K×K counts: row = true class, column = predicted class."""
        k = self.num_classes
        return np.bincount(self.true * k + self.pred, minlength=k * k).reshape(k, k)

    def scores(self) -> list[ClassScore]:
        k, true, pred = self.num_classes, self.true, self.pred  # counted per class: no K×K matrix at 10,000 classes
        hits, predicted, support = (np.bincount(v, minlength=k) for v in (true[true == pred], pred, true))
        out = []
        for tp, pp, n in zip(hits.tolist(), predicted.tolist(), support.tolist()):
            p, r = (tp / pp if pp else 0.0), (tp / n if n else 0.0)
            out.append(ClassScore(p, r, 2 * p * r / (p + r) if p + r else 0.0, n))
        return out

    def confused_pairs(self, n: int = 10) -> list[tuple[int, int, int]]:
        """The `n` largest off-diagonal counts as (true, predicted, count), largest first (ties: by index); from
        the wrong samples' pairs, never a K×K matrix."""
        true, pred = self.true, self.pred
        wrong = true != pred
        codes, counts = np.unique(true[wrong] * self.num_classes + pred[wrong], return_counts=True)
        order = np.lexsort((codes, -counts))[:n]  # codes ascend as (true, predicted) do
        return [(int(c) // self.num_classes, int(c) % self.num_classes, int(counts[i]))
                for i, c in zip(order, codes[order])]

    def worst(self, n: int = 10) -> list[tuple[int, int, int, float]]:
        """The `n` wrong predictions made with the highest probability: (sample index, true, predicted, p)."""
        true, pred, prob = self.true, self.pred, self.prob
        wrong = np.flatnonzero(true != pred)
        order = wrong[np.argsort(-prob[wrong], kind="stable")][:n]
        return [(int(i), int(true[i]), int(pred[i]), float(prob[i])) for i in order]


def confusion_figure(matrix: np.ndarray, classes: Sequence[str], path: str | Path, title: str) -> None:
    """The confusion matrix as a PNG: each row as shares of the class's samples (so small classes show), on a
    log colour scale past 20 classes; class names on the axes up to 40 classes, every k-th beyond (the
    figure grows to about 0.12 inch a class, up to 24 inches), so 100+ classes stay readable."""
    from matplotlib.colors import LogNorm

    from torchboost.plotting import pyplot

    plt = pyplot()
    k = len(classes)
    shares = matrix / np.maximum(matrix.sum(1, keepdims=True), 1)
    side = float(min(24.0, max(5.0, 0.12 * k + 3)))
    fig, ax = plt.subplots(figsize=(side, side))
    norm = LogNorm(vmin=max(1e-3, 1 / max(int(matrix.sum(1).max()), 1)), vmax=1) if k > 20 else None
    image = ax.imshow(np.where(shares > 0, shares, np.nan) if norm else shares, cmap="viridis", norm=norm,
                      vmin=None if norm else 0, vmax=None if norm else 1, interpolation="nearest")
    step = 1 if k <= 40 else int(np.ceil(k / 40))
    ticks = list(range(0, k, step))
    labels = [plot_label(str(classes[i])[:20]) for i in ticks]
    ax.set_xticks(ticks, labels, rotation=90, fontsize=7 if k > 20 else 9)
    ax.set_yticks(ticks, labels, fontsize=7 if k > 20 else 9)
    if k <= 20:
        for (t, p), count in np.ndenumerate(matrix):
            if count:
                ax.text(p, t, str(count), ha="center", va="center", fontsize=8,
                        color="white" if shares[t, p] < 0.5 else "black")
    ax.set(xlabel="predicted class", ylabel="true class", title=plot_label(title))
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04, label="share of the true class's samples")
    try:
        with warnings.catch_warnings():  # a name's glyph missing from the font: a box in the picture, no warning
            warnings.filterwarnings("ignore", message="Glyph .* missing from")
            fig.tight_layout()
            fig.savefig(path, dpi=100, format="png")  # `path` may be a temp name without the suffix
    finally:
        plt.close(fig)
