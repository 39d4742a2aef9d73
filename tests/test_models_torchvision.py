"""The torchvision-layout zoo (MobileNetV3, EfficientNet-B0, ConvNeXt-Tiny, RegNet) against torchvision's own
model code: tests/fixtures/torchvision_zoo.json holds, from torchvision (scripts/make_zoo_fixtures.py), every
network's state-dict names and shapes in order and its logits for fixed weights and images. Ours must have the
same state dict (so either's weights load strictly into the other) and the same logits; each must also train
a step, and run under THOR."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from torchboost.models import create_model

FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "torchvision_zoo.json").read_text())["models"]


def fixed_weights(state: dict) -> dict:
    """scripts/make_zoo_fixtures.py's rule, written again here: the same tensors from position and name."""
    out = {}
    for k, (name, t) in enumerate(state.items()):
        if not t.is_floating_point():
            out[name] = torch.zeros_like(t)
            continue
        wave = torch.sin(0.37 * torch.arange(t.numel(), dtype=torch.float64) + k).reshape(t.shape)
        if name.endswith("running_var"):
            out[name] = (1.25 + 0.25 * wave).float()
        elif name.endswith("layer_scale"):
            out[name] = torch.full_like(t, 0.5)
        else:
            out[name] = (0.05 * wave).float()
    return out


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


@pytest.mark.parametrize("name", [n for n in FIXTURE if n != "convnext_tiny"] + ["convnext_tiny"])
def test_each_trains_a_step_with_one_channel_and_under_thor(name):
    from torchboost.optim.thor import THOR

    torch.manual_seed(0)
    net = create_model(name, num_classes=4, in_chans=1)
    x, y = torch.randn(4, 1, 32, 32), torch.tensor([0, 1, 2, 3])
    opt = THOR(net, lr=0.01, damping=0.03, frequency=1)
    before = {k: v.clone() for k, v in net.state_dict().items() if v.is_floating_point()}
    loss = torch.nn.functional.cross_entropy(net(x), y)
    loss.backward()
    opt.step()
    after = net.state_dict()
    assert torch.isfinite(loss) and any(not torch.equal(before[k], after[k]) for k in before)
    assert all(torch.isfinite(v).all() for v in after.values() if v.is_floating_point())
