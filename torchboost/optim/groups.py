"""Parameter groups: weight decay on conv/linear weights only (the NVIDIA ResNet-50 recipe)."""

from __future__ import annotations

from torch import nn


def param_groups(model: nn.Module, weight_decay: float, decay_bn_and_bias: bool = False) -> list[dict]:
    """Two groups: decayed weights, and BN parameters + biases with weight_decay=0.

    Rule: a parameter with fewer than 2 dimensions is a bias or a normalisation scale/shift. That is
    exactly the set the seed recipe exempts, and it stays right for layers we don't know about.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    if decay_bn_and_bias or weight_decay == 0:
        return [{"params": params, "weight_decay": weight_decay}]
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": weight_decay}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    return groups
