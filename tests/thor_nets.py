"""Tiny float64 problems shared by the THOR tests, and a dense numpy K-FAC reference."""

import copy

import numpy as np
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


def linear_stats(net: nn.Sequential, x, y):
    """Per Linear (index, A, G, weight grad, bias grad) of a copy of `net` at its current weights."""
    net = copy.deepcopy(net)
    h, acts, outs = x, [], []
    for i, m in enumerate(net):
        if isinstance(m, nn.Linear):
            acts.append((i, h.detach().numpy()))
            h = m(h)
            h.retain_grad()
            outs.append(h)
        else:
            h = m(h)
    F.cross_entropy(h, y).backward()
    n = len(x)
    res = []
    for (i, a), o in zip(acts, outs):
        d = (o.grad * n).numpy()
        res.append((i, a.T @ a / n, d.T @ d / n, net[i].weight.grad.numpy(), net[i].bias.grad.numpy()))
    return res


def direction(A, G, grad, lam):
    s = np.sqrt(lam)
    return np.linalg.inv(G + s * np.eye(len(G))) @ grad @ np.linalg.inv(A + s * np.eye(len(A)))
