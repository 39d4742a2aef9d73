"""CIFAR-style ResNets (He et al. 2016, "Deep Residual Learning", section 4.2): resnet20/32/44/56.

A 3x3 stem with 16 filters, then three stages of n basic blocks each (widths 16/32/64, the first block
of stages 2 and 3 halves the map with stride 2), global average pooling and a linear classifier:
6n + 2 weighted layers. Shortcuts are the paper's option A: parameter-free identities; where a stage
halves the map and doubles the width, the input is subsampled with stride 2 and the new channels are
zeros (appended after the existing ones). The network takes any image size of 8 px or more; it was
designed for 32 px CIFAR images and trains at MNIST's 28 px as is.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from torchboost.errors import ConfigError

# name -> blocks per stage (n); depth = 6n + 2
CIFAR_ARCHS: dict[str, int] = {"resnet20": 3, "resnet32": 5, "resnet44": 7, "resnet56": 9}
WIDTHS = (16, 32, 64)


class ShortcutA(nn.Module):
    """Option A: subsample by `stride` and zero-pad the channels up to `cout` (no parameters)."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.extra, self.stride = cout - cin, stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x[:, :, ::self.stride, ::self.stride]
        return F.pad(x, (0, 0, 0, 0, 0, self.extra))  # pad (W, H, C): zeros after the last channel


class CifarBlock(nn.Module):
    """Two 3x3 conv-BN layers with a ReLU between and after the sum with the option-A shortcut."""

    def __init__(self, cin: int, cout: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = ShortcutA(cin, cout, stride) if stride != 1 or cin != cout else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class CifarResNet(nn.Module):
    """ResNet-(6n+2) for small images. Init: He et al.'s kaiming-normal convs (fan_out, as torchvision),
    BN gamma=1 beta=0, PyTorch's default Linear; `zero_init_last_bn` zeroes each block's bn2 gamma."""

    def __init__(self, n: int, num_classes: int = 10, in_chans: int = 3, zero_init_last_bn: bool = False) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_chans, WIDTHS[0], 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(WIDTHS[0])
        stages, cin = [], WIDTHS[0]
        for i, width in enumerate(WIDTHS):
            blocks = [CifarBlock(cin, width, 1 if i == 0 else 2)]
            blocks += [CifarBlock(width, width) for _ in range(1, n)]
            stages.append(nn.Sequential(*blocks))
            cin = width
        self.layer1, self.layer2, self.layer3 = stages
        self.fc = nn.Linear(WIDTHS[-1], num_classes)
        self._init(zero_init_last_bn)

    @torch.no_grad()
    def _init(self, zero_init_last_bn: bool) -> None:
        if self.conv1.weight.is_meta:  # a shape-only model (training_bytes): no values to set
            return
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        if zero_init_last_bn:
            for stage in (self.layer1, self.layer2, self.layer3):
                for block in stage:
                    nn.init.zeros_(block.bn2.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.bn1(self.conv1(x)))
        x = self.layer3(self.layer2(self.layer1(x)))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def cifar_resnet(name: str, num_classes: int = 10, in_chans: int = 3, zero_init_last_bn: bool = False,
                 init: str = "torchvision", small_input: bool = True, padding: str = "torch") -> CifarResNet:
    """Build resnet20/32/44/56. `small_input` is accepted because recipes pass it to every ResNet: this
    network always has the 3x3 stride-1 stem. Only the torchvision init and symmetric padding exist here."""
    if init != "torchvision" or padding != "torch":
        raise ConfigError(f"{name} has only init=torchvision and padding=torch (got init={init}, padding={padding})",
                          "leave model.init and model.padding unset for the CIFAR ResNets")
    return CifarResNet(CIFAR_ARCHS[name], num_classes, in_chans, zero_init_last_bn)
