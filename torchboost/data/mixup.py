"""Mixup and CutMix on training batches, with timm's semantics, inside the loader.

`Mixup` is timm's `Mixup` in its default "batch" mode: with probability `prob` a batch is mixed; with both
alphas set, CutMix is picked with probability `switch_prob`, else mixup. The weight lam ~ Beta(alpha, alpha);
mixup blends the batch with itself reversed (x * lam + x.flip(0) * (1 - lam)); CutMix pastes the reversed
batch's box of side sqrt(1 - lam) times the image's, centred at a uniform point and clipped at the border,
and then sets lam = 1 - (box area / image area), the share really kept (timm's correct_lam). Targets become
class probabilities: one-hot rows smoothed as timm does (off = smoothing / K, on = 1 - smoothing + off),
mixed with the same lam, so each row sums to 1. An unmixed batch gets the smoothed one-hot rows.

`MixedBatches` wraps a map-style training set: its `__getitems__` fetches the batch (collated), then mixes it
with a stream seeded by (seed, epoch, the batch's sample indices) through `sampling.batch_rng`. The sampler
hands those over with each index, so the draw is the same whichever worker builds the batch, and a run
resumed mid-epoch (whose sampler skips the batches already trained on) draws what the uninterrupted run drew.
uint8 batches (normalised on the device) are mixed in float32 and rounded to nearest, as timm's fast collate.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, default_collate

from torchboost.data.sampling import batch_rng
from torchboost.errors import ConfigError


def smoothed_one_hot(y: torch.Tensor, num_classes: int, smoothing: float = 0.0) -> torch.Tensor:
    """timm's `one_hot` with its smoothing: off = smoothing / K everywhere, on = 1 - smoothing + off."""
    off = smoothing / num_classes
    on = 1.0 - smoothing + off
    return torch.full((len(y), num_classes), off, dtype=torch.float32).scatter_(1, y.long().view(-1, 1), on)


def mix_target(y: torch.Tensor, num_classes: int, lam: float, smoothing: float = 0.0) -> torch.Tensor:
    """timm's `mixup_target`: lam × the smoothed one-hot rows + (1 - lam) × those of the reversed batch."""
    y1 = smoothed_one_hot(y, num_classes, smoothing)
    return y1 * lam + y1.flip(0) * (1.0 - lam)


def cutmix_box(height: int, width: int, lam: float, rng: np.random.Generator
               ) -> tuple[tuple[int, int, int, int], float]:
    """timm's `rand_bbox` + `cutmix_bbox_and_lam(correct_lam=True)`: ((y0, y1, x0, x1), 1 - box area / image area)."""
    ratio = np.sqrt(1 - lam)
    cut_h, cut_w = int(height * ratio), int(width * ratio)
    cy, cx = int(rng.integers(0, height)), int(rng.integers(0, width))
    y0, y1 = int(np.clip(cy - cut_h // 2, 0, height)), int(np.clip(cy + cut_h // 2, 0, height))
    x0, x1 = int(np.clip(cx - cut_w // 2, 0, width)), int(np.clip(cx + cut_w // 2, 0, width))
    return (y0, y1, x0, x1), 1.0 - (y1 - y0) * (x1 - x0) / float(height * width)


class Mixup:
    """timm's Mixup (mode "batch", correct_lam=True) called as `mixup(x, y, rng)` -> (mixed x, soft targets)."""

    def __init__(self, num_classes: int, mixup_alpha: float = 0.0, cutmix_alpha: float = 0.0, prob: float = 1.0,
                 switch_prob: float = 0.5, label_smoothing: float = 0.0) -> None:
        if mixup_alpha < 0 or cutmix_alpha < 0 or not (mixup_alpha or cutmix_alpha):
            raise ConfigError(f"mixup needs an alpha > 0 (got mixup {mixup_alpha}, cutmix {cutmix_alpha})",
                              "set data.mixup_alpha (e.g. 0.2) or data.cutmix_alpha (e.g. 1.0)")
        if num_classes < 2 or not 0 <= prob <= 1 or not 0 <= switch_prob <= 1 or not 0 <= label_smoothing < 1:
            raise ConfigError(f"mixup over {num_classes} classes with prob {prob}, switch_prob {switch_prob} and "
                              f"smoothing {label_smoothing} is out of range", "use probabilities in [0, 1]")
        self.num_classes, self.mixup_alpha, self.cutmix_alpha = num_classes, mixup_alpha, cutmix_alpha
        self.prob, self.switch_prob, self.label_smoothing = prob, switch_prob, label_smoothing

    def params(self, rng: np.random.Generator) -> tuple[float, bool]:
        """timm's `_params_per_batch`: (lam, use cutmix); lam = 1 leaves the batch as it is."""
        if not rng.random() < self.prob:
            return 1.0, False
        if self.mixup_alpha > 0 and self.cutmix_alpha > 0:
            cutmix = bool(rng.random() < self.switch_prob)
        else:
            cutmix = self.cutmix_alpha > 0
        alpha = self.cutmix_alpha if cutmix else self.mixup_alpha
        return float(rng.beta(alpha, alpha)), cutmix

    def __call__(self, x: torch.Tensor, y: torch.Tensor, rng: np.random.Generator
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        lam, cutmix = self.params(rng)
        if lam != 1.0:
            if cutmix:
                (y0, y1, x0, x1), lam = cutmix_box(x.shape[-2], x.shape[-1], lam, rng)
                x = x.clone()
                x[..., y0:y1, x0:x1] = x.flip(0)[..., y0:y1, x0:x1]
            else:
                mixed = x.float() * lam + x.flip(0).float() * (1.0 - lam)
                x = mixed if x.is_floating_point() else mixed.round_().clamp_(0, 255).to(x.dtype)
        return x, mix_target(y, self.num_classes, lam, self.label_smoothing)

    def __repr__(self) -> str:
        return (f"Mixup(num_classes={self.num_classes}, mixup_alpha={self.mixup_alpha}, cutmix_alpha="
                f"{self.cutmix_alpha}, prob={self.prob}, switch_prob={self.switch_prob}, "
                f"label_smoothing={self.label_smoothing})")


class MixedBatches(Dataset):
    """A map-style training set whose batches come out mixed by `mixup` (see the module docstring); every
    other attribute (classes, skipped...) is the wrapped set's. A DataLoader over it needs
    `collate_fn=passthrough_collate`, which `build_loader` passes (the `batched` flag)."""

    batched = True  # __getitems__ returns a collated batch

    def __init__(self, dataset: Dataset, mixup: Mixup) -> None:
        self.dataset, self.mixup = dataset, mixup

    def __len__(self) -> int:
        return len(self.dataset)

    def __getattr__(self, name: str) -> Any:
        if name in ("dataset", "mixup") or name.startswith("__"):  # unpickling in a worker: not set yet
            raise AttributeError(name)
        return getattr(self.dataset, name)

    def __getitems__(self, indices: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        if getattr(self.dataset, "batched", False):
            x, y = self.dataset.__getitems__(indices)
        else:
            x, y = default_collate([self.dataset[i] for i in indices])
        return self.mixup(x, y, batch_rng(indices))

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = self.__getitems__([index])  # a batch of one is mixed with itself: the smoothed one-hot row
        return x[0], y[0]
