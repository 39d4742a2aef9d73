"""MobileNetV3-Small and -Large (Howard et al. 2019) in torchvision's layout: `features` (stem, inverted
residual blocks, last 1×1 conv), `avgpool`, `classifier` (Linear, Hardswish, Dropout, Linear); BatchNorm eps
0.001, momentum 0.01; torchvision's init. State dicts of either load strictly into the other."""

from __future__ import annotations

from functools import partial

from torch import Tensor, nn

from torchboost.models.blocks import ConvNormAct, SqueezeExcitation, make_divisible

# (input, kernel, expanded, output, squeeze-excite, activation, stride) per block, torchvision's tables
SMALL = [(16, 3, 16, 16, True, "RE", 2), (16, 3, 72, 24, False, "RE", 2), (24, 3, 88, 24, False, "RE", 1),
         (24, 5, 96, 40, True, "HS", 2), (40, 5, 240, 40, True, "HS", 1), (40, 5, 240, 40, True, "HS", 1),
         (40, 5, 120, 48, True, "HS", 1), (48, 5, 144, 48, True, "HS", 1), (48, 5, 288, 96, True, "HS", 2),
         (96, 5, 576, 96, True, "HS", 1), (96, 5, 576, 96, True, "HS", 1)]
LARGE = [(16, 3, 16, 16, False, "RE", 1), (16, 3, 64, 24, False, "RE", 2), (24, 3, 72, 24, False, "RE", 1),
         (24, 5, 72, 40, True, "RE", 2), (40, 5, 120, 40, True, "RE", 1), (40, 5, 120, 40, True, "RE", 1),
         (40, 3, 240, 80, False, "HS", 2), (80, 3, 200, 80, False, "HS", 1), (80, 3, 184, 80, False, "HS", 1),
         (80, 3, 184, 80, False, "HS", 1), (80, 3, 480, 112, True, "HS", 1), (112, 3, 672, 112, True, "HS", 1),
         (112, 5, 672, 160, True, "HS", 2), (160, 5, 960, 160, True, "HS", 1), (160, 5, 960, 160, True, "HS", 1)]
ARCHS = {"mobilenet_v3_small": (SMALL, 1024), "mobilenet_v3_large": (LARGE, 1280)}


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, kernel: int, expanded: int, cout: int, se: bool, act: str, stride: int,
                 norm: type) -> None:
        super().__init__()
        self.use_res_connect = stride == 1 and cin == cout
        activation = nn.Hardswish if act == "HS" else nn.ReLU
        layers: list[nn.Module] = []
        if expanded != cin:
            layers.append(ConvNormAct(cin, expanded, 1, norm_layer=norm, activation_layer=activation))
        layers.append(ConvNormAct(expanded, expanded, kernel, stride, groups=expanded, norm_layer=norm,
                                  activation_layer=activation))
        if se:
            layers.append(SqueezeExcitation(expanded, make_divisible(expanded // 4, 8),
                                            scale_activation=nn.Hardsigmoid))
        layers.append(ConvNormAct(expanded, cout, 1, norm_layer=norm, activation_layer=None))
        self.block = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        out = self.block(x)
        return out + x if self.use_res_connect else out


class MobileNetV3(nn.Module):
    def __init__(self, name: str, num_classes: int = 1000, in_chans: int = 3, dropout: float = 0.2) -> None:
        super().__init__()
        table, last_channel = ARCHS[name]
        norm = partial(nn.BatchNorm2d, eps=0.001, momentum=0.01)
        layers: list[nn.Module] = [ConvNormAct(in_chans, table[0][0], 3, 2, norm_layer=norm,
                                               activation_layer=nn.Hardswish)]
        layers += [InvertedResidual(*row, norm=norm) for row in table]
        last_in = table[-1][3]
        layers.append(ConvNormAct(last_in, 6 * last_in, 1, norm_layer=norm, activation_layer=nn.Hardswish))
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(nn.Linear(6 * last_in, last_channel), nn.Hardswish(inplace=True),
                                        nn.Dropout(p=dropout, inplace=True), nn.Linear(last_channel, num_classes))
        for m in self.modules():  # torchvision's init
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out")
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, (nn.BatchNorm2d, nn.GroupNorm)):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0, 0.01)
                nn.init.zeros_(m.bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.avgpool(self.features(x)).flatten(1))
