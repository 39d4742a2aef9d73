"""THOR's "curvature early, first-order late" switch (first_order_after; recipes: optim.thor.first_order_epoch)
against a float64 reference: before the switch each Linear weight steps along G^-1 grad A^-1, from it on along
its plain gradient, through one uninterrupted momentum buffer; after the switch no statistics are captured."""

import copy
import dataclasses

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from torchboost.errors import ConfigError
from torchboost.optim.muon import muon_optimizer
from torchboost.recipe.optimizers import ThorRecipeOptions, thor_per_update
from torchboost.optim.thor import THOR, thor_muon
from thor_nets import batch, direction, linear_stats, mlp, train_step

LAM, LR, MU, WD = 0.1, 0.2, 0.9, 1e-3


def test_thor_steps_on_curvature_then_on_the_plain_gradient_with_one_momentum_buffer():
    net, switch = mlp(), 2
    ref = {name: p.detach().numpy().copy() for name, p in net.named_parameters()}
    bufs = {name: np.zeros_like(w) for name, w in ref.items()}
    opt = THOR(net, lr=LR, damping=LAM, momentum=MU, weight_decay=WD, frequency=1, split_dim=None,
               first_order_after=switch)
    for k in range(5):
        x, y = batch(k)
        probe = copy.deepcopy(net)
        stats = {i: (A, G, gw, gb) for i, A, G, gw, gb in linear_stats(probe, x, y)}
        for i, (A, G, gw, gb) in stats.items():
            g = direction(A, G, gw, LAM) if k < switch else gw
            for name, grad in ((f"{i}.weight", g), (f"{i}.bias", gb)):
                grad = grad + WD * ref[name]
                bufs[name] = grad if k == 0 else MU * bufs[name] + grad  # MindSpore: v1 = g
                ref[name] = ref[name] - LR * bufs[name]
        train_step(net, opt, x, y)
        for name, p in net.named_parameters():
            np.testing.assert_allclose(p.detach().numpy(), ref[name], rtol=1e-9, atol=1e-13, err_msg=f"{k} {name}")
    assert opt.counters["refreshes"] == 2 * switch  # two layers, refreshed at updates 0 and 1 only
    assert not any(l.capture.enabled for l in opt.layers.values())


def test_thor_muon_switched_at_update_zero_is_muon():
    net = mlp()
    twin = copy.deepcopy(net)
    switched = thor_muon(net, lr=0.02, damping=LAM, frequency=1, first_order_after=0)
    plain = muon_optimizer(twin, 0.02, 0.95, 0.0, True, input_layer="adamw")
    for k in range(3):
        x, y = batch(k)
        train_step(net, switched, x, y)
        train_step(twin, plain, x, y)
    for (name, p), q in zip(net.named_parameters(), twin.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0, msg=name)


def test_the_recipe_key_is_in_epochs_and_resume_keeps_the_phase():
    options = dataclasses.replace(ThorRecipeOptions(), first_order_epoch=1.5, frequency=1, damping=LAM,
                                  split_dim=None)
    kw = dataclasses.asdict(thor_per_update(options, updates_per_epoch=4, epochs=3))
    assert kw["first_order_after"] == 6
    net = mlp()
    opt = THOR(net, lr=LR, momentum=MU, **kw)
    for k in range(7):
        train_step(net, opt, *batch(k))
    state = copy.deepcopy(opt.state_dict())
    twin = copy.deepcopy(net)
    resumed = THOR(twin, lr=LR, momentum=MU, **kw)
    resumed.load_state_dict(state)
    assert not any(l.capture.enabled for l in resumed.layers.values())  # past the switch: nothing captured
    for k in range(7, 9):
        train_step(net, opt, *batch(k))
        train_step(twin, resumed, *batch(k))
    for p, q in zip(net.parameters(), twin.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0)
    assert opt.counters["refreshes"] == 2 * 6


@pytest.mark.parametrize("bad", [-1, 1.5, "x"])
def test_a_bad_switch_is_one_line(bad):
    with pytest.raises(ConfigError, match="first_order_after"):
        THOR(mlp(), lr=LR, damping=LAM, first_order_after=bad)


def test_a_damping_decay_above_one_grows_the_damping_by_its_formula():
    """damping_decay > 1: damping(e) = damping · decay^(e/10), e = (i + 1) / updates per epoch for update i (as
    MindSpore's loop has it); a value that overflows float32 within the run is a one-line error, not inf."""
    d = np.asarray(thor_per_update(ThorRecipeOptions(damping=0.1, damping_decay=30.0), 4, epochs=8).damping,
                   np.float64)
    assert d.shape == (32,)
    np.testing.assert_allclose(d, 0.1 * 30.0 ** ((np.arange(32) + 1) / 4 / 10), rtol=1e-6)
    with pytest.raises(ConfigError, match="past the float range"):
        thor_per_update(ThorRecipeOptions(damping=0.1, damping_decay=1e6), 4, epochs=1000)
