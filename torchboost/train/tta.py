"""Test-time augmentation: the network's logits averaged over an image and its horizontal mirror (airbench
and timm's flip TTA), as a module, so the validation of a run, `eval`, `predict` and an exported model all
compute the same thing (an export holds both passes)."""

from __future__ import annotations

from torch import Tensor, nn

TTA_MODES = ("none", "flip")


class FlipTTA(nn.Module):
    """(net(x) + net(x mirrored left-right)) / 2 for N×C×H×W inputs."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: Tensor) -> Tensor:
        return (self.net(x) + self.net(x.flip(-1))) / 2


def with_tta(net: nn.Module, mode: str) -> nn.Module:
    """`net` evaluated as `mode` says: itself for none, FlipTTA for flip."""
    if mode not in TTA_MODES:
        raise ValueError(f"unknown test-time augmentation {mode!r}: use one of {', '.join(TTA_MODES)}")
    return FlipTTA(net) if mode == "flip" else net
