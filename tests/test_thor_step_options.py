"""What K-FAC users expect of curvature and step, each a named option with a test that it changes THOR's update
(a variant equal to its parent would race as its parent), checked against what it should be where that has a
formula: factor_decay (a moving average of the factors over refreshes), decoupled_decay (AdamW's order of the
weight decay), graft_layers=hidden (the input layer and classifier keep their plain gradient's step, as Muon hands
them to AdamW), Nesterov, factor_samples (whole batch or a sample count), and EKFAC's relative epsilon."""

import copy

import pytest
import torch

from thor_nets import bn_convnet, run_updates
from torchboost.errors import ConfigError
from torchboost.optim.registry import OptimizerArgs, build_optimizer
from torchboost.optim.thor import ThorOptions, thor_muon

LR, WD = 0.05, 0.01
LAYERS = (0, 3, 8)  # bn_convnet's input conv, hidden conv, classifier


def deltas(steps: int = 2, name: str = "thor", nesterov: bool | None = None, weight_decay: float = 0.0,
           **options) -> tuple[dict[int, torch.Tensor], torch.optim.Optimizer]:
    net = bn_convnet()
    start = copy.deepcopy(net)
    args = OptimizerArgs(lr=LR, nesterov=nesterov, weight_decay=weight_decay, options=ThorOptions(**options))
    opt = build_optimizer(name, net, args)
    run_updates(net, opt, steps)
    return {i: (net[i].weight - start[i].weight).detach() for i in LAYERS}, opt


def rel(a: dict, b: dict) -> float:
    return max(float((a[i] - b[i]).norm() / b[i].norm()) for i in LAYERS)


def test_factor_decay_averages_the_factors_over_refreshes():
    plain, opt = deltas(1, frequency=1)
    a1 = {n: l.A.clone() for n, l in opt.layers.items()}
    _, opt2 = deltas(2, frequency=1)
    averaged, opt3 = deltas(2, frequency=1, factor_decay=0.5)
    for n, l in opt3.layers.items():  # the second refresh's factors from the same weights: the first step is equal
        torch.testing.assert_close(l.A, 0.5 * a1[n] + 0.5 * opt2.layers[n].A)
    assert rel(averaged, deltas(2, frequency=1)[0]) > 0.01


def test_decoupled_decay_shrinks_the_weights_after_the_grafted_step():
    """One update, momentum's first step: w (1 - lr wd) - lr x graft(THOR's step without decay); MindSpore's order
    grafts the decayed step instead."""
    net = bn_convnet()
    free, _ = deltas(1, graft="muon_step")
    got, _ = deltas(1, graft="muon_step", weight_decay=WD, decoupled_decay=True)
    coupled, _ = deltas(1, graft="muon_step", weight_decay=WD)
    for i in LAYERS:
        torch.testing.assert_close(got[i], free[i] - LR * WD * net[i].weight.detach(), rtol=1e-5, atol=1e-7)
    assert rel(got, coupled) > 1e-3
    with pytest.raises(ConfigError, match="decoupled_decay"):
        thor_muon(bn_convnet(), LR, decoupled_decay=True)


def test_graft_layers_hidden_leaves_the_input_layer_and_classifier_to_momentum_sgd():
    net = bn_convnet()
    x_deltas, opt = deltas(1, graft="muon_step", graft_layers="hidden")
    grafted, _ = deltas(1, graft="muon_step")
    assert list(opt.layers) == ["3"]  # only the hidden conv is preconditioned (and its factors captured)
    torch.testing.assert_close(x_deltas[3], grafted[3])
    sgd = bn_convnet()
    run_updates(sgd, torch.optim.SGD(sgd.parameters(), LR, momentum=0.9), 1)
    for i in (0, 8):  # the first update of momentum SGD on the plain gradient
        torch.testing.assert_close(x_deltas[i], (sgd[i].weight - net[i].weight).detach())
    assert rel(x_deltas, grafted) > 0.1


def test_nesterov_changes_thors_step():
    assert rel(deltas(2, nesterov=True)[0], deltas(2, nesterov=False)[0]) > 0.1


def test_factor_samples_changes_the_factors():
    assert rel(deltas(2, factor_samples=8)[0], deltas(2)[0]) > 0.01


def test_ekfacs_relative_epsilon_changes_its_update():
    base = dict(name="thor_ekfac", damping=0.1, steps=3)
    assert rel(deltas(damping_mode="trace", **base)[0], deltas(**base)[0]) > 0.1


def test_the_new_options_are_racer_variants():
    """Each parses as a variant in optim.thor and builds (the race's own config is untouched)."""
    from torchboost.recipe import load_resolved
    from torchboost.race.lanes import variant_racer

    cfg, _, _ = load_resolved("mnist-lenet-thor")
    for spec in ("thor[factor_decay=0.95]", "thor[decoupled_decay=true]", "thor[graft_layers=hidden]",
                 "thor_ekfac[damping_mode=trace]", "thor_soap[damping_mode=trace,factor_decay=0.95]"):
        racer = variant_racer(spec, cfg, (0.1,))
        assert racer.name == spec
        racer.build(bn_convnet(), 0.1, 10, 2)
    assert cfg.optim.options["thor"].factor_decay is None
