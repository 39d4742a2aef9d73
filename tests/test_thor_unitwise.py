"""THOR's unit-wise BatchNorm preconditioning (batchnorm="unit_wise") against a float64 dense reference:
per channel, the (scale, shift) gradient times (F_c + damping I)^-1, F_c the 2x2 second moment of the
per-sample (scale, shift) gradients. The reference normalises with numpy, takes the output gradient from
autograd (retain_grad) and forms per-sample gradients channel by channel with explicit loops."""

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from torchboost.errors import CheckpointError
from torchboost.optim.thor import ThorPreconditioner

LAM = 0.07


def conv_bn_net() -> nn.Sequential:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(2, 3, 3), nn.BatchNorm2d(3), nn.ReLU(), nn.Flatten(), nn.Linear(3 * 4 * 4, 4),
                        nn.BatchNorm1d(4), nn.Tanh(), nn.Linear(4, 3)).double()
    with torch.no_grad():  # away from the (1, 0) initialisation, and running statistics of their own
        for bn in (net[1], net[5]):
            bn.weight.uniform_(0.5, 1.5), bn.bias.uniform_(-0.5, 0.5)
            bn.running_mean.uniform_(-0.3, 0.3), bn.running_var.uniform_(0.5, 2.0)
    return net


def data(seed: int, n: int = 6):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 2, 6, 6, generator=g, dtype=torch.float64), torch.randint(0, 3, (n,), generator=g)


def dense_unitwise(net: nn.Sequential, x, y, lam: float, rows: int | None = None,
                   f_inv: dict | None = None) -> dict[int, np.ndarray]:
    """Per BatchNorm index: (C, 2) preconditioned (scale, shift) gradients, from the first `rows` samples' F
    (or by the given inverses `f_inv`); the damped inverses used are stored into `f_inv` when it is empty."""
    net = copy.deepcopy(net)
    h, seen = x, {}
    for i, m in enumerate(net):
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            seen[i] = h.detach().numpy()
            h = m(h)
            h.retain_grad()
            seen[i] = (seen[i], h)
        else:
            h = m(h)
    F.cross_entropy(h, y).backward()
    n = len(x)
    out = {}
    for i, (inp, o) in seen.items():
        bn = net[i]
        axes = (0,) + tuple(range(2, inp.ndim))
        if bn.training:
            mean, var = inp.mean(axis=axes, keepdims=True), inp.var(axis=axes, keepdims=True)
        else:
            shape = (1, -1) + (1,) * (inp.ndim - 2)
            mean, var = bn.running_mean.numpy().reshape(shape), bn.running_var.numpy().reshape(shape)
        x_hat = (inp - mean) / np.sqrt(var + bn.eps)
        dy = o.grad.numpy() * n  # per-sample gradients of the mean loss
        res, invs = [], []
        for c in range(inp.shape[1]):
            per_sample = np.array([[(dy[s, c] * x_hat[s, c]).sum(), dy[s, c].sum()] for s in range(n)])
            # the per-sample gradients add up to autograd's batch gradient
            np.testing.assert_allclose(per_sample.mean(0), [bn.weight.grad[c], bn.bias.grad[c]], rtol=1e-10)
            used = per_sample[: rows or n]
            reuse = f_inv is not None and i in f_inv
            inv = f_inv[i][c] if reuse else np.linalg.inv(used.T @ used / len(used) + lam * np.eye(2))
            invs.append(inv)
            res.append(inv @ [bn.weight.grad[c].item(), bn.bias.grad[c].item()])
        out[i] = np.array(res)
        if f_inv is not None and i not in f_inv:
            f_inv[i] = invs
    return out


def bn_grads(net: nn.Sequential, i: int) -> np.ndarray:
    return torch.stack((net[i].weight.grad, net[i].bias.grad), -1).numpy()


