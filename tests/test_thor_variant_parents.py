"""Every named THOR-family variant changes its parent's update on a fixed batch sequence (a variant equal to its
parent races as its parent under another name): two updates of `thor_nets.bn_convnet` from one start, the
relative difference of each layer's weight change, at the races' damping 0.1. And the SOAP-Muon the issue found
racing as Muon: with MindSpore's absolute damping its divisor is dominated, so its update sits near Muon's (the
health report says so), while with the relative epsilon it is its own."""

import copy

import pytest
import torch

from thor_nets import bn_convnet, run_updates
from torchboost.optim.registry import OptimizerArgs, build_optimizer
from torchboost.optim.thor import ThorOptions
from torchboost.optim.thor.health import thor_health

LAYERS = (0, 3, 8)
DAMPING = 0.1


def change(name: str, lr: float = 0.05, steps: int = 2, **options) -> tuple[dict, torch.optim.Optimizer]:
    net = bn_convnet()
    start = copy.deepcopy(net)
    thor = name.startswith("thor")
    opt = build_optimizer(name, net, OptimizerArgs(lr=lr, options=ThorOptions(damping=DAMPING, **options)
                                                   if thor else None))
    run_updates(net, opt, steps)
    return {i: (net[i].weight - start[i].weight).detach() for i in LAYERS}, opt


def differences(variant: tuple, parent: tuple) -> list[float]:
    (a, _), (b, _) = change(variant[0], **variant[1]), change(parent[0], **parent[1])
    return [float((a[i] - b[i]).norm() / b[i].norm()) for i in LAYERS]


THOR, THOR_MUON = ("thor", {}), ("thor_muon", dict(lr=0.02))
VARIANTS = [  # (variant, parent, the least largest-layer difference), measured 2-400x above it
    (("thor", dict(damping_mode="trace")), THOR, 1.0), (("thor", dict(damping_mode="pi")), THOR, 1.0),
    (("thor", dict(inverse_root=2)), THOR, 0.2), (("thor", dict(project_radial=True)), THOR, 0.02),
    (("thor", dict(graft="grad")), THOR, 0.2), (("thor", dict(graft="sgd_step")), THOR, 0.2),
    (("thor", dict(graft="muon_step")), THOR, 1.0), (("thor", dict(factor_samples=8)), THOR, 0.1),
    (("thor_ekfac", {}), THOR, 1.0), (("thor_muon", dict(lr=0.02)), ("muon", dict(lr=0.02)), 0.2),
    (("thor_normuon", dict(lr=0.02)), ("normuon", dict(lr=0.02)), 0.2),
    (("thor_muon", dict(lr=0.02, ekfac_decay=0.95, inverse_root=2)), THOR_MUON, 0.2),
    (("thor_soap", dict(lr=0.003, damping_mode="trace")), ("thor_ekfac", dict(lr=0.003, inverse_root=2)), 0.2),
]


@pytest.mark.parametrize("variant,parent,least", VARIANTS, ids=lambda v: v[0] if isinstance(v, tuple) else None)
def test_each_variant_changes_its_parents_update(variant, parent, least):
    assert max(differences(variant, parent)) > least


def test_soap_muon_with_absolute_damping_is_near_muon_and_the_relative_epsilon_is_not():
    muon, _ = change("muon", lr=0.02)
    soap_muon, opt = change("thor_muon", lr=0.02, ekfac_decay=0.95, inverse_root=2)
    relative, _ = change("thor_muon", lr=0.02, ekfac_decay=0.95, inverse_root=2, damping_mode="trace")
    near = [float((soap_muon[i] - muon[i]).norm() / muon[i].norm()) for i in (0, 3)]
    apart = [float((relative[i] - muon[i]).norm() / muon[i].norm()) for i in (0, 3)]
    assert max(near) < 0.1 and min(apart) > 0.2, (near, apart)  # measured 0.09, 0.06 vs 0.27, 0.39
    assert [r.divisor.inert for r in thor_health(opt)][:2] == [True, True]  # the convs' divisors: the report says
