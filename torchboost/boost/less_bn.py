"""less_bn: fewer BatchNorms inside residual blocks and a cosine ("FN") classifier head.

Rule (MindSpore's `less_bn` graph pass, frontend/optimizer/irpass/less_batch_normalization.cc, read for
our module layout): in every residual block, remove each BatchNorm of the main branch EXCEPT the last one,
the BN right before the residual addition. Keep the stem BN and the shortcut (downsample) BN.

    Bottleneck  conv1-[bn1]-relu-conv2-[bn2]-relu-conv3-bn3 (+ shortcut)   -> bn1, bn2 removed (as MindSpore)
    BasicBlock  conv1-[bn1]-relu-conv2-bn2              (+ shortcut)   -> bn1 removed

Why it stays trainable: the kept BN normalises the branch output, and the branch (convs without bias,
ReLU) is positively homogeneous, so the block's output does not depend on the scale of the un-normalised
convs' weights: no activation blow-up, and the residual stream is as well conditioned as before.
MindSpore's patterns only match the 3-conv Bottleneck, so it removes nothing from BasicBlock nets
(ResNet-18/34); we apply the same rule to BasicBlock.

A model with no BatchNorm at all (the MNIST CNN) has nothing to remove: less_bn there is gradient
centralization, and the FN head only if fn_flag is forced true. Default fn_flag "auto" = FN head exactly
where BNs are removed, because on a network with no BN the FN head with MindSpore's multiplier init 1 learns
far slower than gradient centralization alone (BENCHMARKS.md): with no BN before the head the features are
large, the cosine logits start in [-1, 1] and the gradient reaching the features is scaled by
multiplier/|x|. On the BN ResNet the same head learns faster than O0.
A model with BatchNorms but no block of the torchvision layout is refused.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from torchboost.errors import ConfigError

BASIC, BOTTLENECK = ("bn1", "bn2"), ("bn1", "bn2", "bn3")


def block_layout(module: nn.Module) -> tuple[str, ...] | None:
    """The BN names of a residual block of the torchvision layout (a `downsample` attribute and conv1/bn1,
    conv2/bn2[, conv3/bn3]), found by structure so torchvision's and torchboost's blocks both qualify."""
    if not hasattr(module, "downsample") or not hasattr(module, "conv1"):
        return None
    return BOTTLENECK if hasattr(module, "conv3") else BASIC


class FNHead(nn.Module):
    """Cosine classifier: `multiplier * normalize(x) @ normalize(W)^T`, no bias (MindSpore CommonHeadLastFN)."""

    def __init__(self, in_features: int, out_features: int, weight: torch.Tensor | None = None) -> None:
        super().__init__()
        w = torch.empty(out_features, in_features).normal_(0.0, 0.01) if weight is None else weight.detach().clone()
        self.weight = nn.Parameter(w)
        # A learnable temperature: cosines lie in [-1, 1], so the scale must grow for confident predictions.
        self.multiplier = nn.Parameter(torch.ones(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.multiplier * F.linear(F.normalize(x, dim=1), F.normalize(self.weight, dim=1))

    def extra_repr(self) -> str:
        return f"in_features={self.weight.shape[1]}, out_features={self.weight.shape[0]}"


def removable_batchnorms(model: nn.Module) -> list[str]:
    """Qualified names of the BatchNorms the rule removes (all branch BNs but the last of each block)."""
    names = []
    for block_name, block in _residual_blocks(model):
        for bn in block_layout(block)[:-1]:
            names.append(f"{block_name}.{bn}")
    return names


def apply_less_bn(model: nn.Module, fn_flag: bool | str = "auto") -> nn.Module:
    """Remove the rule's BatchNorms (replaced by nn.Identity) and swap the last nn.Linear for an `FNHead`
    initialised with its weight when `fn_flag` is True, or "auto" and BatchNorms were removed. Modifies
    `model` in place and returns it. Call it before the optimizer, EMA copy and DDP wrapper are created:
    parameters change (removed BN affine, new multiplier)."""
    if any(isinstance(m, FNHead) for m in model.modules()):
        raise ConfigError("less_bn was already applied to this model", "apply it once, before creating the optimizer")
    has_bn = any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
    blocks = _residual_blocks(model)
    if has_bn and not blocks:
        raise ConfigError(
            f"less_bn cannot handle {type(model).__name__}: it has BatchNorm layers but no residual block of the "
            "torchvision layout (BasicBlock/Bottleneck with conv1, bn1, conv2, bn2[, conv3, bn3], downsample)",
            "use a torchboost ResNet, or turn less_bn off",
        )
    for block_name, block in blocks:
        for bn in block_layout(block)[:-1]:
            setattr(block, bn, nn.Identity())
    if fn_flag is True or (fn_flag == "auto" and blocks):
        name, linear = _last_linear(model)
        head = FNHead(linear.in_features, linear.out_features, linear.weight)
        _set_submodule(model, name, head.to(linear.weight.device))
    return model


def _residual_blocks(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Blocks of the torchvision layout; a block-named module with another layout is refused, not skipped."""
    found = []
    for name, module in model.named_modules():
        layout = block_layout(module)
        if layout is None:
            continue
        if any(isinstance(getattr(module, b, None), nn.Identity) for b in layout[:-1]):
            raise ConfigError(f"less_bn was already applied to block {name}", "apply it once")
        convs = [f"conv{i + 1}" for i in range(len(layout))]
        ok = hasattr(module, "downsample") and all(
            isinstance(getattr(module, c, None), nn.Conv2d) for c in convs
        ) and all(isinstance(getattr(module, b, None), nn.BatchNorm2d) for b in layout)
        if not ok:
            raise ConfigError(
                f"less_bn cannot handle block {name or type(module).__name__}: expected "
                f"{', '.join(convs + list(layout))} as Conv2d/BatchNorm2d and a downsample attribute",
                "use torchboost's ResNet blocks (torchvision layout), or turn less_bn off",
            )
        found.append((name, module))
    return found


def _last_linear(model: nn.Module) -> tuple[str, nn.Linear]:
    """The classifier: the last nn.Linear registered in the model."""
    linears = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear) and n]
    if not linears:
        raise ConfigError(
            f"less_bn fn_flag needs a final nn.Linear classifier; {type(model).__name__} has none",
            "set boost less_bn.fn_flag false, or give the model a Linear head",
        )
    return linears[-1]


def _set_submodule(model: nn.Module, name: str, module: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, module)
