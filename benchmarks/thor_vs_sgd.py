"""THOR vs momentum SGD: the per-update cost on ResNet-50 (CPU, fp32).

    .venv/bin/python benchmarks/thor_vs_sgd.py            # split_dim 32..512 and whole factors, batch 8
    .venv/bin/python benchmarks/thor_vs_sgd.py --quick    # split_dim 128 only, batch 4

ResNet-50 on a synthetic 224 px batch; SGD and THOR steps alternate on the same model and batch (paired), and
THOR's amortised step is (refresh step + (frequency - 1) * plain step) / frequency.

Time to accuracy is `torchboost race`'s job (BENCHMARKS.md): this script's accuracy part alternated whole runs,
so load on a shared machine hit one optimizer's run and not the other's; the race interleaves epoch by epoch,
selects on a validation split and confirms on fresh seeds.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

from torchboost.models import create_model
from torchboost.optim.thor import THOR


def _timed_step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> float:
    start = time.perf_counter()
    loss = F.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return time.perf_counter() - start


def step_cost(batch: int, splits: list[int | None], steps: int, frequency: int = 100) -> float:
    """Print the ResNet-50 per-update cost table; return the THOR/SGD ratio at split_dim=128.

    SGD and THOR steps alternate on the same model and batch (paired), so load changes on a shared machine
    hit both; THOR's hooks stay idle during the SGD steps (they only record on refresh steps)."""
    torch.manual_seed(0)
    model = create_model("resnet50", num_classes=1000)
    x, y = torch.randn(batch, 3, 224, 224), torch.randint(0, 1000, (batch,))
    sgd = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9)
    _timed_step(model, sgd, x, y)  # warm-up: allocator, kernels
    print(f"\nResNet-50, synthetic {batch}x3x224x224, CPU fp32, {torch.get_num_threads()} thread(s); "
          f"THOR frequency {frequency}, median of {steps} paired steps")
    print(f"{'THOR split_dim':<15} {'SGD s':>7} {'THOR plain s':>13} {'THOR refresh s':>15} {'amortised s':>12} "
          f"{'THOR/SGD':>9}")
    ratio_128 = float("nan")
    for split in splits:
        opt = THOR(model, lr=1e-4, damping=0.03, frequency=frequency, split_dim=split)
        refresh = _timed_step(model, opt, x, y)
        sgd_t, plain = [], []
        for _ in range(steps):
            sgd_t.append(_timed_step(model, sgd, x, y))
            plain.append(_timed_step(model, opt, x, y))
        opt.remove_hooks()
        s, p = statistics.median(sgd_t), statistics.median(plain)
        amortised = (refresh + (frequency - 1) * p) / frequency
        ratio = amortised / s
        ratio_128 = ratio if split == 128 else ratio_128
        print(f"{str(split):<15} {s:>7.2f} {p:>13.2f} {refresh:>15.2f} {amortised:>12.2f} {ratio:>9.2f}", flush=True)
    return ratio_128


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="split_dim 128 only, batch 4, 3 paired steps")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads (1 avoids OpenMP oversubscription on a shared machine)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    splits = [128] if args.quick else [32, 64, 128, 256, 512, None]
    ratio = step_cost(batch=4 if args.quick else 8, splits=splits, steps=3 if args.quick else 5)
    print(f"\nheadline THOR/SGD: ResNet-50 step cost {ratio:.2f}x")


if __name__ == "__main__":
    main()
