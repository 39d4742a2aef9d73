"""Tiny float64 problems shared by the THOR tests."""

import torch
import torch.nn.functional as F
from torch import nn


def mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 4)).double()


def batch(seed: int, n: int = 10):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 6, generator=g, dtype=torch.float64), torch.randint(0, 4, (n,), generator=g)


def train_step(net: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> None:
    """One cross-entropy update."""
    opt.zero_grad()
    F.cross_entropy(net(x), y).backward()
    opt.step()
