"""ConvNeXt-Tiny (Liu et al. 2022) in torchvision's layout: `features` (4×4 patchify stem with LayerNorm,
stages of blocks — 7×7 depthwise conv, LayerNorm, Linear 4×, GELU, Linear, layer scale, stochastic depth —
and LayerNorm + 2×2 conv downsampling between them), `avgpool`, `classifier` (LayerNorm, Flatten, Linear);
torchvision's init. No BatchNorm: THOR preconditions its convolutions and Linear layers alike."""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from torchboost.models.blocks import ConvNormAct, StochasticDepth

# (channels, channels of the next stage or None, blocks) per stage: torchvision's convnext_tiny
TINY = [(96, 192, 3), (192, 384, 3), (384, 768, 9), (768, None, 3)]
ARCHS = {"convnext_tiny": (TINY, 0.1)}


class LayerNorm2d(nn.LayerNorm):
    """LayerNorm over the channels of an N×C×H×W tensor."""

    def forward(self, x: Tensor) -> Tensor:
        x = F.layer_norm(x.permute(0, 2, 3, 1), self.normalized_shape, self.weight, self.bias, self.eps)
        return x.permute(0, 3, 1, 2)


class Permute(nn.Module):
    def __init__(self, dims: list[int]) -> None:
        super().__init__()
        self.dims = dims

    def forward(self, x: Tensor) -> Tensor:
        return torch.permute(x, self.dims)


class CNBlock(nn.Module):
    def __init__(self, dim: int, layer_scale: float, drop: float) -> None:
        super().__init__()
        self.block = nn.Sequential(nn.Conv2d(dim, dim, 7, padding=3, groups=dim), Permute([0, 2, 3, 1]),
                                   nn.LayerNorm(dim, eps=1e-6), nn.Linear(dim, 4 * dim), nn.GELU(),
                                   nn.Linear(4 * dim, dim), Permute([0, 3, 1, 2]))
        self.layer_scale = nn.Parameter(torch.ones(dim, 1, 1) * layer_scale)
        self.stochastic_depth = StochasticDepth(drop)

    def forward(self, x: Tensor) -> Tensor:
        return self.stochastic_depth(self.layer_scale * self.block(x)) + x


class ConvNeXt(nn.Module):
    def __init__(self, name: str, num_classes: int = 1000, in_chans: int = 3, layer_scale: float = 1e-6) -> None:
        super().__init__()
        table, stochastic_depth_prob = ARCHS[name]
        norm = partial(LayerNorm2d, eps=1e-6)
        layers: list[nn.Module] = [ConvNormAct(in_chans, table[0][0], 4, 4, norm_layer=norm, activation_layer=None,
                                               padding=0, bias=True)]
        total, index = sum(n for _, _, n in table), 0
        for dim, nxt, n in table:
            stage = []
            for _ in range(n):
                stage.append(CNBlock(dim, layer_scale, stochastic_depth_prob * index / (total - 1.0)))
                index += 1
            layers.append(nn.Sequential(*stage))
            if nxt is not None:
                layers.append(nn.Sequential(norm(dim), nn.Conv2d(dim, nxt, 2, 2)))
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        last = table[-1][0]
        self.classifier = nn.Sequential(norm(last), nn.Flatten(1), nn.Linear(last, num_classes))
        for m in self.modules():  # torchvision's init
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                nn.init.trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.avgpool(self.features(x)))
