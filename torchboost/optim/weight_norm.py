"""Pinned weight norms (`optim.weight_norm: pin`), for any optimizer: each convolution whose output feeds a
BatchNorm keeps its initial Frobenius norm after every update, and takes no weight decay.

Why: BatchNorm makes such a weight scale-invariant, so only its direction matters, and its norm sets the
effective step (the relative update is lr x |update| / |w|) and, for K-FAC/THOR, the effective damping (which
scales with |w|^2). Left free, the norm drifts with weight decay and the updates themselves; pinning it gives
the lr schedule sole control of the relative step (Osawa et al.'s K-FAC renormalises conv weights; airbench
normalises conv filters every step). Written here: torch has no step hook that does this.
`remove_radial` is the other way to use that invariance (AdamP/SGDP; THOR's `project_radial`): keep the update
tangent to each filter instead of restoring the norm after it.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle


def bn_fed_convs(model: nn.Module) -> list[nn.Conv2d]:
    """Every Conv2d followed, in module order, by a BatchNorm2d over its output channels (conv -> bn, as every
    ResNet and CNN in the zoo declares them)."""
    modules = list(model.modules())
    return [m for m, nxt in zip(modules, modules[1:])
            if isinstance(m, nn.Conv2d) and isinstance(nxt, nn.BatchNorm2d) and nxt.num_features == m.out_channels]


def remove_radial(update: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """`update` less its radial part per output filter, u - (<u, w> / |w|^2) w (AdamP/SGDP's projection, Heo et
    al. 2021, without SGDP's cosine test): the part a BatchNorm-fed filter's loss cannot see, which only changes
    its norm. A zero filter keeps its update."""
    u = update.reshape(update.shape[0], -1)
    w = weight.detach().reshape(weight.shape[0], -1).to(u.dtype)
    radial = (u * w).sum(1, keepdim=True) / (w * w).sum(1, keepdim=True).clamp_min(torch.finfo(u.dtype).tiny)
    return (u - radial * w).reshape(update.shape)


def exempt_from_weight_decay(optimizer: torch.optim.Optimizer, params: list[torch.Tensor]) -> None:
    """Move `params` out of every param group with weight decay into a copy of that group with none."""
    pinned = {id(p) for p in params}
    for group in list(optimizer.param_groups):
        if not group.get("weight_decay"):
            continue
        mine = [p for p in group["params"] if id(p) in pinned]
        if mine:
            group["params"] = [p for p in group["params"] if id(p) not in pinned]
            optimizer.add_param_group({**{k: v for k, v in group.items() if k != "params"}, "params": mine,
                                       "weight_decay": 0.0})
    optimizer.param_groups[:] = [g for g in optimizer.param_groups if g["params"]]


def pin_weight_norms(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[RemovableHandle]:
    """After each `optimizer.step()`, rescale every BatchNorm-fed conv weight back to the norm it had before the
    first step (read then, so weights loaded after this call, a checkpoint's or pretrained ones, are what is
    pinned); those weights take no weight decay (which would only fight the pin)."""
    weights = [c.weight for c in bn_fed_convs(model) if c.weight.requires_grad]
    norms: list[torch.Tensor] = []
    exempt_from_weight_decay(optimizer, weights)

    def read(opt: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        if not norms and weights:
            norms.extend(torch._foreach_norm([w.detach() for w in weights]))

    @torch.no_grad()
    def pin(opt: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        if weights:
            now = torch._foreach_norm(weights)
            torch._foreach_mul_(weights, torch._foreach_div(norms, [n.clamp_min(1e-30) for n in now]))

    return [optimizer.register_step_pre_hook(read), optimizer.register_step_post_hook(pin)]
