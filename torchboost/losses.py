"""Losses with MindSpore's names."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class CrossEntropySmooth(nn.Module):
    """MindSpore's `CrossEntropySmooth(sparse, reduction, smooth_factor, num_classes)`.

    MindSpore builds the one-hot target as `on = 1 - smooth_factor`, `off = smooth_factor / (num_classes - 1)`
    (the true class gets exactly 1 - smooth_factor). torch's `label_smoothing=s` spreads s over *all*
    classes instead (true class: 1 - s + s/K), so we build MindSpore's target explicitly to stay faithful.

    A floating-point target of class probabilities (N×K rows, e.g. mixup/cutmix's soft targets, already
    smoothed where they were made) is used as it is, whatever `sparse` says: it is never smoothed twice.
    """

    def __init__(self, sparse: bool = True, reduction: str = "mean", smooth_factor: float = 0.0,
                 num_classes: int = 1000) -> None:
        super().__init__()
        if reduction not in ("mean", "sum", "none"):
            raise ValueError(f"reduction must be mean, sum or none, got {reduction!r}")
        self.sparse, self.reduction = sparse, reduction
        self.smooth_factor, self.num_classes = float(smooth_factor), num_classes

    def forward(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        logits = logits.float()  # softmax in fp32 even under autocast
        soft_given = target.is_floating_point()
        if self.sparse and not soft_given and self.smooth_factor == 0.0:
            return F.cross_entropy(logits, target, reduction=self.reduction)
        if self.sparse and not soft_given:
            off = self.smooth_factor / (self.num_classes - 1)
            soft = torch.full_like(logits, off)
            soft.scatter_(1, target.unsqueeze(1), 1.0 - self.smooth_factor)
        else:
            soft = target.to(logits.dtype)
        loss = -(soft * F.log_softmax(logits, dim=1)).sum(dim=1)
        if self.reduction == "mean":
            return loss.mean()
        return loss.sum() if self.reduction == "sum" else loss
