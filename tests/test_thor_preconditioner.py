"""ThorPreconditioner: `.grad` rewritten in place to the float64 dense K-FAC direction (refresh steps and
stored-inverse reuse), other gradients untouched; THOR equals the preconditioner + torch's momentum SGD;
any torch optimizer can follow it (thor_muon: Muon on the preconditioned gradient); grafting and factor
subsampling; check_thor_options validates without a model."""

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from torchboost.errors import ConfigError
from torchboost.optim import muon_optimizer
from torchboost.optim.thor import THOR, ThorPreconditioned, ThorPreconditioner, check_thor_options, thor_muon
from thor_nets import batch, direction, linear_stats, mlp, train_step


def test_grad_is_rewritten_to_the_dense_kfac_direction_and_reused_between_refreshes():
    net = mlp()
    damping = [0.2, 5.0, 0.3]  # the refresh step's damping is the one baked into the inverses
    pre = ThorPreconditioner(net, damping=damping, frequency=2, split_dim=None)
    for k in range(3):
        x, y = batch(k)
        stats = linear_stats(net, x, y)
        if k % 2 == 0:
            curvature = {i: (A, G, damping[k]) for i, A, G, _, _ in stats}
        net.zero_grad()
        F.cross_entropy(net(x), y).backward()
        pre.step()
        for i, _, _, grad, bias_grad in stats:
            A, G, lam = curvature[i]
            np.testing.assert_allclose(net[i].weight.grad.numpy(), direction(A, G, grad, lam), rtol=1e-9, atol=1e-12)
            np.testing.assert_allclose(net[i].bias.grad.numpy(), bias_grad, rtol=1e-12)  # not a THOR layer
        with torch.no_grad():  # move the weights so the next step's curvature differs
            for p in net.parameters():
                p -= 0.3 * p.grad
    assert pre.update_index == 3 and pre.counters["refreshes"] == 4  # 2 layers x refreshes at updates 0, 2


def test_thor_is_the_preconditioner_followed_by_momentum_sgd():
    net = mlp()
    ref = copy.deepcopy(net)
    opt = THOR(net, lr=0.1, damping=0.05, momentum=0.9, weight_decay=1e-2, frequency=3, split_dim=4)
    pre = ThorPreconditioner(ref, damping=0.05, frequency=3, split_dim=4)
    sgd = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-2)
    for k in range(5):
        x, y = batch(k)
        train_step(net, opt, x, y)
        sgd.zero_grad()
        F.cross_entropy(ref(x), y).backward()
        pre.step()
        sgd.step()
    for p, q in zip(net.parameters(), ref.parameters()):
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=1e-12, atol=1e-14)
    assert opt.state_dict()["thor"]["update"] == pre.state_dict()["update"] == 5


def test_graft_keeps_the_direction_with_the_plain_gradient_norm():
    net = mlp()
    pre = ThorPreconditioner(net, damping=0.1, frequency=1, split_dim=None, graft="grad")
    x, y = batch(0)
    stats = linear_stats(net, x, y)
    F.cross_entropy(net(x), y).backward()
    pre.step()
    for i, A, G, grad, _ in stats:
        d = direction(A, G, grad, 0.1)
        np.testing.assert_allclose(net[i].weight.grad.numpy(), d * np.linalg.norm(grad) / np.linalg.norm(d),
                                   rtol=1e-9, atol=1e-12)


def test_factor_samples_takes_the_statistics_from_the_first_samples_only():
    net = mlp()
    pre = ThorPreconditioner(net, damping=0.1, frequency=1, split_dim=None, factor_samples=4)
    x, y = batch(0)
    full, sub = linear_stats(net, x, y), linear_stats(net, x[:4], y[:4])  # per-sample G does not depend on n
    F.cross_entropy(net(x), y).backward()
    pre.step()
    for (i, _, _, grad, _), (_, A, G, _, _) in zip(full, sub):
        np.testing.assert_allclose(net[i].weight.grad.numpy(), direction(A, G, grad, 0.1), rtol=1e-9, atol=1e-12)


