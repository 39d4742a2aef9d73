"""Gradient centralization (Yong et al., 2020), the `gc_flag` part of less_bn.

For each eligible weight, g <- g - mean(g over every dim but the first): each output channel's gradient
gets zero mean, which constrains the weights to a hyperplane and smooths the loss landscape. Eligible:
weights with >= 2 dims, except grouped/depthwise convs and the FN head (MindSpore's rule; BN affine
parameters and biases are 1-D, so they are skipped by the dimension test).

MindSpore centralizes inside the optimizer, after adding weight decay to the gradient; here it runs on the
loss gradient in `on_gradients` (after unscaling, before clipping), and torch optimizers add the decay
afterwards, so the decay term itself is not centralized.
"""

from __future__ import annotations

import torch
from torch import nn

from torchboost.train.hooks import StepHook

from .less_bn import FNHead


def gc_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The trainable parameters gradient centralization applies to (see module docstring)."""
    excluded: set[int] = set()
    for module in model.modules():
        grouped = isinstance(module, nn.modules.conv._ConvNd) and module.groups > 1
        if grouped or isinstance(module, FNHead):
            excluded.update(id(p) for p in module.parameters(recurse=False))
    return [p for p in model.parameters() if p.requires_grad and p.dim() >= 2 and id(p) not in excluded]


class GradCentralization(StepHook):
    """StepHook centralizing the gradients of `params` (parameters without a gradient this step are skipped,
    e.g. the ones grad_freeze froze)."""

    def __init__(self, params: list[nn.Parameter]) -> None:
        self.params = list(params)

    @torch.no_grad()
    def on_gradients(self, model: nn.Module) -> None:
        for p in self.params:
            g = p.grad
            if g is not None:
                g.sub_(g.mean(dim=tuple(range(1, g.dim())), keepdim=True))
