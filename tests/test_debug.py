"""Layer statistics and per-group weight decay, against direct torch computations."""

import json

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from torchboost.debug import layer_stats
from torchboost.optim.groups import weight_decay_groups
from torchboost.errors import ConfigError


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 3, padding=1)
        self.bn = nn.BatchNorm2d(6)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(6, 4, 3, padding=1)
        self.relu2 = nn.ReLU()
        self.fc = nn.Linear(4 * 6 * 6, 5)

    def forward(self, x):
        x = self.relu(self.bn(self.conv1(x)))
        x = self.relu2(self.conv2(x))
        return self.fc(torch.flatten(x, 1))


def setup(seed=0):
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(1)
    return Net(), (torch.randn(8, 1, 6, 6, generator=g), torch.randint(0, 5, (8,), generator=g))


def manual_step(net, x, y):
    """Independent forward/backward on a copy, written out with functional ops: (outputs, copy)."""
    ref = Net()
    ref.load_state_dict(net.state_dict())
    c1 = ref.conv1(x)
    b = F.batch_norm(c1, None, None, ref.bn.weight, ref.bn.bias, training=True, eps=ref.bn.eps)
    r1 = F.relu(b)
    c2 = ref.conv2(r1)
    r2 = F.relu(c2)
    out = ref.fc(torch.flatten(r2, 1))
    F.cross_entropy(out, y).backward()
    return {"conv1": c1, "bn": b, "relu": r1, "conv2": c2, "relu2": r2, "fc": out}, ref


def test_stats_match_direct_computation():
    net, (x, y) = setup()
    running_mean = net.bn.running_mean.clone()
    report = layer_stats(net, (x, y))
    outs, ref = manual_step(net, x, y)
    out = outs["fc"]
    rows = {m.call: m for m in report.modules}
    assert list(rows) == ["conv1", "bn", "relu", "conv2", "relu2", "fc"]  # leaves, in execution order
    for name, t in outs.items():
        t = t.detach().double()
        assert rows[name].mean == pytest.approx(t.mean().item(), abs=1e-6), name
        assert rows[name].std == pytest.approx(t.std(correction=0).item(), rel=1e-5), name
        assert rows[name].max_abs == pytest.approx(t.abs().max().item(), rel=1e-5), name
    assert rows["relu"].zero_share == pytest.approx((outs["relu"] == 0).double().mean().item())
    assert rows["conv1"].zero_share is None
    grads = {p.name: p.grad_norm for p in report.params}
    for name, p in ref.named_parameters():
        assert grads[name] == pytest.approx(p.grad.norm().item(), rel=1e-4), name
    assert report.loss == pytest.approx(F.cross_entropy(out, y).item(), rel=1e-6)
    assert not report.flagged
    # the model is left as it was: no gradients, running stats unchanged, train flag kept
    assert all(p.grad is None for p in net.parameters())
    assert torch.equal(net.bn.running_mean, running_mean) and net.training
    json.dumps(report.to_dict())
    assert "conv1" in report.table() and "0 flagged" in report.table()


def test_planted_nan_is_flagged():
    net, batch = setup()
    with torch.no_grad():
        net.conv2.weight[0, 0, 0, 0] = float("nan")
    report = layer_stats(net, batch)
    flagged = dict(report.flagged)
    assert "conv1" not in flagged and "relu" not in flagged  # before the NaN
    assert any(f.startswith("NaN/inf") for f in flagged["conv2"])
    outs, _ = manual_step(net, *batch)
    expected = int((~torch.isfinite(outs["conv2"])).sum())
    assert expected > 0 and next(m.nonfinite for m in report.modules if m.call == "conv2") == expected
    assert any("NaN/inf gradient" in f for f in flagged["fc.weight"])


def test_dead_relu_is_flagged():
    net, batch = setup()
    with torch.no_grad():
        net.conv2.bias.fill_(-100.0)  # every conv2 output negative: relu2 outputs only zeros
    report = layer_stats(net, batch)
    rows = {m.call: m for m in report.modules}
    assert rows["relu2"].zero_share == 1.0 and rows["relu2"].dead_channels == 4
    assert any(f.startswith("dead ReLU") for f in rows["relu2"].flags)
    assert not rows["relu"].flags and rows["relu"].dead_channels == 0
    flags = dict(report.flagged)
    assert "zero gradient" in flags["conv2.weight"] and "zero gradient" in flags["conv1.weight"]


def test_weight_decay_groups_apply_the_configured_decay():
    net, _ = setup()
    groups = weight_decay_groups(net, {"conv2.*": 1e-2, "fc.weight": 0.0}, default=1e-3)
    expected = {"conv1.weight": 1e-3, "conv1.bias": 0.0, "bn.weight": 0.0, "bn.bias": 0.0,  # 1-D exempt
                "conv2.weight": 1e-2, "conv2.bias": 1e-2,  # an explicit pattern wins over the 1-D rule
                "fc.weight": 0.0, "fc.bias": 0.0}
    # behaviour, not bookkeeping: with zero gradients one SGD step multiplies w by (1 - lr * wd)
    before = {n: p.detach().clone() for n, p in net.named_parameters()}
    for p in net.parameters():
        p.grad = torch.zeros_like(p)
    lr = 0.5
    torch.optim.SGD(groups, lr=lr).step()
    for name, p in net.named_parameters():
        assert torch.allclose(p.detach(), before[name] * (1 - lr * expected[name]), atol=1e-7), name
    assert [len(g["params"]) for g in groups if g["name"] == "conv2.*"] == [2]
    no_exempt = weight_decay_groups(net, {"fc.*": 0.0}, default=1e-3, exempt_bn_and_bias=False)
    assert {g["name"]: g["weight_decay"] for g in no_exempt} == {"fc.*": 0.0, "default": 1e-3}


def test_weight_decay_pattern_typo_is_an_error():
    net, _ = setup()
    with pytest.raises(ConfigError, match="layer9"):
        weight_decay_groups(net, {"layer9.*": 1e-4})
