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
lr 0.05 reach validation losses of 1e6-1e20, ConvNeXt-Tiny a training loss of 16; lr 0.01 learns a colour per
class, not shapes alone.

On shapes alone (grey, 64 px for the networks that downsample by 32) 6 updates an epoch were too few: training
top-1 stayed near chance too. So every network's batch on a folder comes from the count of its training images
(`folder_batch`: 40 updates an epoch, 16 or more for BatchNorm, never above the recipe's 64, which a folder of
2,560 images or more keeps; `recipe.load` counts no further), except where a network names its own (the MNIST
CNN keeps 64: at batch 8 and lr 0.05 it diverged on colours). 25 updates an epoch fixed ResNet-34 and the
MobileNets; the bottleneck ResNets, the RegNets, EfficientNet-B0 and ConvNeXt-Tiny then still stayed near chance
with SGD (0.31-0.47) and learn with AdamW (ResNet-50/101/152 0.96/0.95/1.00, RegNetY 0.79, EfficientNet-B0 0.68,
ConvNeXt-Tiny 0.74 at its batch of 8; RegNetX 0.55, 0.62 at batch 8, which BatchNorm's floor of 16 does not
allow). With a colour per class every network learns (0.73-1.00).
"""

from __future__ import annotations

from typing import Optional, Sequence

from torchboost.recipe.resolve import AIMED_UPDATES, power_of_two, smallest_batch

PRECISE_BN = "train.precise_bn=10"
ADAMW = ("optim.name=adamw", "optim.momentum=null", "optim.lr=0.001", "optim.weight_decay=0.05")
FOLDER_DEFAULTS: dict[str, tuple[str, ...]] = {
    "resnet20": (PRECISE_BN,),
    **{name: (PRECISE_BN, "optim.lr=0.02") for name in ("resnet32", "resnet44", "resnet56", "resnet18", "resnet34")},
    **{name: (PRECISE_BN, *ADAMW, "model.zero_init_last_bn=true") for name in ("resnet50", "resnet101", "resnet152")},
    "mobilenet_v3_small": (PRECISE_BN,), "mobilenet_v3_large": (PRECISE_BN,),
    **{name: (PRECISE_BN, *ADAMW) for name in ("efficientnet_b0", "regnet_y_400mf", "regnet_x_400mf")},
    "convnext_tiny": (*ADAMW, "schedule.lr_init=0.0001"), "mnist_cnn": ("data.batch_size=64",),
    "airbench": (PRECISE_BN,), "airbench_wide": (PRECISE_BN,),
}
_STATS = "BatchNorm's running statistics trail a short run's weights: validation near chance while training learned"
_ADAMW = ("with SGD (lr 0.01) shapes alone stayed near chance in 3 epochs even at 25 updates an epoch (RegNetY 0.31, "
          "RegNetX 0.41, EfficientNet-B0 0.34, ConvNeXt-Tiny 0.45); AdamW with decoupled weight decay 0.05 (ConvNeXt's "
          "recipe) learns")
WHY: dict[str, str] = {
    "resnet20": _STATS,
    **{name: _STATS + "; at lr 0.05 the first epoch blew up (deep, or built for ImageNet)"
       for name in ("resnet32", "resnet44", "resnet56", "resnet18", "resnet34")},
    **{name: _STATS + "; the bottleneck blocks blew up even at lr 0.02 until each block starts as the identity "
       "(its last BatchNorm's scale at 0, as in Goyal et al.'s large-batch recipe); then, at 25 updates an epoch, "
       "shapes alone stayed near chance with SGD (ResNet-50 0.45 at lr 0.02, 0.47 at 0.05) and AdamW with weight "
       "decay 0.05 learns them (0.96)" for name in ("resnet50", "resnet101", "resnet152")},
    "mobilenet_v3_small": _STATS + " (its BatchNorm momentum is 0.01)",
    "mobilenet_v3_large": _STATS + " (its BatchNorm momentum is 0.01)",
    **{name: _STATS + "; at SGD's lr 0.05 validation losses of 1e6-1e20, and " + _ADAMW + " (the default recipe's "
       "half-epoch ramp to lr 0.001 starts above it, at its lr_init 0.005: better than a ramp from 0.0001, RegNetY "
       "0.79 against 0.38)" for name in ("efficientnet_b0", "regnet_y_400mf", "regnet_x_400mf")},
    "convnext_tiny": "LayerNorm, no running statistics; at lr 0.05 training diverged (loss 16 for 4 classes), and "
                     + _ADAMW + ", its ramp from a tenth of the lr as in ConvNeXt's recipe",
    "airbench": _STATS, "airbench_wide": _STATS,
    "mnist_cnn": "the default recipe's own network, no BatchNorm: it keeps the recipe's batch, at whose lr 0.05 a "
                 "folder's batch of 8 diverged on colours (training top-1 0.49, then 0.21)",
}


OPTIMIZER_KEYS = ("optim.", "schedule.")  # what a network's own optimizer comes with
LARGEST_BATCH = 64  # the default recipe's, which a folder of FULL_BATCH_IMAGES or more keeps
FULL_BATCH_IMAGES = AIMED_UPDATES * LARGEST_BATCH
BATCH_WHY = ("the largest power of two with 40 updates an epoch, at least 16 for a BatchNorm network (2 for "
             "others), at most the default recipe's 64: a BatchNorm network gets 16 up to 1,279 training images, 32 "
             "up to 2,559, 64 from 2,560 on")


def folder_batch(images: int, model: str) -> int:
    """The batch `model` gets on a folder of `images` training images (`BATCH_WHY`): at the default recipe's 64 a
    small folder gives too few updates an epoch for a network trained from scratch to learn in its first epochs."""
    return min(LARGEST_BATCH, max(smallest_batch(model), power_of_two(images // AIMED_UPDATES)))


def folder_defaults(model: str, overrides: Sequence[str], images: Optional[int] = None) -> list[str]:
    """`model`'s folder defaults (KEY=VALUE items) for the keys `overrides` does not set: the batch for a folder
    of `images` training images first (none when unknown, the default recipe's or the network's own), then the
    network's own — none of its optimizer's settings when it names an optimizer and the user another."""
    given = {o.partition("=")[0].strip() for o in overrides}
    own = FOLDER_DEFAULTS.get(model, ())
    keeps = images is None or images >= FULL_BATCH_IMAGES or any(item.startswith("data.batch_size=") for item in own)
    batch = [] if keeps else [f"data.batch_size={folder_batch(images, model)}"]
    if "optim.name" in given and any(item.startswith("optim.name=") for item in own):
        own = tuple(item for item in own if not item.startswith(OPTIMIZER_KEYS))  # they were its optimizer's
    return [item for item in batch + list(own) if item.partition("=")[0] not in given]
