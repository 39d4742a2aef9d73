"""Pinned weight norms (optim.weight_norm=pin): which weights, the update against a float64 formula, every
optimizer of the registry, weight decay taken off only those weights, and the recipe path."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from torchboost.models import create_model
from torchboost.optim.registry import OPTIMIZERS, OptimizerArgs, build_optimizer
from torchboost.optim.weight_norm import bn_fed_convs, pin_weight_norms


def _resnet() -> nn.Module:
    torch.manual_seed(0)
    return create_model("resnet20", num_classes=10, in_chans=1)


def _step(net, opt, seed):
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(8, 1, 16, 16, generator=g), torch.randint(0, 10, (8,), generator=g)
    opt.zero_grad()
    nn.functional.cross_entropy(net(x), y).backward()
    opt.step()


def test_every_conv_that_feeds_a_batchnorm_is_found():
    net = _resnet()
    convs = bn_fed_convs(net)
    assert len(convs) == sum(isinstance(m, nn.BatchNorm2d) for m in net.modules()) == 19  # identity shortcuts
    r18 = create_model("resnet18", num_classes=10)
    assert len(bn_fed_convs(r18)) == sum(isinstance(m, nn.BatchNorm2d) for m in r18.modules()) == 17 + 3  # downsample
    assert all(isinstance(c, nn.Conv2d) for c in convs)
    assert bn_fed_convs(nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.BatchNorm2d(4))) == []  # not its output


def test_pinned_sgd_matches_the_float64_formula():
    """w <- |w0| (w - lr (m)) / |w - lr m| with m = mu m + g (no weight decay on w), the rest plain SGD."""
    net = _resnet().double()
    ref = copy.deepcopy(net)
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-2)
    pin_weight_norms(net, opt)
    pinned = {id(c.weight) for c in bn_fed_convs(ref)}
    n0 = {id(p): p.detach().norm() for p in ref.parameters() if id(p) in pinned}
    m = {}
    for k in range(3):
        g = torch.Generator().manual_seed(k)
        x, y = torch.randn(8, 1, 16, 16, generator=g).double(), torch.randint(0, 10, (8,), generator=g)
        for model in (net, ref):
            model.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        with torch.no_grad():
            for p in ref.parameters():
                d = p.grad + (0.0 if id(p) in pinned else 1e-2) * p
                m[id(p)] = d.clone() if id(p) not in m else 0.9 * m[id(p)] + d
                p -= 0.1 * m[id(p)]
                if id(p) in pinned:
                    p *= n0[id(p)] / p.norm()
    for p, q in zip(net.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_every_optimizer_keeps_the_pinned_norms_and_decays_only_the_rest(name):
    net = _resnet()
    opt = build_optimizer(name, net, OptimizerArgs(lr=0.01, weight_decay=5e-4))
    pin_weight_norms(net, opt)
    pinned = [c.weight for c in bn_fed_convs(net)]
    before = [w.detach().norm().item() for w in pinned]
    for k in range(3):
        _step(net, opt, k)
    assert [w.detach().norm().item() for w in pinned] == pytest.approx(before, rel=1e-5)
    ids = {id(w) for w in pinned}
    for group in opt.param_groups:
        if any(id(p) in ids for p in group["params"]):
            assert group.get("weight_decay", 0.0) == 0.0
    assert sorted(id(p) for g in opt.param_groups for p in g["params"]) == \
        sorted(id(p) for p in net.parameters() if p.requires_grad)  # every parameter still in exactly one group
    assert any(id(w) not in ids for w in pinned) is False and any(torch.any(w.grad != 0) for w in pinned)


@pytest.mark.slow
def test_the_recipe_pins_for_any_optimizer_and_resumes(tmp_path):
    from torchboost.cli import main

    out = tmp_path / "r"
    args = ["train", "-c", "digits-lenet", "--set", "train.progress_bar=false", "--set", "optim.weight_norm=pin",
            "--set", "model.name=resnet20", "--set", "data.batch_size=64", "-o", str(out)]
    assert main([*args, "--epochs", "1"]) == 0
    assert main(["train", "--force", "--resume", str(out), "--epochs", "2", "--set", "train.progress_bar=false"]) == 0
    (ckpt,) = (out / "ckpt").glob("*-2_*.pt")
    state = torch.load(ckpt, weights_only=True)["model"]
    net = _resnet()
    convs = {id(c): n for n, c in net.named_modules()}
    first = torch.load(next((out / "ckpt").glob("*-1_*.pt")), weights_only=True)["model"]
    for c in bn_fed_convs(net):
        key = f"{convs[id(c)]}.weight"
        assert state[key].norm().item() == pytest.approx(first[key].norm().item(), rel=1e-5)
