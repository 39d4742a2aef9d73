"""Model zoo: ResNet v1.5 family (torchvision layout) and the PaddlePaddle MNIST CNN."""

from __future__ import annotations

from torch import nn

from torchboost.errors import ConfigError
from torchboost.models.lenet import MnistCNN
from torchboost.models.resnet import ARCHS, BasicBlock, Bottleneck, ResNet, resnet

__all__ = ["create_model", "list_models", "ResNet", "BasicBlock", "Bottleneck", "MnistCNN"]


def list_models() -> list[str]:
    """Names accepted by `create_model`."""
    return [*ARCHS, "mnist_cnn"]


def create_model(name: str, num_classes: int = 1000, in_chans: int = 3, **kw) -> nn.Module:
    """Build a model by name. ResNets take zero_init_last_bn, init, small_input and padding ("torch" or
    MindSpore's "same"); mnist_cnn takes image_size and init. An unknown name or keyword raises ConfigError."""
    if num_classes < 1 or in_chans < 1:
        raise ConfigError(f"num_classes={num_classes} and in_chans={in_chans} must be >= 1", "fix the model config")
    if name in ARCHS:
        allowed = {"zero_init_last_bn", "init", "small_input", "padding"}
    elif name == "mnist_cnn":
        allowed = {"image_size", "init"}
    else:
        raise ConfigError(f"unknown model {name!r}", f"use one of {', '.join(list_models())}")
    unknown = sorted(set(kw) - allowed)
    if unknown:
        raise ConfigError(f"model {name} does not take {', '.join(unknown)}",
                          f"valid options: {', '.join(sorted(allowed))}")
    if name == "mnist_cnn":
        return MnistCNN(num_classes, in_chans, **kw)
    return resnet(name, num_classes=num_classes, in_chans=in_chans, **kw)
