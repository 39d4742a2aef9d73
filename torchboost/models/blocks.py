"""Building blocks of the torchvision-layout networks (MobileNetV3, EfficientNet, RegNet, ConvNeXt): the same
module names and order as torchvision's `ops.misc` (Conv2dNormActivation, SqueezeExcitation) and
`ops.StochasticDepth`, so their state dicts load into ours strictly. Written here because torchvision cannot
be imported beside the CPU torch this project pins."""

from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import Tensor, nn


def make_divisible(v: float, divisor: int, min_value: Optional[int] = None) -> int:
    """`v` rounded to a multiple of `divisor`, never below `min_value` (default: divisor) nor 10% below `v`
    (the TF MobileNet rule torchvision keeps)."""
    min_value = divisor if min_value is None else min_value
    new_v = max(min_value, int(v + divisor / 2) // divisor * divisor)
    return new_v + divisor if new_v < 0.9 * v else new_v


class ConvNormAct(nn.Sequential):
    """conv (no bias when normalised) -> norm -> activation, modules named 0, 1, 2 (torchvision's
    Conv2dNormActivation); padding keeps the size at stride 1: (k - 1) // 2 × dilation unless given."""

    def __init__(self, cin: int, cout: int, kernel_size: int = 3, stride: int = 1, groups: int = 1,
                 norm_layer: Optional[Callable[..., nn.Module]] = nn.BatchNorm2d,
                 activation_layer: Optional[Callable[..., nn.Module]] = nn.ReLU, dilation: int = 1,
                 padding: Optional[int] = None, bias: Optional[bool] = None) -> None:
        padding = (kernel_size - 1) // 2 * dilation if padding is None else padding
        bias = norm_layer is None if bias is None else bias
        layers: list[nn.Module] = [nn.Conv2d(cin, cout, kernel_size, stride, padding, dilation=dilation,
                                             groups=groups, bias=bias)]
        if norm_layer is not None:
            layers.append(norm_layer(cout))
        if activation_layer is not None:
            layers.append(activation_layer(inplace=True) if activation_layer is not nn.GELU else activation_layer())
        super().__init__(*layers)


class SqueezeExcitation(nn.Module):
    """x × σ(fc2(δ(fc1(avgpool(x))))) with 1×1 convolutions fc1, fc2 (torchvision's names)."""

    def __init__(self, channels: int, squeeze: int, activation: Callable[..., nn.Module] = nn.ReLU,
                 scale_activation: Callable[..., nn.Module] = nn.Sigmoid) -> None:
        super().__init__()
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Conv2d(channels, squeeze, 1)
        self.fc2 = nn.Conv2d(squeeze, channels, 1)
        self.activation = activation()
        self.scale_activation = scale_activation()

    def forward(self, x: Tensor) -> Tensor:
        return self.scale_activation(self.fc2(self.activation(self.fc1(self.avgpool(x))))) * x


class StochasticDepth(nn.Module):
    """Drops a residual branch per sample with probability p while training, scaling the kept ones by
    1 / (1 - p) (torchvision's "row" mode); the identity in evaluation."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0.0:
            return x
        keep = 1.0 - self.p
        noise = torch.empty([x.shape[0]] + [1] * (x.ndim - 1), dtype=x.dtype, device=x.device).bernoulli_(keep)
        return x * noise.div_(keep)
