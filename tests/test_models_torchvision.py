"""The torchvision-layout zoo (MobileNetV3, EfficientNet-B0, ConvNeXt-Tiny, RegNet) against torchvision's own
model code: tests/fixtures/torchvision_zoo.json holds, from torchvision (scripts/make_zoo_fixtures.py), every
network's state-dict names and shapes in order and its logits for fixed weights and images. Ours must have the
same state dict (so either's weights load strictly into the other) and the same logits; each must also train
a step, and run under THOR."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from torchboost.models import create_model

FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "torchvision_zoo.json").read_text())["models"]
# the fixture script's weight rule itself (a copy could drift from the rule the fixture was made with)
_spec = importlib.util.spec_from_file_location("make_zoo_fixtures", Path(__file__).parents[1] / "scripts" /
                                               "make_zoo_fixtures.py")
_script = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_script)
fixed_weights = _script.fixed_weights


@pytest.mark.parametrize("name", list(FIXTURE))
def test_same_state_dict_and_logits_as_torchvision(name):
    net = create_model(name, num_classes=10).eval()
    state = net.state_dict()
    assert [[k, list(t.shape)] for k, t in state.items()] == FIXTURE[name]["keys"]
    net.load_state_dict(fixed_weights(state), strict=True)
    x = torch.sin(0.01 * torch.arange(2 * 3 * 64 * 64, dtype=torch.float64)).reshape(2, 3, 64, 64).float()
    with torch.no_grad():
        got = net(x).double()
    want = torch.tensor(FIXTURE[name]["logits"], dtype=torch.float64)
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-5 * want.abs().max().item()), (got - want).abs().max()


# THOR on one network of each kind of layer: depthwise + squeeze-excite + Hardswish (MobileNetV3), SiLU MBConv
# (EfficientNet), grouped 3×3 bottlenecks (RegNetX), LayerNorm and Linear on N×H×W×C (ConvNeXt); the others
# take a plain SGD step (THOR's refresh on every layer of all six would cost a minute of the suite)
THOR_ON = ("mobilenet_v3_small", "efficientnet_b0", "regnet_x_400mf", "convnext_tiny")


@pytest.mark.parametrize("name", list(FIXTURE))
@pytest.mark.slow
def test_each_trains_a_step_with_one_channel_and_under_thor(name):
    from torchboost.optim.thor import THOR

    torch.manual_seed(0)
    net = create_model(name, num_classes=4, in_chans=1)
    x, y = torch.randn(4, 1, 32, 32), torch.tensor([0, 1, 2, 3])
    opt = THOR(net, lr=0.01, damping=0.03, frequency=1) if name in THOR_ON else torch.optim.SGD(net.parameters(), 0.01)
    before = {k: v.clone() for k, v in net.state_dict().items() if v.is_floating_point()}
    loss = torch.nn.functional.cross_entropy(net(x), y)
    loss.backward()
    opt.step()
    after = net.state_dict()
    assert torch.isfinite(loss) and any(not torch.equal(before[k], after[k]) for k in before)
    assert all(torch.isfinite(v).all() for v in after.values() if v.is_floating_point())
