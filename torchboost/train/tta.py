"""Test-time augmentation: the network's logits averaged over views of each image, as a module, so the
validation of a run, `eval`, `predict` and an exported model all compute the same thing (an export holds every
pass). flip: the image and its horizontal mirror (airbench's and timm's flip TTA). flip_translate: airbench's
mirror-translate, half the flip average, half the flip average of the image moved one pixel up-left and one
pixel down-right (reflected at the border): six passes."""

from __future__ import annotations

from torch import Tensor, nn
from torch.nn import functional as F

TTA_MODES = ("none", "flip", "flip_translate")


class FlipTTA(nn.Module):
    """(net(x) + net(x mirrored left-right)) / 2 for N×C×H×W inputs."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: Tensor) -> Tensor:
        return (self.net(x) + self.net(x.flip(-1))) / 2


class FlipTranslateTTA(FlipTTA):
    """airbench's `infer_mirror_translate`: flip(x) / 2 + (flip(x up-left 1 px) + flip(x down-right 1 px)) / 4,
    where flip(v) = FlipTTA's average over v and its mirror and the moved images are cut from x reflect-padded
    by one pixel. Images of at least 2 px (reflection needs a neighbour)."""

    def _flip(self, x: Tensor) -> Tensor:
        return super().forward(x)

    def forward(self, x: Tensor) -> Tensor:
        h, w = x.shape[-2:]
        padded = F.pad(x, (1, 1, 1, 1), mode="reflect")
        moved = (self._flip(padded[..., :h, :w]) + self._flip(padded[..., 2:h + 2, 2:w + 2])) / 2
        return self._flip(x) / 2 + moved / 2


def with_tta(net: nn.Module, mode: str) -> nn.Module:
    """`net` evaluated as `mode` says: itself for none, FlipTTA for flip, FlipTranslateTTA for flip_translate."""
    if mode not in TTA_MODES:
        raise ValueError(f"unknown test-time augmentation {mode!r}: use one of {', '.join(TTA_MODES)}")
    return {"flip": FlipTTA, "flip_translate": FlipTranslateTTA}.get(mode, lambda n: n)(net)
