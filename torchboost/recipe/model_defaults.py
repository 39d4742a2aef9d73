"""What a zoo network trains with on a user's own folder when no recipe is named (`train --data DIR [--set
model.name=NAME]`): the default recipe is the MNIST CNN's (SGD lr 0.05, momentum 0.9, batch 64, 15 epochs with a
half-epoch warm-up), which most networks do not survive. Each entry is applied only to keys the user did not
set, and the run's note names it. Every name `create_model` knows has an entry, empty or not, and a reason
(`WHY`); docs/guide/own-folder.md shows the table and tests/test_zoo_defaults.py checks both.

Measured by benchmarks/zoo_defaults.py (BENCHMARKS.md, 2026-11-28): every zoo network, the first 3 epochs of a
default run on generated folders of 4 shape classes (400 training images: 6 updates an epoch at batch 64). At
the old settings the BatchNorm networks fit the training batches while validation stayed at or near chance:
their running statistics, updated once an update with momentum 0.1 (MobileNetV3's 0.01), still hold about half
their initial values after an epoch of 6 updates, and trail weights that move fast. Recomputing them before each
evaluation (`train.precise_bn`, 10 batches) fixes that. The deeper CIFAR ResNets and the ImageNet ResNets also
blew up in the first epoch at lr 0.05 (ResNet-56: training loss 3.6 for 4 classes); lr 0.02 learns, except the
bottleneck ResNets, which need each block to start as the identity as well (`model.zero_init_last_bn`; on the
basic-block ResNets it slowed the first epochs: ResNet-56 0.39 against 0.50). EfficientNet-B0 and the RegNets at
lr 0.05 reach validation losses of 1e6-1e20, ConvNeXt-Tiny a training loss of 16; lr 0.01 learns.
"""

from __future__ import annotations

from typing import Sequence

PRECISE_BN = "train.precise_bn=10"
FOLDER_DEFAULTS: dict[str, tuple[str, ...]] = {
    "resnet20": (PRECISE_BN,),
    **{name: (PRECISE_BN, "optim.lr=0.02") for name in ("resnet32", "resnet44", "resnet56", "resnet18", "resnet34")},
    **{name: (PRECISE_BN, "optim.lr=0.02", "model.zero_init_last_bn=true") for name in ("resnet50", "resnet101",
                                                                                        "resnet152")},
    "mobilenet_v3_small": (PRECISE_BN,), "mobilenet_v3_large": (PRECISE_BN,),
    "efficientnet_b0": (PRECISE_BN, "optim.lr=0.01"),
    "regnet_y_400mf": (PRECISE_BN, "optim.lr=0.01"), "regnet_x_400mf": (PRECISE_BN, "optim.lr=0.01"),
    "convnext_tiny": ("optim.lr=0.01",), "mnist_cnn": (),
}
_STATS = "BatchNorm's running statistics trail a short run's weights: validation near chance while training learned"
WHY: dict[str, str] = {
    "resnet20": _STATS,
    **{name: _STATS + "; at lr 0.05 the first epoch blew up (deep, or built for ImageNet)"
       for name in ("resnet32", "resnet44", "resnet56", "resnet18", "resnet34")},
    **{name: _STATS + "; the bottleneck blocks blew up even at lr 0.02 until each block starts as the identity "
       "(its last BatchNorm's scale at 0, as in Goyal et al.'s large-batch recipe)"
       for name in ("resnet50", "resnet101", "resnet152")},
    "mobilenet_v3_small": _STATS + " (its BatchNorm momentum is 0.01)",
    "mobilenet_v3_large": _STATS + " (its BatchNorm momentum is 0.01)",
    **{name: _STATS + "; at lr 0.05 validation losses of 1e6-1e20"
       for name in ("efficientnet_b0", "regnet_y_400mf", "regnet_x_400mf")},
    "convnext_tiny": "LayerNorm, no running statistics; at lr 0.05 training diverged (loss 16 for 4 classes)",
    "mnist_cnn": "the default recipe's own network, no BatchNorm",
}


def folder_defaults(model: str, overrides: Sequence[str]) -> list[str]:
    """`model`'s folder defaults (KEY=VALUE items) for the keys `overrides` does not set."""
    given = {o.partition("=")[0].strip() for o in overrides}
    return [item for item in FOLDER_DEFAULTS.get(model, ()) if item.partition("=")[0] not in given]
