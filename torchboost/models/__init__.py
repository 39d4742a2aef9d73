"""Model zoo: ResNet v1.5 family, MobileNetV3, EfficientNet-B0, ConvNeXt-Tiny and RegNet (torchvision's
layouts), CIFAR-style ResNet-20/32/44/56, the PaddlePaddle MNIST CNN and airbench's speedrun network."""

from __future__ import annotations

import torch
from torch import nn

from torchboost.errors import ConfigError
from torchboost.models.airbench import ARCHS as AIRBENCH, SMALLEST as AIRBENCH_SMALLEST, AirbenchNet
from torchboost.models.cifar_resnet import CIFAR_ARCHS, CifarResNet, cifar_resnet
from torchboost.models.convnext import ARCHS as CONVNEXT, ConvNeXt
from torchboost.models.efficientnet import ARCHS as EFFICIENTNET, EfficientNet
from torchboost.models.lenet import MnistCNN
from torchboost.models.mobilenetv3 import ARCHS as MOBILENET, MobileNetV3
from torchboost.models.regnet import ARCHS as REGNET, RegNet
from torchboost.models.resnet import ARCHS, BasicBlock, Bottleneck, ResNet, resnet

# torchvision-layout networks built by name: class per family (their only options: classes and channels)
TORCHVISION = {**{n: MobileNetV3 for n in MOBILENET}, **{n: EfficientNet for n in EFFICIENTNET},
               **{n: ConvNeXt for n in CONVNEXT}, **{n: RegNet for n in REGNET}}
NAMED = {**TORCHVISION, **{n: AirbenchNet for n in AIRBENCH}}  # built from their name alone

__all__ = ["create_model", "list_models", "training_bytes", "has_batchnorm", "smallest_input", "ResNet", "BasicBlock",
           "Bottleneck", "MnistCNN", "CifarResNet", "AirbenchNet", "MobileNetV3", "EfficientNet", "ConvNeXt", "RegNet"]


def list_models() -> list[str]:
    """Names accepted by `create_model`."""
    return [*ARCHS, *CIFAR_ARCHS, *TORCHVISION, "mnist_cnn", *AIRBENCH]


NO_BATCHNORM = ("mnist_cnn", "convnext_tiny")  # LayerNorm or no normalisation (tests/test_zoo_generator.py checks)


# px: ConvNeXt's 4x4/4 stem and three 2x2/2 downsamplings, unpadded, leave 1 px at 32; airbench's 2x2 stem and three
# max-pools leave 1 px at 16
SMALLEST_INPUT = {"convnext_tiny": 32, **{n: AIRBENCH_SMALLEST for n in AIRBENCH}}


def smallest_input(name: str) -> int:
    """The smallest image side (px) the zoo network `name` runs on (the others pad their strided convolutions)."""
    return SMALLEST_INPUT.get(name, 1)


def has_batchnorm(name: str) -> bool:
    """Whether the zoo network `name` normalises with BatchNorm (train-mode batch statistics, running
    averages for evaluation), without building it."""
    return name not in NO_BATCHNORM


def create_model(name: str, num_classes: int = 1000, in_chans: int = 3, **kw) -> nn.Module:
    """Build a model by name. ResNets take zero_init_last_bn, init, small_input and padding ("torch" or
    MindSpore's "same"); resnet20/32/44/56 (CIFAR-style) take the same keys but only the defaults of init and
    padding; mnist_cnn takes image_size and init. An unknown name or keyword raises ConfigError."""
    if num_classes < 1 or in_chans < 1:
        raise ConfigError(f"num_classes={num_classes} and in_chans={in_chans} must be >= 1", "fix the model config")
    if name in ARCHS or name in CIFAR_ARCHS:
        allowed = {"zero_init_last_bn", "init", "small_input", "padding"}
    elif name == "mnist_cnn":
        allowed = {"image_size", "init"}
    elif name in NAMED:
        allowed = set()
    else:
        raise ConfigError(f"unknown model {name!r}", f"use one of {', '.join(list_models())}")
    unknown = sorted(set(kw) - allowed)
    if unknown:
        raise ConfigError(f"model {name} does not take {', '.join(unknown)}",
                          f"valid options: {', '.join(sorted(allowed))}")
    if name == "mnist_cnn":
        return MnistCNN(num_classes, in_chans, **kw)
    if name in CIFAR_ARCHS:
        return cifar_resnet(name, num_classes=num_classes, in_chans=in_chans, **kw)
    if name in NAMED:
        return NAMED[name](name, num_classes=num_classes, in_chans=in_chans)
    return resnet(name, num_classes=num_classes, in_chans=in_chans, **kw)


def training_bytes(name: str, num_classes: int = 1000, in_chans: int = 3, **kw) -> int:
    """Bytes the model's training state takes (weights, gradients, two optimizer states), from a shape-only
    build on the meta device: no memory, no init cost. The MNIST CNN's classifier grows with the image size
    (2048 px would need a 20 GB Linear), so a size is checked with this before the model is built."""
    with torch.device("meta"):
        probe = create_model(name, num_classes=num_classes, in_chans=in_chans, **kw)
    return 4 * sum(p.numel() * p.element_size() for p in probe.parameters())
