"""MindSpore/TensorFlow `pad_mode='same'` for convolutions and max-pooling.

'same' makes the output size ceil(in / stride) and pads the total
max((out - 1) * stride + (k - 1) * dilation + 1 - in, 0): total // 2 before, the rest after. For stride 1
and an odd kernel that is k // 2 on both sides whatever the input size, which a plain nn.Conv2d `padding`
computes without a copy. For stride > 1 it depends on the input size (a 3x3/2 conv pads 0/1 on even sizes,
1/1 on odd ones), so it is computed per call by `SamePad2d`, a module placed in front of a valid
(padding 0) conv or pool. Keeping the pad outside the conv module means the conv sees the padded input:
hooks on it (THOR's Kronecker factors, activation recording) get exactly the patches it convolves.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

PADDINGS = ("torch", "same")


def same_padding(size: int, kernel: int, stride: int = 1, dilation: int = 1) -> tuple[int, int]:
    """(before, after) padding of one spatial dimension under pad_mode='same'."""
    out = -(-size // stride)
    total = max((out - 1) * stride + (kernel - 1) * dilation + 1 - size, 0)
    return total // 2, total - total // 2


def is_static_same(kernel: int, stride: int, dilation: int = 1) -> bool:
    """True when 'same' padding is symmetric for every input size (stride 1 with an odd receptive field,
    or a 1x1 kernel, which never pads): then a plain conv `padding` reproduces it."""
    return kernel == 1 or (stride == 1 and (kernel - 1) * dilation % 2 == 0)


class SamePad2d(nn.Module):
    """Pad (N, C, H, W) as 'same' for a following valid `kernel`/`stride`/`dilation` conv or pool.

    `value` is the fill: 0 for convolutions, -inf for max-pooling (padding never wins the max).
    """

    def __init__(self, kernel: int, stride: int, dilation: int = 1, value: float = 0.0) -> None:
        super().__init__()
        self.kernel, self.stride, self.dilation, self.value = kernel, stride, dilation, value

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        top, bottom = same_padding(x.shape[-2], self.kernel, self.stride, self.dilation)
        left, right = same_padding(x.shape[-1], self.kernel, self.stride, self.dilation)
        if top == bottom == left == right == 0:
            return x
        return F.pad(x, (left, right, top, bottom), value=self.value)

    def extra_repr(self) -> str:
        return f"kernel={self.kernel}, stride={self.stride}, dilation={self.dilation}, value={self.value}"