def test_wrapped_sgd_equals_thor_and_its_state_round_trips():
    net = mlp()
    ref = copy.deepcopy(net)
    opt = THOR(net, lr=0.1, damping=0.05, momentum=0.9, frequency=2, split_dim=None)
    wrapped = ThorPreconditioned(torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9),
                                 ThorPreconditioner(ref, damping=0.05, frequency=2, split_dim=None))
    for k in range(3):
        train_step(net, opt, *batch(k))
        train_step(ref, wrapped, *batch(k))
    for p, q in zip(net.parameters(), ref.parameters()):
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=1e-12, atol=1e-14)
    clone = copy.deepcopy(ref)
    again = ThorPreconditioned(torch.optim.SGD(clone.parameters(), lr=0.1, momentum=0.9),
                               ThorPreconditioner(clone, damping=0.05, frequency=2, split_dim=None))
    again.load_state_dict(copy.deepcopy(wrapped.state_dict()))  # a saved copy: torch aliases buffers
    train_step(ref, wrapped, *batch(3))
    train_step(clone, again, *batch(3))
    for p, q in zip(ref.parameters(), clone.parameters()):
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=1e-12, atol=1e-14)


def reference_step(ref: nn.Module, ref_opt: torch.optim.Optimizer, x, y, damping: float = 0.1) -> None:
    """One step of `ref_opt` on the float64 dense K-FAC directions of `ref`'s Linear layers."""
    ref_opt.zero_grad()
    for i, A, G, grad, bias_grad in linear_stats(ref, x, y):
        ref[i].weight.grad = torch.from_numpy(direction(A, G, grad, damping))
        ref[i].bias.grad = torch.from_numpy(bias_grad.copy())
    ref_opt.step()


def test_adamw_after_the_preconditioner_sees_the_preconditioned_gradient():
    net = mlp()
    ref = copy.deepcopy(net)
    pre = ThorPreconditioner(net, damping=0.1, frequency=1, split_dim=None)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-2)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    for k in range(2):
        x, y = batch(k)
        reference_step(ref, ref_opt, x, y)
        opt.zero_grad()
        F.cross_entropy(net(x), y).backward()
        pre.step()
        opt.step()
    for p, q in zip(net.parameters(), ref.parameters()):
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=1e-9, atol=1e-12)


def test_check_thor_options_names_the_key_and_the_allowed_range():
    check_thor_options({"damping": 0.1, "frequency": 10, "split_dim": None, "graft": "grad"})
    with pytest.raises(ConfigError, match="unknown THOR option 'frequncy'") as e:
        check_thor_options({"frequncy": 10})
    assert "did you mean 'frequency'" in str(e.value)
    with pytest.raises(ConfigError, match=r"THOR.frequency must be >= 1, got 0"):
        check_thor_options({"frequency": 0})
    with pytest.raises(ConfigError, match="not one of none, grad, sgd_step, muon_step"):
        check_thor_options({"graft": "adam"})
    with pytest.raises(ConfigError, match="damping must be > 0"):
        check_thor_options({"damping": -1})
    with pytest.raises(ConfigError, match="unknown THOR option 'lr'"):  # the preconditioner has no lr
        ThorPreconditioner(mlp(), lr=0.1)
    with pytest.raises(ConfigError, match="unknown THOR option 'frequncy'"):  # constructors share the checks
        THOR(mlp(), lr=0.1, damping=0.1, frequncy=3)


@pytest.mark.parametrize("row_beta", [None, 0.95])  # Muon, NorMuon (thor_normuon)
def test_thor_muon_orthogonalises_the_dense_kfac_direction(row_beta):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 4)).double()
    ref = copy.deepcopy(net)
    opt = thor_muon(net, lr=0.02, weight_decay=1e-2, damping=0.1, frequency=1, split_dim=None, row_beta=row_beta)
    ref_opt = muon_optimizer(ref, lr=0.02, weight_decay=1e-2, row_beta=row_beta)  # Muon: net[2]; AdamW: the rest
    for k in range(2):
        x, y = batch(k)
        reference_step(ref, ref_opt, x, y)
        train_step(net, opt, x, y)
    for (n, p), q in zip(net.named_parameters(), ref.parameters()):
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=1e-7, atol=1e-9, err_msg=n)
