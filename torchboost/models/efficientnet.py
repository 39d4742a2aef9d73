"""EfficientNet-B0 (Tan & Le 2019) in torchvision's layout: `features` (stem, seven stages of MBConv blocks
with squeeze-excitation and stochastic depth, last 1×1 conv), `avgpool`, `classifier` (Dropout, Linear);
torchvision's init. State dicts of either load strictly into the other."""

from __future__ import annotations

import math

from torch import Tensor, nn

from torchboost.models.blocks import ConvNormAct, SqueezeExcitation, StochasticDepth

# (expand ratio, kernel, stride, input, output, layers) per stage: torchvision's efficientnet_b0
B0 = [(1, 3, 1, 32, 16, 1), (6, 3, 2, 16, 24, 2), (6, 5, 2, 24, 40, 2), (6, 3, 2, 40, 80, 3),
      (6, 5, 1, 80, 112, 3), (6, 5, 2, 112, 192, 4), (6, 3, 1, 192, 320, 1)]
ARCHS = {"efficientnet_b0": (B0, 0.2)}


class MBConv(nn.Module):
    def __init__(self, expand: int, kernel: int, stride: int, cin: int, cout: int, drop: float) -> None:
        super().__init__()
        self.use_res_connect = stride == 1 and cin == cout
        wide = cin * expand
        layers: list[nn.Module] = []
        if wide != cin:
            layers.append(ConvNormAct(cin, wide, 1, activation_layer=nn.SiLU))
        layers += [ConvNormAct(wide, wide, kernel, stride, groups=wide, activation_layer=nn.SiLU),
                   SqueezeExcitation(wide, max(1, cin // 4), activation=lambda: nn.SiLU(inplace=True)),
                   ConvNormAct(wide, cout, 1, activation_layer=None)]
        self.block = nn.Sequential(*layers)
        self.stochastic_depth = StochasticDepth(drop)

    def forward(self, x: Tensor) -> Tensor:
        out = self.block(x)
        return self.stochastic_depth(out) + x if self.use_res_connect else out


class EfficientNet(nn.Module):
    def __init__(self, name: str, num_classes: int = 1000, in_chans: int = 3, stochastic_depth_prob: float = 0.2
                 ) -> None:
        super().__init__()
        table, dropout = ARCHS[name]
        layers: list[nn.Module] = [ConvNormAct(in_chans, table[0][3], 3, 2, activation_layer=nn.SiLU)]
        total, index = sum(row[5] for row in table), 0
        for expand, kernel, stride, cin, cout, n in table:
            stage = []
            for i in range(n):  # the probability grows with the block's depth in the network
                stage.append(MBConv(expand, kernel, stride if i == 0 else 1, cin if i == 0 else cout, cout,
                                    stochastic_depth_prob * index / total))
                index += 1
            layers.append(nn.Sequential(*stage))
        last = 4 * table[-1][4]
        layers.append(ConvNormAct(table[-1][4], last, 1, activation_layer=nn.SiLU))
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(nn.Dropout(p=dropout, inplace=True), nn.Linear(last, num_classes))
        for m in self.modules():  # torchvision's init
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out")
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Linear):
                bound = 1.0 / math.sqrt(m.out_features)
                nn.init.uniform_(m.weight, -bound, bound)
                nn.init.zeros_(m.bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.avgpool(self.features(x)).flatten(1))
