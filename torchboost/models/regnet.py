"""RegNetY-400MF and RegNetX-400MF (Radosavovic et al. 2020) in torchvision's layout: `stem`, `trunk_output`
(stages `block1`…, blocks `block{stage}-{i}` with a 1×1 projection, a grouped 3×3 bottleneck and for Y
squeeze-excitation), `avgpool`, `fc`; widths from torchvision's quantized linear rule; torchvision's init."""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Optional

import torch
from torch import Tensor, nn

from torchboost.models.blocks import ConvNormAct, SqueezeExcitation, make_divisible

# depth, w_0, w_a, w_m, group width, squeeze-excitation ratio: torchvision's regnet_y_400mf / regnet_x_400mf
ARCHS = {"regnet_y_400mf": (16, 48, 27.89, 2.09, 8, 0.25), "regnet_x_400mf": (22, 24, 24.48, 2.54, 16, None)}


def stage_params(depth: int, w_0: int, w_a: float, w_m: float, group: int) -> list[tuple[int, int, int]]:
    """(width, blocks, group width) per stage: block widths w_0 · w_m^round(log(…)/log w_m) quantized to 8,
    runs of equal width made stages, widths made divisible by their group width (torchvision's rule)."""
    # float32, as torchvision computes it (rounding edges included); on the CPU whatever the default device, so
    # a shape-only build (`training_bytes`, on the meta device) gets concrete widths
    cont = torch.arange(depth, device="cpu") * w_a + w_0
    capacity = torch.round(torch.log(cont / w_0) / math.log(w_m))
    widths = (torch.round(torch.divide(w_0 * torch.pow(w_m, capacity), 8)) * 8).int().tolist()
    stages: list[list[int]] = []
    for w in widths:
        if stages and stages[-1][0] == w:
            stages[-1][1] += 1
        else:
            stages.append([w, 1])
    out = []
    for w, n in stages:
        g = min(group, w)
        out.append((int(make_divisible(w, g)), n, g))
    return out


class ResBottleneckBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, group: int, se_ratio: Optional[float]) -> None:
        super().__init__()
        self.proj = ConvNormAct(cin, cout, 1, stride, activation_layer=None) if cin != cout or stride != 1 else None
        f: OrderedDict[str, nn.Module] = OrderedDict()
        f["a"] = ConvNormAct(cin, cout, 1)
        f["b"] = ConvNormAct(cout, cout, 3, stride, groups=cout // group)
        if se_ratio:
            f["se"] = SqueezeExcitation(cout, int(round(se_ratio * cin)))
        f["c"] = ConvNormAct(cout, cout, 1, activation_layer=None)
        self.f = nn.Sequential(f)
        self.activation = nn.ReLU(inplace=True)

    def forward(self, x: Tensor) -> Tensor:
        return self.activation((x if self.proj is None else self.proj(x)) + self.f(x))


class RegNet(nn.Module):
    def __init__(self, name: str, num_classes: int = 1000, in_chans: int = 3, stem_width: int = 32) -> None:
        super().__init__()
        depth, w_0, w_a, w_m, group, se_ratio = ARCHS[name]
        self.stem = ConvNormAct(in_chans, stem_width, 3, 2)
        width, stages = stem_width, []
        for i, (w, n, g) in enumerate(stage_params(depth, w_0, w_a, w_m, group), start=1):
            blocks = nn.Sequential(OrderedDict(
                (f"block{i}-{j}", ResBottleneckBlock(width if j == 0 else w, w, 2 if j == 0 else 1, g, se_ratio))
                for j in range(n)))
            stages.append((f"block{i}", blocks))
            width = w
        self.trunk_output = nn.Sequential(OrderedDict(stages))
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(width, num_classes)
        for m in self.modules():  # torchvision's init
            if isinstance(m, nn.Conv2d):
                fan_out = m.kernel_size[0] * m.kernel_size[1] * m.out_channels
                nn.init.normal_(m.weight, mean=0.0, std=math.sqrt(2.0 / fan_out))
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, mean=0.0, std=0.01)
                nn.init.zeros_(m.bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(self.avgpool(self.trunk_output(self.stem(x))).flatten(1))
