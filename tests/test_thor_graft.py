"""THOR's grafted step (optim.thor.graft = sgd_step | muon_step): THOR's own step, rescaled per parameter to the norm of the
step the grafted optimizer would take, checked update by update against float64 formulas written here."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F

from thor_nets import batch, mlp
from torchboost.errors import ConfigError
from torchboost.optim.thor import THOR, thor_muon

LR, MU, WD = 0.1, 0.9, 1e-2


def _grads(net, x, y):
    net.zero_grad()
    F.cross_entropy(net(x), y).backward()


@pytest.mark.parametrize("nesterov", [False, True])
@pytest.mark.parametrize("graft", ["sgd_step", "muon_step"])
def test_each_step_is_thors_direction_with_the_grafted_optimizers_norm(graft, nesterov):
    net = mlp()
    twin = copy.deepcopy(net)  # THOR without grafting, put in the same state before every update
    kw = dict(lr=LR, damping=0.1, momentum=MU, weight_decay=WD, frequency=2, split_dim=None, nesterov=nesterov)
    opt, plain = THOR(net, graft=graft, **kw), THOR(twin, **kw)
    sgd_momentum = [None] * len(list(net.parameters()))
    for k in range(5):
        twin.load_state_dict(net.state_dict())
        plain.load_state_dict(copy.deepcopy(opt.state_dict()))  # in memory: no tensor shared with opt
        x, y = batch(k)
        _grads(net, x, y)
        _grads(twin, x, y)
        before = [p.detach().clone() for p in net.parameters()]
        raw = [p.grad.clone() for p in net.parameters()]
        opt.step()
        plain.step()
        for i, (p, q, w0, g) in enumerate(zip(net.parameters(), twin.parameters(), before, raw)):
            got, thor_step = p.detach() - w0, q.detach() - w0
            d = g + WD * w0  # SGD's step on the plain gradient, with the same weight decay and momentum
            sgd_momentum[i] = d.clone() if sgd_momentum[i] is None else MU * sgd_momentum[i] + d
            sgd_step = LR * (d + MU * sgd_momentum[i] if nesterov else sgd_momentum[i])
            if graft == "sgd_step":
                norm = sgd_step.norm()
            elif p.ndim >= 2:  # an orthogonal update of this matrix's shape at Muon's lr scaling
                rows, cols = p.shape[0], p[0].numel()
                norm = LR * math.sqrt(max(1, rows / cols)) * math.sqrt(min(rows, cols))
            else:  # Muon leaves vectors to AdamW: THOR's own step
                norm = thor_step.norm()
            want = thor_step * (norm / thor_step.norm())
            torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-13)
            assert got.norm().item() == pytest.approx(float(norm), rel=1e-10)


def test_the_schedule_sets_a_grafted_steps_size():
    """Halving the lr halves every grafted step (graft=muon: exactly, whatever the curvature did)."""
    steps = []
    for lr in (0.1, 0.05):
        net = mlp()
        opt = THOR(net, lr=lr, damping=0.1, momentum=0.0, frequency=1, split_dim=None, graft="muon_step")
        w0 = net[0].weight.detach().clone()
        _grads(net, *batch(0))
        opt.step()
        steps.append((net[0].weight.detach() - w0).norm().item())
    assert steps[1] == pytest.approx(steps[0] / 2, rel=1e-12)


def test_graft_sgd_or_muon_is_refused_in_front_of_another_optimizer():
    with pytest.raises(ConfigError, match="graft=sgd_step"):
        thor_muon(mlp(), lr=0.02, damping=0.1, graft="sgd_step")
    thor_muon(mlp(), lr=0.02, damping=0.1, graft="grad")  # a preconditioner-level graft is fine there


def test_a_grafted_thor_resumes_exactly():
    kw = dict(lr=LR, damping=0.1, momentum=MU, weight_decay=WD, frequency=2, split_dim=None, graft="sgd_step")
    net = mlp()
    opt = THOR(net, **kw)
    for k in range(3):
        _grads(net, *batch(k))
        opt.step()
    twin = copy.deepcopy(net)
    resumed = THOR(twin, **kw)
    resumed.load_state_dict(copy.deepcopy(opt.state_dict()))
    for k in range(3, 6):
        for n, o in ((net, opt), (twin, resumed)):
            _grads(n, *batch(k))
            o.step()
    for p, q in zip(net.parameters(), twin.parameters()):
        assert torch.equal(p, q)