@pytest.mark.parametrize("training", [True, False])
def test_batchnorm_gradients_match_the_dense_unitwise_natural_gradient(training):
    net = conv_bn_net().train(training)
    x, y = data(0)
    ref = dense_unitwise(net, x, y, LAM)
    pre = ThorPreconditioner(net, damping=LAM, frequency=1, split_dim=None, batchnorm="unit_wise")
    F.cross_entropy(net(x), y).backward()
    pre.step()
    assert sorted(pre.units) == ["1", "5"]
    for i in (1, 5):
        np.testing.assert_allclose(bn_grads(net, i), ref[i], rtol=1e-9, atol=1e-13)


def test_batchnorm_stays_plain_by_default_and_factor_samples_use_the_first_rows():
    net, plain = conv_bn_net(), conv_bn_net()
    x, y = data(1, n=8)
    ref = dense_unitwise(net, x, y, LAM, rows=3)
    pre = ThorPreconditioner(net, damping=LAM, frequency=1, split_dim=None, batchnorm="unit_wise",
                             factor_samples=3)
    default = ThorPreconditioner(plain, damping=LAM, frequency=1, split_dim=None)
    for m in (net, plain):
        F.cross_entropy(m(x), y).backward()
    raw = bn_grads(plain, 1)
    pre.step(), default.step()
    np.testing.assert_allclose(bn_grads(net, 1), ref[1], rtol=1e-9, atol=1e-13)
    np.testing.assert_array_equal(bn_grads(plain, 1), raw)
    assert default.units == {}


def test_inverses_are_reused_between_refreshes_and_survive_a_checkpoint():
    net = conv_bn_net()
    pre = ThorPreconditioner(net, damping=LAM, frequency=2, split_dim=None, batchnorm="unit_wise")
    sgd = torch.optim.SGD(net.parameters(), lr=0.1)
    f_inv: dict = {}
    for k in range(2):  # update 1 reuses the inverses of update 0, applied to update 1's gradient
        x, y = data(k)
        ref = dense_unitwise(net, x, y, LAM, f_inv=f_inv)
        sgd.zero_grad()
        F.cross_entropy(net(x), y).backward()
        pre.step()
        for i in (1, 5):
            np.testing.assert_allclose(bn_grads(net, i), ref[i], rtol=1e-9, atol=1e-13)
        sgd.step()
    assert [u.refreshes for u in pre.units.values()] == [1, 1]

    copy_net = copy.deepcopy(net)
    resumed = ThorPreconditioner(copy_net, damping=LAM, frequency=2, split_dim=None, batchnorm="unit_wise")
    resumed.load_state_dict(pre.state_dict())
    x, y = data(2)
    for m, p in ((net, pre), (copy_net, resumed)):
        m.zero_grad()
        F.cross_entropy(m(x), y).backward()
        p.step()
    for i in (1, 5):
        np.testing.assert_array_equal(bn_grads(copy_net, i), bn_grads(net, i))
    with pytest.raises(CheckpointError, match="batchnorm option"):
        ThorPreconditioner(conv_bn_net(), damping=LAM, frequency=2, split_dim=None).load_state_dict(pre.state_dict())


def test_kl_clip_sums_over_batchnorm_units_too():
    net, lr, kl_clip = conv_bn_net(), 0.5, 1e-7
    x, y = data(3)
    free = copy.deepcopy(net)
    clipped = ThorPreconditioner(net, damping=LAM, frequency=1, split_dim=None, batchnorm="unit_wise",
                                 kl_clip=kl_clip)
    unclipped = ThorPreconditioner(free, damping=LAM, frequency=1, split_dim=None, batchnorm="unit_wise")
    raw = {}
    for m, p in ((net, clipped), (free, unclipped)):
        F.cross_entropy(m(x), y).backward()
        raw = {n: q.grad.clone() for n, q in m.named_parameters()}
        p.step(lr=lr)
    covered = [n for n in raw if not n.endswith("bias") or n.startswith(("1.", "5."))]
    vg = lr**2 * sum(float((free.get_parameter(n).grad * raw[n]).sum()) for n in covered)
    scale = min(1.0, np.sqrt(kl_clip / abs(vg)))
    assert scale < 0.1
    for n, q in net.named_parameters():
        want = free.get_parameter(n).grad * (scale if n in covered else 1.0)
        np.testing.assert_allclose(q.grad.numpy(), want.numpy(), rtol=1e-9, atol=1e-15)
