"""THOR on MindSpore 'same'-padded layers (asymmetric padding) against independent float64 references.

The model side pads with torchboost's SamePad2d in front of a valid conv/pool; the reference network is
the same weights with torch's static nn.ZeroPad2d / nn.ConstantPad2d, whose amounts are computed here
from the rule, and its directions come from test_thor_math's dense float64 reference (explicit im2col
loops, numpy inverses). A second test checks the factors THOR captures inside a 'same' ResNet against
F.unfold of an explicitly padded input.
"""

import copy
import math

import torch
import torch.nn.functional as F
from test_thor_math import LAM, reference_directions, rel_err, thor_directions
from torch import nn

from torchboost.models import create_model
from torchboost.models.padding import SamePad2d
from torchboost.optim import THOR


def tf_pads(size: int, k: int, s: int) -> tuple[int, int]:
    total = max((math.ceil(size / s) - 1) * s + k - size, 0)
    return total // 2, total - total // 2


def same_net() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        SamePad2d(7, 2), nn.Conv2d(3, 4, 7, stride=2), nn.ReLU(inplace=True),
        SamePad2d(3, 2), nn.Conv2d(4, 6, 3, stride=2), nn.Tanh(),
        SamePad2d(3, 2, value=-math.inf), nn.MaxPool2d(3, 2),
        nn.Flatten(), nn.Linear(6 * 2 * 2, 5)).double()


def static_reference(net: nn.Sequential, hw: tuple[int, int]) -> nn.Sequential:
    """The same weights with each SamePad2d replaced by a fixed torch pad for input size `hw`."""
    ref, (h, w) = copy.deepcopy(net), hw
    for i, m in enumerate(net):
        if isinstance(m, SamePad2d):
            (t, b), (l, r) = tf_pads(h, m.kernel, m.stride), tf_pads(w, m.kernel, m.stride)
            ref[i] = nn.ZeroPad2d((l, r, t, b)) if m.value == 0 else nn.ConstantPad2d((l, r, t, b), m.value)
            h, w = math.ceil(h / m.stride), math.ceil(w / m.stride)
    return ref


def test_thor_direction_with_asymmetric_same_padding():
    net, hw = same_net(), (12, 9)  # 7x7/2 pads 2/3 on H, 3/3 on W; then 3x3/2 pads 0/1 on H, 1/1 on W
    ref_net = static_reference(net, hw)
    assert isinstance(ref_net[0], nn.ZeroPad2d) and ref_net[0].padding == (3, 3, 2, 3)
    assert ref_net[3].padding == (1, 1, 0, 1)
    x, y = torch.randn(4, 3, *hw, dtype=torch.float64), torch.randint(0, 5, (4,))
    for split_dim in (None, 5):
        ref = reference_directions(ref_net, x, y, LAM, split_dim)
        got = thor_directions(net, x, y, split_dim=split_dim)
        for name in ("1", "4", "9"):
            assert rel_err(got[f"{name}.weight"], ref[name]) < 1e-10, (name, split_dim)


def test_thor_factors_inside_a_same_resnet_see_the_padded_patches():
    torch.manual_seed(0)
    net = create_model("resnet18", num_classes=3, padding="same").double()
    x = torch.randn(2, 3, 20, 18, dtype=torch.float64)
    seen = []
    hook = net.layer2[0].conv1_pad.register_forward_pre_hook(lambda m, i: seen.append(i[0].detach()))
    opt = THOR(net, lr=0.1, damping=LAM, momentum=0.0, frequency=1, split_dim=64)
    F.cross_entropy(net(x), torch.tensor([0, 2])).backward()
    opt.step()
    hook.remove()
    for name, inp, k in (("conv1", x, 7), ("layer2.0.conv1", seen[0], 3)):
        (t, b), (l, r) = tf_pads(inp.shape[2], k, 2), tf_pads(inp.shape[3], k, 2)
        cols = F.unfold(F.pad(inp, (l, r, t, b)), k, stride=2)  # (N, C*k*k, L)
        cols = cols.transpose(0, 1).reshape(cols.shape[1], -1)
        n, layer = cols.shape[0], opt.layers[name]
        blocks = torch.block_diag(*torch.ones(-(-n // 64), 64, 64, dtype=torch.float64))[:n, :n]
        want = cols @ cols.T / cols.shape[1] * blocks  # split_dim=64 keeps the 64x64 diagonal blocks
        torch.testing.assert_close(torch.block_diag(*layer.A[0])[:n, :n], want, rtol=1e-12, atol=1e-12)
        assert layer.T == math.ceil(inp.shape[2] / 2) * math.ceil(inp.shape[3] / 2)
