"""MindSpore pad_mode='same' layers against explicit float64 F.pad + valid conv/pool references, and the
'same' ResNet under channels_last, bf16 autocast and DDP."""

import math

import pytest
import torch
import torch.nn.functional as F

from torchboost.models import create_model
from torchboost.models.padding import SamePad2d, same_padding
from torchboost.models.resnet import conv_layer


def tf_pads(size: int, k: int, s: int) -> tuple[int, int]:
    """Written from the rule: output ceil(size/s), total pad (out-1)*s + k - size (>= 0), odd pixel after."""
    total = max((math.ceil(size / s) - 1) * s + k - size, 0)
    return total // 2, total - total // 2


def test_documented_amounts():
    assert same_padding(224, 7, 2) == (2, 3)  # the zoo stem: torch pads 3 and 3
    assert same_padding(112, 3, 2) == (0, 1) and same_padding(111, 3, 2) == (1, 1)
    assert same_padding(56, 1, 2) == (0, 0) and same_padding(56, 3, 1) == (1, 1)
    assert same_padding(10, 3, 1, dilation=2) == (2, 2)


@pytest.mark.parametrize("kernel", [1, 3, 7])
@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("hw", [(9, 9), (10, 10), (11, 16), (8, 13)])
def test_conv_layer_same_matches_explicit_pad(kernel, stride, hw):
    torch.manual_seed(0)
    conv, pad = conv_layer(3, 4, kernel, stride, padding="same")
    conv = conv.double()
    x = torch.randn(2, 3, *hw, dtype=torch.float64)
    got = conv(x if pad is None else pad(x))
    (t, b), (l, r) = tf_pads(hw[0], kernel, stride), tf_pads(hw[1], kernel, stride)
    want = F.conv2d(F.pad(x, (l, r, t, b)), conv.weight, stride=stride)
    assert got.shape[-2:] == (math.ceil(hw[0] / stride), math.ceil(hw[1] / stride))
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    if stride == 1 or kernel == 1:  # symmetric for every size: a plain padded conv, no extra copy
        assert pad is None and conv.padding == (kernel // 2, kernel // 2)


@pytest.mark.parametrize("hw", [(9, 9), (10, 10), (11, 16)])
def test_maxpool_same_pads_with_minus_infinity(hw):
    x = -torch.rand(2, 3, *hw, dtype=torch.float64) - 1  # all negative: a zero pad would win the max
    got = F.max_pool2d(SamePad2d(3, 2, value=-math.inf)(x), 3, 2)
    (t, b), (l, r) = tf_pads(hw[0], 3, 2), tf_pads(hw[1], 3, 2)
    want = F.max_pool2d(F.pad(x, (l, r, t, b), value=-math.inf), 3, 2)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert got.max() < -1


def test_same_resnet_channels_last_and_bf16_autocast():
    torch.manual_seed(0)
    m = create_model("resnet18", num_classes=4, padding="same").eval()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        ref = m(x)
    m = m.to(memory_format=torch.channels_last)
    seen = []
    m.layer2[0].conv1.register_forward_hook(
        lambda mod, inp, out: seen.append(inp[0].is_contiguous(memory_format=torch.channels_last)))
    xc = x.to(memory_format=torch.channels_last)
    with torch.no_grad():
        torch.testing.assert_close(m(xc), ref, rtol=1e-4, atol=1e-4)
    assert seen == [True]  # the padded tensor stays channels_last
    m.train()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = m(xc)
    assert out.dtype == torch.bfloat16
    out.float().logsumexp(1).sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in m.parameters())


def test_same_resnet_under_ddp_matches_single_process(tmp_path):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    m = create_model("resnet18", num_classes=3, padding="same")
    ref = create_model("resnet18", num_classes=3, padding="same")
    ref.load_state_dict(m.state_dict())
    x, y = torch.randn(2, 3, 32, 32), torch.tensor([0, 2])
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        ddp = DDP(m)
        F.cross_entropy(ddp(x), y).backward()
        F.cross_entropy(ref(x), y).backward()
        for (name, p), q in zip(m.named_parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, msg=name)
    finally:
        dist.destroy_process_group()
