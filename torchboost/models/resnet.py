"""ResNet v1.5 (18/34/50/101/152) with torchvision's exact module layout.

State-dict names and shapes match torchvision one-to-one (conv1, bn1, layer1..layer4 of blocks, fc;
blocks: conv1/bn1/conv2/bn2[/conv3/bn3], downsample = Sequential(conv1x1, BN)), so torchvision weights
load with `load_state_dict(strict=True)` and torchboost.migrate's name maps serve both. v1.5 puts the
bottleneck's stride on the 3x3 conv (conv2), as torchvision and the NVIDIA recipe do.

`padding="same"` computes MindSpore's pad_mode='same' (the model-zoo ResNet-50/101/152) instead of
torchvision's symmetric padding (models/padding.py). Only the stride-2 layers with a size-dependent pad
(7x7 stem, stem max-pool, the first 3x3/2 conv of layer2-4) change: each gets a parameter-free
`SamePad2d` sibling (`<conv>_pad`, `maxpool_pad`) run before it, so the state dict is the same for both.
"""

from __future__ import annotations

import torch
from torch import nn

from torchboost.errors import ConfigError
from torchboost.models.init import init_resnet
from torchboost.models.padding import PADDINGS, SamePad2d, is_static_same


def conv_layer(cin: int, cout: int, kernel: int, stride: int = 1, padding: str = "torch"
                 ) -> tuple[nn.Conv2d, SamePad2d | None]:
    """A bias-free kernel x kernel conv and, when 'same' padding depends on the input size, the SamePad2d
    to run before it (the conv is then valid); otherwise (conv with symmetric padding, None)."""
    if padding == "same" and not is_static_same(kernel, stride):
        return nn.Conv2d(cin, cout, kernel, stride=stride, bias=False), SamePad2d(kernel, stride)
    return nn.Conv2d(cin, cout, kernel, stride=stride, padding=kernel // 2, bias=False), None


def _pad(pad: nn.Module | None, x: torch.Tensor) -> torch.Tensor:
    return x if pad is None else pad(x)


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, cin: int, planes: int, stride: int = 1, downsample: nn.Module | None = None,
                 padding: str = "torch") -> None:
        super().__init__()
        self.conv1, self.conv1_pad = conv_layer(cin, planes, 3, stride, padding)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2, _ = conv_layer(planes, planes, 3)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(_pad(self.conv1_pad, x))))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin: int, planes: int, stride: int = 1, downsample: nn.Module | None = None,
                 padding: str = "torch") -> None:
        super().__init__()
        self.conv1, _ = conv_layer(cin, planes, 1)
        self.bn1 = nn.BatchNorm2d(planes)
        # v1.5: the stride sits on the 3x3 conv, not on conv1
        self.conv2, self.conv2_pad = conv_layer(planes, planes, 3, stride, padding)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3, _ = conv_layer(planes, planes * self.expansion, 1)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(_pad(self.conv2_pad, out))))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


class ResNet(nn.Module):
    """ResNet v1.5. `small_input` swaps the 7x7/2 stem + max-pool for a 3x3/1 stem (for 8-64 px images);
    `padding` is "torch" (torchvision's symmetric padding) or "same" (MindSpore's pad_mode='same')."""

    def __init__(self, block: type[BasicBlock] | type[Bottleneck], layers: list[int], num_classes: int = 1000,
                 in_chans: int = 3, zero_init_last_bn: bool = False, init: str = "torchvision",
                 small_input: bool = False, padding: str = "torch") -> None:
        super().__init__()
        if padding not in PADDINGS:
            raise ConfigError(f"unknown ResNet padding {padding!r}", f"use one of {', '.join(PADDINGS)}")
        self.inplanes = 64
        self.conv1, self.conv1_pad = conv_layer(in_chans, 64, *((3, 1) if small_input else (7, 2)),
                                                  padding=padding)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool_pad = None
        if small_input:  # Identity keeps the attribute (and the module layout) while skipping the pooling
            self.maxpool: nn.Module = nn.Identity()
        elif padding == "same":
            self.maxpool, self.maxpool_pad = nn.MaxPool2d(3, stride=2), SamePad2d(3, 2, value=float("-inf"))
        else:
            self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        self.layer1 = self._make_layer(block, 64, layers[0], 1, padding)
        self.layer2 = self._make_layer(block, 128, layers[1], 2, padding)
        self.layer3 = self._make_layer(block, 256, layers[2], 2, padding)
        self.layer4 = self._make_layer(block, 512, layers[3], 2, padding)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512 * block.expansion, num_classes)
        init_resnet(self, scheme=init, zero_init_last_bn=zero_init_last_bn)

    def _make_layer(self, block, planes: int, blocks: int, stride: int, padding: str) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            # a 1x1 conv never pads, 'same' or not
            downsample = nn.Sequential(conv_layer(self.inplanes, planes * block.expansion, 1, stride)[0],
                                       nn.BatchNorm2d(planes * block.expansion))
        layers = [block(self.inplanes, planes, stride, downsample, padding)]
        self.inplanes = planes * block.expansion
        layers += [block(self.inplanes, planes, padding=padding) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.bn1(self.conv1(_pad(self.conv1_pad, x))))
        x = self.maxpool(_pad(self.maxpool_pad, x))
        return self.layer4(self.layer3(self.layer2(self.layer1(x))))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.avgpool(self.forward_features(x)), 1))


# name -> (block, blocks per stage); the same table torchvision uses.
ARCHS: dict[str, tuple[type[BasicBlock] | type[Bottleneck], list[int]]] = {
    "resnet18": (BasicBlock, [2, 2, 2, 2]),
    "resnet34": (BasicBlock, [3, 4, 6, 3]),
    "resnet50": (Bottleneck, [3, 4, 6, 3]),
    "resnet101": (Bottleneck, [3, 4, 23, 3]),
    "resnet152": (Bottleneck, [3, 8, 36, 3]),
}


def resnet(name: str, **kw) -> ResNet:
    block, layers = ARCHS[name]
    return ResNet(block, layers, **kw)
