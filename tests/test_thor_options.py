"""THOR's state: exact resume from a state dict, a state saved before THOR's options were pruned still loads,
and a state saved with another split_dim is refused."""

import copy
import io

import numpy as np
import pytest
import torch
from torch import nn

from torchboost.errors import CheckpointError
from torchboost.optim.thor import THOR
from thor_nets import batch, mlp, train_step

LAM = 0.1


@pytest.mark.parametrize("split_dim", [None, 3])
def test_state_dict_resume_is_exact(split_dim):
    def make():
        torch.manual_seed(0)
        net = nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(inplace=True),
                            nn.Flatten(), nn.Linear(4 * 25, 3))
        lr = np.linspace(0.2, 0.05, 7).astype(np.float32)
        opt = THOR(net, lr=lr, damping=lambda k: 0.2 * 0.9 ** k, weight_decay=1e-3, frequency=2,
                   split_dim=split_dim)
        return net, opt

    def data(k):
        g = torch.Generator().manual_seed(k)
        return torch.randn(6, 2, 5, 5, generator=g), torch.randint(0, 3, (6,), generator=g)

    full_net, full_opt = make()
    for k in range(7):
        train_step(full_net, full_opt, *data(k))

    net, opt = make()
    for k in range(3):
        train_step(net, opt, *data(k))
    buf = io.BytesIO()
    torch.save({"model": net.state_dict(), "opt": opt.state_dict()}, buf)
    buf.seek(0)
    ckpt = torch.load(buf, weights_only=True)
    net2, opt2 = make()
    net2.load_state_dict(ckpt["model"])
    opt2.load_state_dict(ckpt["opt"])
    assert opt2.update_index == 3 and opt2.counters == opt.counters
    for k in range(3, 7):
        train_step(net2, opt2, *data(k))
    for p, q in zip(net2.state_dict().values(), full_net.state_dict().values()):
        assert torch.equal(p, q)
    assert opt2.counters == full_opt.counters


def test_loading_state_saved_with_another_split_dim_is_refused():
    net = mlp()
    opt = THOR(net, lr=0.05, damping=LAM, split_dim=3)
    train_step(net, opt, *batch(0))
    other = THOR(mlp(), lr=0.05, damping=LAM, split_dim=None)
    with pytest.raises(CheckpointError, match="split_dim"):
        other.load_state_dict(opt.state_dict())


def old_format(state: dict) -> dict:
    """`state` as the code before the options were pruned saved it: per-layer trace_ref, next_factor,
    interval_mult and skipped, the counter skipped_refreshes, and the unit-wise BatchNorm section."""
    old = copy.deepcopy(state)
    thor = old["thor"]
    for layer in thor["layers"].values():
        layer.update(trace_ref=1.5, next_factor=layer["next_inverse"], interval_mult=2, skipped=1)
    thor["counters"]["skipped_refreshes"] = 3
    thor["units"] = {}
    return old


def test_a_state_saved_before_the_options_were_pruned_loads_and_continues_exactly():
    net = mlp()
    opt = THOR(net, lr=0.05, damping=LAM, frequency=2)
    for k in range(3):
        train_step(net, opt, *batch(k))
    twin = copy.deepcopy(net)
    resumed = THOR(twin, lr=0.05, damping=LAM, frequency=2)
    resumed.load_state_dict(old_format(opt.state_dict()))
    assert resumed.counters == opt.counters and "skipped_refreshes" not in resumed.counters
    assert set(resumed.preconditioner.state_dict()["layers"]["0"]) == set(opt.preconditioner.state_dict()["layers"]["0"])
    for k in range(3, 6):
        train_step(net, opt, *batch(k))
        train_step(twin, resumed, *batch(k))
    for p, q in zip(net.parameters(), twin.parameters()):
        assert torch.equal(p, q)
