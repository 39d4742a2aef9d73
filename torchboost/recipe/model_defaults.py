"""What a zoo network trains with on a user's own folder when no recipe is named (`train --data DIR --set
model.name=NAME`): the default recipe is the MNIST CNN's (SGD lr 0.05, momentum 0.9, batch 64), which some
networks do not survive. Each entry is applied only to keys the user did not set, and the run's note names it.

Measured on small generated folders (3 classes of colours, 72-100 images, batch 8-16, 3 epochs;
tests/test_zoo_defaults.py): at the MNIST CNN's settings MobileNetV3, EfficientNet-B0 and the RegNets learn to
fit the training batches while validation stays at chance — their BatchNorm running statistics trail weights
that move fast (MobileNetV3's momentum is 0.01), and EfficientNet-B0 and the RegNets at lr 0.05 reach
validation losses of 1e6-1e20. Recomputing the statistics before each evaluation (`train.precise_bn`) and, for
EfficientNet-B0 and the RegNets, lr 0.01 bring validation well above chance within 3 epochs.
"""

from __future__ import annotations

from typing import Sequence

PRECISE_BN = "train.precise_bn=10"
FOLDER_DEFAULTS: dict[str, tuple[str, ...]] = {
    "mobilenet_v3_small": (PRECISE_BN,), "mobilenet_v3_large": (PRECISE_BN,),
    "efficientnet_b0": (PRECISE_BN, "optim.lr=0.01"),
    "regnet_y_400mf": (PRECISE_BN, "optim.lr=0.01"), "regnet_x_400mf": (PRECISE_BN, "optim.lr=0.01"),
}


def folder_defaults(model: str, overrides: Sequence[str]) -> list[str]:
    """`model`'s folder defaults (KEY=VALUE items) for the keys `overrides` does not set."""
    given = {o.partition("=")[0].strip() for o in overrides}
    return [item for item in FOLDER_DEFAULTS.get(model, ()) if item.partition("=")[0] not in given]
