"""Weight-initialisation schemes, named after the code base they reproduce.

- "torchvision": convs kaiming-normal (fan_out, relu), BN gamma=1 beta=0, Linear keeps PyTorch's default
  (kaiming-uniform a=sqrt(5), bias U(+-1/sqrt(fan_in))) -- exactly what torchvision.models.resnet does.
- "mindspore": what the MindSpore model-zoo ResNet (official/cv/ResNet) ends up with after its
  train-time `init_weight` (configs: conv_init "XavierUniform", dense_init "TruncatedNormal"):
  convs Xavier-uniform (gain 1), Dense weight truncated normal sigma 0.01 cut at +-2 sigma, bias 0,
  BN gamma=1 beta=0 and eps 1e-4. The zoo's BN momentum 0.9 is MindSpore's convention for torch's 0.1,
  PyTorch's default, so nothing changes there. For ResNet-18/34 the zoo builds the stem BN and the
  downsample BN with eps 1e-5 (its `res_base` path), reproduced here. Its pad_mode='same' is a
  different computation, not an init: build with padding="same" (models/padding.py) to reproduce it.
- "paddle" (MNIST CNN): PaddlePaddle's defaults: Conv2D weight N(0, sqrt(2 / fan_in)), Linear weight
  Xavier-uniform, biases 0.
`zero_init_last_bn` zeroes gamma of each residual block's last BN (bn3 / bn2) so every block starts as
the identity (Goyal et al. 2017; the zoo's THOR recipe does the same with `_bn_last`).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from torchboost.errors import ConfigError

RESNET_INITS = ("torchvision", "mindspore")
MNIST_INITS = ("torch", "paddle")


def _init_bn(m: nn.modules.batchnorm._BatchNorm) -> None:
    nn.init.ones_(m.weight)
    nn.init.zeros_(m.bias)


@torch.no_grad()
def init_resnet(model: nn.Module, scheme: str = "torchvision", zero_init_last_bn: bool = False) -> None:
    """Initialise a torchboost ResNet in place with `scheme` (see the module docstring)."""
    if scheme not in RESNET_INITS:
        raise ConfigError(f"unknown ResNet init {scheme!r}", f"use one of {', '.join(RESNET_INITS)}")
    if model.conv1.weight.is_meta:  # a shape-only model (e.g. migrate.names.layout): no values to set, and
        return                      # normal_ on meta tensors takes seconds the first time
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            if scheme == "torchvision":
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            else:
                nn.init.xavier_uniform_(m.weight)
        elif isinstance(m, nn.BatchNorm2d):
            _init_bn(m)
            if scheme == "mindspore":
                m.eps = 1e-4
        elif isinstance(m, nn.Linear) and scheme == "mindspore":
            nn.init.trunc_normal_(m.weight, std=0.01, a=-0.02, b=0.02)
            nn.init.zeros_(m.bias)
    basic = not hasattr(model.layer1[0], "conv3")
    if scheme == "mindspore" and basic:  # zoo ResNet-18/34: res_base BNs keep eps 1e-5
        model.bn1.eps = 1e-5
        for stage in (model.layer1, model.layer2, model.layer3, model.layer4):
            for block in stage:
                if block.downsample is not None:
                    block.downsample[1].eps = 1e-5
    if zero_init_last_bn:
        for stage in (model.layer1, model.layer2, model.layer3, model.layer4):
            for block in stage:
                nn.init.zeros_((block.bn2 if basic else block.bn3).weight)


@torch.no_grad()
def init_mnist_cnn(model: nn.Module, scheme: str = "paddle") -> None:
    """Initialise the MNIST CNN: "torch" keeps PyTorch's defaults, "paddle" applies Paddle's."""
    if scheme not in MNIST_INITS:
        raise ConfigError(f"unknown MNIST CNN init {scheme!r}", f"use one of {', '.join(MNIST_INITS)}")
    if scheme == "torch" or model.conv1.weight.is_meta:  # shape-only model: see init_resnet
        return
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            fan_in = m.in_channels * m.kernel_size[0] * m.kernel_size[1]
            nn.init.normal_(m.weight, 0.0, math.sqrt(2.0 / fan_in))
            nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Linear):
            nn.init.xavier_uniform_(m.weight)
            nn.init.zeros_(m.bias)
