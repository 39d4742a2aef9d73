"""Evaluation metrics that aggregate exactly: sums and counts, reduced across ranks at the end."""

from __future__ import annotations

import torch

from .. import dist

METRIC_NAMES = ("top_1_accuracy", "top_5_accuracy", "loss")


def topk_correct(logits: torch.Tensor, target: torch.Tensor, ks: tuple[int, ...] = (1, 5)) -> list[torch.Tensor]:
    """Number of samples whose label is among the k highest logits, for each k (k capped at #classes)."""
    maxk = min(max(ks), logits.shape[1])
    top = logits.topk(maxk, dim=1).indices
    hit = top == target.unsqueeze(1)
    return [hit[:, : min(k, maxk)].any(dim=1).sum() for k in ks]


class MetricAccumulator:
    """Accumulates loss sum, top-1/top-5 hits and the sample count; `compute()` all-reduces them once."""

    def __init__(self, names: tuple[str, ...] | list[str] | set[str] = METRIC_NAMES) -> None:
        unknown = set(names) - set(METRIC_NAMES)
        if unknown:
            raise ValueError(f"unknown metrics {sorted(unknown)}; choose from {METRIC_NAMES}")
        self.names = [n for n in METRIC_NAMES if n in names]
        self.reset()

    def reset(self) -> None:
        self._sums = torch.zeros(4, dtype=torch.float64)  # loss_sum, top1, top5, count

    @torch.no_grad()
    def update(self, logits: torch.Tensor, target: torch.Tensor, loss_sum: torch.Tensor) -> None:
        c1, c5 = topk_correct(logits, target)
        batch = torch.stack([loss_sum.double(), c1.double(), c5.double(),
                             torch.tensor(float(target.numel()), dtype=torch.float64, device=logits.device)])
        self._sums += batch.cpu()

    def compute(self) -> dict[str, float]:
        sums = dist.all_reduce_sum(self._sums.clone())  # no-op in one process; NCCL-safe device handling
        n = max(sums[3].item(), 1.0)
        values = {"loss": sums[0].item() / n, "top_1_accuracy": sums[1].item() / n,
                  "top_5_accuracy": sums[2].item() / n}
        out = {k: values[k] for k in self.names}
        out["samples"] = int(sums[3].item())
        return out
