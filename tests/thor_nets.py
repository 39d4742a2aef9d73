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


def im2col(x: np.ndarray, conv: nn.Conv2d) -> np.ndarray:
    """Patches (N*Hout*Wout, Cin*kh*kw) by explicit loops, channel-major like the weight."""
    (kh, kw), (sh, sw), (dh, dw) = conv.kernel_size, conv.stride, conv.dilation
    if isinstance(conv.padding, str):  # 'same' with stride 1: total pad d*(k-1), the extra on the right
        tot = [d * (k - 1) for d, k in ((dh, kh), (dw, kw))]
        pads = [(t // 2, t - t // 2) for t in tot]
    else:
        pads = [(p, p) for p in conv.padding]
    mode = {"zeros": "constant", "reflect": "reflect", "replicate": "edge", "circular": "wrap"}[conv.padding_mode]
    xp = np.pad(x, ((0, 0), (0, 0), pads[0], pads[1]), mode=mode)
    ho = (xp.shape[2] - dh * (kh - 1) - 1) // sh + 1
    wo = (xp.shape[3] - dw * (kw - 1) - 1) // sw + 1
    rows = []
    for n in range(x.shape[0]):
        for i in range(ho):
            for j in range(wo):
                patch = xp[n, :, i * sh: i * sh + dh * (kh - 1) + 1: dh, j * sw: j * sw + dw * (kw - 1) + 1: dw]
                rows.append(patch.reshape(-1))
    return np.array(rows)


def direction(A, G, grad, lam):
    s = np.sqrt(lam)
    return np.linalg.inv(G + s * np.eye(len(G))) @ grad @ np.linalg.inv(A + s * np.eye(len(A)))


def dense_factors(net: nn.Sequential, x: torch.Tensor, y: torch.Tensor) -> dict:
    """Per Conv2d/Linear child (groups 1) of a copy of `net`: (A, G, T, weight gradient as out x in), dense
    float64 numpy, the conv's patches from `im2col`'s loops and output gradients from autograd (retain_grad)."""
    net = copy.deepcopy(net)
    h, inputs, outputs = x, {}, {}
    for name, m in net.named_children():
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            inputs[name] = h.detach().numpy()
            h = m(h)
            h.retain_grad()
            outputs[name] = h
        else:
            h = m(h)
    F.cross_entropy(h, y).backward()
    out = {}
    for name, o in outputs.items():
        m = getattr(net, name)
        d = o.grad.numpy() * len(x)  # per-sample gradients of the mean loss
        if isinstance(m, nn.Conv2d):
            a, t = im2col(inputs[name], m), d.shape[2] * d.shape[3]
            d = d.transpose(0, 2, 3, 1).reshape(-1, d.shape[1])
        else:
            a, t = inputs[name], 1
        out[name] = (a.T @ a / len(a), d.T @ d / len(d), t, m.weight.grad.numpy().reshape(len(m.weight), -1))
    return out


def bn_convnet() -> nn.Sequential:
    """A small float32 BatchNorm CNN (two 3x3 convs, the second strided, then a classifier) for THOR's health and
    scale checks: ResNet-20's layer kinds at 8x8."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.Conv2d(8, 16, 3, padding=1, stride=2), nn.BatchNorm2d(16), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))


def image_batch(seed: int = 0, n: int = 32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, 8, 8, generator=g), torch.randint(0, 10, (n,), generator=g)


def run_updates(net: nn.Module, opt: torch.optim.Optimizer, steps: int, loss_mult: float = 1.0) -> None:
    """`steps` cross-entropy updates (x `loss_mult`) on image_batch(0), image_batch(1), ..."""
    for k in range(steps):
        x, y = image_batch(k)
        opt.zero_grad()
        (F.cross_entropy(net(x), y) * loss_mult).backward()
        opt.step()
