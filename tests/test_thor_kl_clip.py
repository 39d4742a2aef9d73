"""THOR's KL-clip trust region (kl_clip) against a float64 dense reference: one model-wide scale
min(1, sqrt(kl_clip / |lr^2 sum <P g, g>|)) on every preconditioned gradient (kfac-pytorch's rule), other
gradients untouched; THOR and thor_muon hand the preconditioner their own lr."""

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from torchboost.errors import ConfigError
from torchboost.optim.thor import THOR, ThorPreconditioner, thor_muon
from thor_nets import batch, direction, linear_stats, mlp

LAM = 0.1


def dense_scale(stats, lr: float, kl_clip: float) -> tuple[float, dict]:
    """The dense directions P g per layer and the trust-region scale, computed from them."""
    dirs = {i: direction(A, G, grad, LAM) for i, A, G, grad, _ in stats}
    vg = lr**2 * sum(float((dirs[i] * grad).sum()) for i, _, _, grad, _ in stats)
    return min(1.0, np.sqrt(kl_clip / abs(vg))), dirs


@pytest.mark.parametrize("kl_clip", [1e-6, 1e3])  # a binding clip, and one too loose to act
def test_preconditioned_gradients_share_one_model_wide_scale(kl_clip):
    net, lr = mlp(), 0.3
    x, y = batch(0)
    stats = linear_stats(net, x, y)
    scale, dirs = dense_scale(stats, lr, kl_clip)
    assert (scale < 0.1) if kl_clip < 1 else scale == 1.0
    pre = ThorPreconditioner(net, damping=LAM, frequency=1, split_dim=None, kl_clip=kl_clip)
    F.cross_entropy(net(x), y).backward()
    pre.step(lr=lr)
    for i, _, _, _, bias_grad in stats:
        np.testing.assert_allclose(net[i].weight.grad.numpy(), scale * dirs[i], rtol=1e-9, atol=1e-14)
        np.testing.assert_allclose(net[i].bias.grad.numpy(), bias_grad, rtol=1e-12)  # not preconditioned


def test_thor_passes_its_scheduled_lr_to_the_clip():
    net, lrs, kl_clip = mlp(), np.array([0.5, 0.2]), 1e-5
    ref = copy.deepcopy(net)
    opt = THOR(net, lr=lrs, damping=LAM, momentum=0.0, frequency=1, split_dim=None, kl_clip=kl_clip)
    for k in range(2):
        x, y = batch(k)
        stats = linear_stats(ref, x, y)
        scale, dirs = dense_scale(stats, lrs[k], kl_clip)
        before = {name: p.detach().clone() for name, p in net.named_parameters()}
        opt.zero_grad()
        F.cross_entropy(net(x), y).backward()
        opt.step()
        for i, _, _, _, _ in stats:
            step = before[f"{i}.weight"] - net[i].weight.detach()
            np.testing.assert_allclose(step.numpy(), lrs[k] * scale * dirs[i], rtol=1e-9, atol=1e-14)
        ref.load_state_dict(net.state_dict())


def test_the_clip_needs_the_lr_and_a_positive_bound():
    net = mlp()
    pre = ThorPreconditioner(net, damping=LAM, frequency=1, kl_clip=1e-3)
    x, y = batch(0)
    F.cross_entropy(net(x), y).backward()
    with pytest.raises(ConfigError, match="kl_clip needs the update's learning rate"):
        pre.step()
    with pytest.raises(ConfigError, match="kl_clip"):
        ThorPreconditioner(mlp(), kl_clip=0.0)


def test_thor_muon_clips_with_its_first_param_groups_lr():
    net = mlp()
    opt = thor_muon(net, lr=0.02, damping=LAM, frequency=1, split_dim=None, kl_clip=1e-9)
    seen = []
    opt.preconditioner._kl_scale = lambda pairs, lr: seen.append(lr) or 1.0
    x, y = batch(0)
    F.cross_entropy(net(x), y).backward()
    opt.step()
    assert seen == [opt.param_groups[0]["lr"]]  # the first group's: on this 2-layer net AdamW's lr / 10
