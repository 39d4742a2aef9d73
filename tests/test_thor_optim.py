"""THOR's update rule: stored-inverse reuse between refreshes, weight-decay/momentum order, lr and damping
schedules, the MindSpore-shaped factory. References are float64 numpy K-FAC on a small MLP."""


import numpy as np
import pytest
import torch

from torchboost.errors import ConfigError
from torchboost.compat.mindspore import thor
from torchboost.optim.thor import THOR
from thor_nets import batch, direction, linear_stats, mlp, train_step


def test_non_refresh_steps_reuse_the_stored_inverses():
    net = mlp()
    damping = [0.1, 3.0, 3.0, 0.2]  # the damping of the refresh step is the one baked into the inverses
    opt = THOR(net, lr=1.0, damping=damping, momentum=0.0, frequency=3, split_dim=None)
    kept = None
    for k in range(4):
        x, y = batch(k)
        stats = linear_stats(net, x, y)
        if k % 3 == 0:
            curvature = {i: (A, G, damping[k]) for i, A, G, _, _ in stats}
        w0 = [net[i].weight.detach().clone() for i, *_ in stats]
        train_step(net, opt, x, y)
        for (i, _, _, grad, _), w in zip(stats, w0):
            A, G, lam = curvature[i]
            np.testing.assert_allclose((w - net[i].weight.detach()).numpy(), direction(A, G, grad, lam),
                                       rtol=1e-9, atol=1e-12)
        inv = opt.layers["0"].A_inv
        if k in (1, 2):
            assert inv is kept  # same tensor object: nothing was recomputed
        kept = inv
    assert opt.counters["refreshes"] == 4  # 2 layers x refresh steps 0 and 3


def test_weight_decay_is_added_after_preconditioning_then_momentum():
    net = mlp()
    lr, mu, wd, lam = 0.5, 0.9, 0.01, 0.1
    opt = THOR(net, lr=lr, damping=lam, momentum=mu, weight_decay=wd, frequency=100, split_dim=None,
               decay_filter=lambda name: not name.endswith("bias"))
    x0, y0 = batch(0)
    s0 = linear_stats(net, x0, y0)
    curv = {i: (A, G) for i, A, G, _, _ in s0}
    moments = {}
    for k in range(2):
        x, y = batch(k)
        stats = s0 if k == 0 else linear_stats(net, x, y)
        before = {i: (net[i].weight.detach().numpy().copy(), net[i].bias.detach().numpy().copy()) for i, *_ in stats}
        train_step(net, opt, x, y)
        for i, _, _, gw, gb in stats:
            w, b = before[i]
            step_w = direction(*curv[i], gw, lam) + wd * w
            step_b = gb  # bias: plain gradient, excluded from decay by the filter
            vw, vb = moments.get(i, (0.0, 0.0))
            vw, vb = mu * vw + step_w, mu * vb + step_b
            moments[i] = (vw, vb)
            np.testing.assert_allclose(net[i].weight.detach().numpy(), w - lr * vw, rtol=1e-10, atol=1e-12)
            np.testing.assert_allclose(net[i].bias.detach().numpy(), b - lr * vb, rtol=1e-10, atol=1e-12)
            if k == 0:  # decay before preconditioning would be a different update
                wrong = direction(*curv[i], gw + wd * w, lam)
                assert not np.allclose(w - lr * wrong, net[i].weight.detach().numpy(), rtol=1e-6)
    assert [g["weight_decay"] for g in opt.param_groups] == [wd, 0.0]


def test_lr_and_damping_accept_arrays_and_callables():
    net = mlp()
    lrs = np.array([0.3, 0.2, 0.1], dtype=np.float32)
    seen = []
    opt = THOR(net, lr=lrs, damping=lambda k: seen.append(k) or 0.1 * (k + 1), momentum=0.0, frequency=1)
    for k in range(3):
        x, y = batch(k)
        gb = linear_stats(net, x, y)[1][4]
        b = net[2].bias.detach().clone()
        train_step(net, opt, x, y)
        np.testing.assert_allclose((b - net[2].bias.detach()).numpy(), float(lrs[k]) * gb, rtol=1e-6)
        assert opt.param_groups[0]["lr"] == pytest.approx(float(lrs[k]))
        assert opt.preconditioner.damping_at(k) == pytest.approx(0.1 * (k + 1))  # the one source of damping
    assert seen == [0, 0, 1, 1, 2, 2]  # update k: once in its step, once in the assert above
    with pytest.raises(ConfigError, match="3 entries"):
        train_step(net, opt, *batch(3))


def test_float_lr_follows_torch_lr_schedulers():
    net = mlp()
    opt = THOR(net, lr=0.4, damping=0.1, momentum=0.0)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    for k in range(2):
        x, y = batch(k)
        gb = linear_stats(net, x, y)[1][4]
        b = net[2].bias.detach().clone()
        train_step(net, opt, x, y)
        sched.step()
        np.testing.assert_allclose((b - net[2].bias.detach()).numpy(), 0.4 * 0.5 ** k * gb, rtol=1e-9)


def test_mindspore_factory_and_validation():
    net = mlp()
    lr = np.full(10, 0.01, np.float32)
    opt = thor(net, lr, lr, 0.9, 5e-4, 128.0, 32, split_indices=[0], frequency=5)
    assert isinstance(opt, THOR) and opt.options.frequency == 5 and opt.options.loss_scale == 128.0
    assert opt.options.split_indices == [0] and np.array_equal(opt.options.damping, lr)
    assert opt.param_groups[0]["weight_decay"] == 5e-4
    with pytest.raises(ConfigError):
        thor(net, lr, lr, 0.9, batch_size=0)
    with pytest.raises(ConfigError, match="damping must be > 0"):
        THOR(net, lr=0.1, damping=0.0)
    with pytest.raises(ConfigError, match="damping must be > 0"):  # a schedule is checked at each update
        train_step(net, THOR(net, lr=0.1, damping=lambda k: 0.0), *batch(0))
