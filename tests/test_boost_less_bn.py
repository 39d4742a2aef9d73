"""less_bn: the documented BN-removal rule, the cosine FN head, gradient centralization."""

import pytest
import torch
from torch import nn

from torchboost.boost import FNHead, GradCentralization, apply_less_bn, gc_parameters, removable_batchnorms
from torchboost.errors import ConfigError
from torchboost.models import create_model
from torchboost.models.resnet import Bottleneck, ResNet

pytestmark = pytest.mark.usefixtures("one_thread")



def _bn_names(model):
    return {n for n, m in model.named_modules() if isinstance(m, nn.BatchNorm2d)}


def test_basic_block_resnet_loses_bn1_of_every_block():
    model = create_model("resnet18", num_classes=10, in_chans=1, small_input=True)
    before = _bn_names(model)
    expected = {f"layer{s}.{b}.bn1" for s in range(1, 5) for b in range(2)}
    assert set(removable_batchnorms(model)) == expected
    apply_less_bn(model)
    assert before - _bn_names(model) == expected
    assert all(isinstance(model.get_submodule(n), nn.Identity) for n in expected)
    # kept: the stem BN, each block's last BN and the shortcut BNs
    assert "bn1" in _bn_names(model) and "layer3.0.downsample.1" in _bn_names(model)
    assert "layer1.0.bn2" in _bn_names(model)


def test_bottleneck_loses_bn1_and_bn2_keeps_bn3():
    model = ResNet(Bottleneck, [1, 2, 1, 1], num_classes=10, in_chans=1, small_input=True)
    blocks = ["layer1.0", "layer2.0", "layer2.1", "layer3.0", "layer4.0"]
    apply_less_bn(model)
    for b in blocks:
        assert isinstance(model.get_submodule(f"{b}.bn1"), nn.Identity)
        assert isinstance(model.get_submodule(f"{b}.bn2"), nn.Identity)
        assert isinstance(model.get_submodule(f"{b}.bn3"), nn.BatchNorm2d)
    out = model(torch.randn(2, 1, 8, 8))
    assert out.shape == (2, 10) and torch.isfinite(out).all()


def test_fn_head_computes_scaled_cosine():
    model = create_model("mnist_cnn", image_size=8)
    old_w = model.fc.weight.detach().clone()
    apply_less_bn(model, fn_flag=True)
    head = model.fc
    assert isinstance(head, FNHead) and not hasattr(head, "bias")
    assert torch.equal(head.weight, old_w) and head.multiplier.item() == 1.0
    with torch.no_grad():
        head.multiplier.fill_(3.5)
    x = torch.randn(5, old_w.shape[1], dtype=torch.float64)
    w = old_w.double()
    ref = 3.5 * (x / x.norm(dim=1, keepdim=True)) @ (w / w.norm(dim=1, keepdim=True)).T
    torch.testing.assert_close(head(x.float()).double(), ref, rtol=1e-5, atol=1e-5)


def test_fn_flag_auto_puts_the_head_where_bns_were_removed():
    cnn = apply_less_bn(create_model("mnist_cnn", num_classes=10, in_chans=1))  # no BN: nothing removed
    assert type(cnn.fc) is nn.Linear and isinstance(cnn.conv1, nn.Conv2d) and isinstance(cnn.conv2, nn.Conv2d)
    assert isinstance(apply_less_bn(create_model("resnet18", num_classes=10)).fc, FNHead)
    assert type(apply_less_bn(create_model("resnet18", num_classes=10), fn_flag=False).fc) is nn.Linear


class _PlainBN(nn.Sequential):
    def __init__(self):
        super().__init__(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.LazyLinear(3))


class BasicBlock(nn.Module):  # named like torchboost's block but with another layout (pre-activation)
    def __init__(self):
        super().__init__()
        self.bn1, self.conv1 = nn.BatchNorm2d(4), nn.Conv2d(4, 4, 3)


def test_refuses_models_it_cannot_handle():
    with pytest.raises(ConfigError, match="no residual block"):
        apply_less_bn(_PlainBN())
    with pytest.raises(ConfigError, match="block"):
        apply_less_bn(nn.Sequential(BasicBlock(), nn.Flatten(), nn.Linear(4, 2)))
    with pytest.raises(ConfigError, match="nn.Linear"):
        apply_less_bn(nn.Sequential(nn.Conv2d(1, 2, 3)), fn_flag=True)
    model = apply_less_bn(create_model("resnet18", num_classes=10), fn_flag=False)
    with pytest.raises(ConfigError, match="already"):
        apply_less_bn(model)


def test_gc_parameters_rule():
    # >= 2-dim weights only (no BN, no biases), not the grouped conv, not the FN head
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.Conv2d(4, 4, 3, groups=2),
                          nn.Flatten(), nn.Linear(4, 8), FNHead(8, 3))
    chosen = {id(p) for p in gc_parameters(model)}
    assert chosen == {id(model[0].weight), id(model[4].weight)}


def test_gc_hook_centralizes_per_output_channel():
    model = create_model("resnet18", num_classes=10, in_chans=1, small_input=True)
    apply_less_bn(model)
    model(torch.randn(4, 1, 8, 8)).logsumexp(1).sum().backward()
    params = gc_parameters(model)
    before = {id(p): p.grad.double().clone() for p in model.parameters()}
    model.layer1[0].conv1.weight.grad = None  # e.g. frozen this step: skipped
    GradCentralization(params).on_gradients(model)
    for p in model.parameters():
        if p is model.layer1[0].conv1.weight:
            assert p.grad is None
        elif any(p is q for q in params):
            g = before[id(p)]
            ref = g - g.mean(dim=tuple(range(1, g.dim())), keepdim=True)
            torch.testing.assert_close(p.grad.double(), ref, rtol=1e-5, atol=1e-7)
            assert p.grad.double().mean(dim=tuple(range(1, g.dim()))).abs().max() < 1e-6
        else:  # BN, multiplier, FN weight: untouched
            assert torch.equal(p.grad.double(), before[id(p)])
