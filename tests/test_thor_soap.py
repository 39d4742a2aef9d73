"""thor_soap (`optim/thor/soap.ThorSOAP`) against a float64 numpy implementation of the SOAP paper's algorithm
(Vyas et al. 2024, arXiv 2409.11321: Adam in a Kronecker eigenbasis, the first moment carried into a new basis,
the second kept) fed THOR's factors, which it builds from `thor_nets.dense_factors` (explicit im2col loops) and
diagonalises with numpy; its Adam against heavyball's (`heavyball.utils.adam_`, what heavyball's SOAP runs in its
basis); resume; and that it differs from its parent, the SOAP-like thor_ekfac[inverse_root=2]."""

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from test_thor_variants import data, make_net
from thor_nets import dense_factors
from torchboost.errors import CheckpointError, ConfigError
from torchboost.optim.registry import OptimizerArgs, build_optimizer
from torchboost.optim.thor import ThorOptions
from torchboost.optim.thor.soap import ThorSOAP, adam_direction

B1, B2, LR, WD = 0.9, 0.95, 0.01, 0.1
LAYERS = ("0", "4")


def block_eigenbasis(m: np.ndarray, block: int | None) -> np.ndarray:
    """The eigenbasis THOR keeps of factor m at split_dim `block`: each diagonal block's own eigenvectors (numpy's
    ascending order within the block), as one block-diagonal matrix."""
    b = len(m) if block is None else block
    q = np.zeros_like(m)
    for i in range(0, len(m), b):
        q[i:i + b, i:i + b] = np.linalg.eigh(m[i:i + b, i:i + b])[1]
    return q


def reference_soap(net, batches, eps, relative, frequency, decay, block=None):
    """The paper's SOAP in the eigenbasis of THOR's (moving-average) factors, float64 numpy: returns the weights."""
    net = copy.deepcopy(net)
    params = dict(net.named_parameters())
    st = {name: dict(m=0.0, v=0.0) for name in params}
    for k, (x, y) in enumerate(batches):
        stats = dense_factors(net, x, y)
        net.zero_grad()
        F.cross_entropy(net(x), y).backward()
        for name, p in params.items():
            layer = name.split(".")[0] if name.endswith("weight") and name.split(".")[0] in LAYERS else None
            s, g = st[name], p.grad.numpy().reshape(len(p), -1) if layer else p.grad.numpy()
            if layer:
                A, G, _, _ = stats[layer]
                if k % frequency == 0:
                    if "A" in s:
                        A, G = decay * s["A"] + (1 - decay) * A, decay * s["G"] + (1 - decay) * G
                    qa, qg = block_eigenbasis(A, block), block_eigenbasis(G, block)
                    if "qa" in s:  # m back to the weights' coordinates with the old basis, into the new one
                        s["m"] = qg.T @ (s["qg"] @ s["m"] @ s["qa"].T) @ qa
                    s.update(A=A, G=G, qa=qa, qg=qg)
                g = s["qg"].T @ g @ s["qa"]
            s["m"] = B1 * s["m"] + (1 - B1) * g
            s["v"] = B2 * s["v"] + (1 - B2) * g * g
            m_hat, root = s["m"] / (1 - B1 ** (k + 1)), np.sqrt(s["v"] / (1 - B2 ** (k + 1)))
            u = m_hat / (root + (eps * root.mean() if relative else eps))
            if layer:
                u = s["qg"] @ u @ s["qa"].T
            with torch.no_grad():
                p.mul_(1 - LR * WD).sub_(LR * torch.from_numpy(u.reshape(p.shape)))
    return net


def run_soap(net, batches, split_dim=None, **options):
    net = copy.deepcopy(net)
    opt = ThorSOAP(net, net.parameters(), LR, momentum=B1, weight_decay=WD, split_dim=split_dim, soap_beta2=B2,
                   **options)
    for x, y in batches:
        opt.zero_grad()
        F.cross_entropy(net(x), y).backward()
        opt.step()
    return net, opt


@pytest.mark.parametrize("mode,eps,block", [("absolute", 1e-8, None), ("trace", 1e-2, None), ("trace", 1e-2, 8)])
def test_thor_soap_is_the_papers_soap_in_thors_eigenbasis(mode, eps, block):
    """5 updates, bases refreshed at 0, 2 and 4 from a factor moving average (0.5): every weight as the reference
    (block 8: the conv's 18-wide A in blocks of 8, 8 and 2, each its own eigenbasis)."""
    net, batches = make_net(), [data(seed) for seed in range(5)]
    got, _ = run_soap(net, batches, block, damping=eps, damping_mode=mode, frequency=2, factor_decay=0.5)
    want = reference_soap(net, batches, eps, mode == "trace", 2, 0.5, block)
    for (name, p), q in zip(got.named_parameters(), want.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-9, atol=1e-12, msg=name)
    # and it moved: the update is not the identity
    assert (got[0].weight - net[0].weight).norm() > 1e-3


def test_its_adam_is_heavyballs():
    """heavyball's SOAP runs `utils.adam_` on the rotated gradient: bias-corrected moments, and the root of the
    second moment clamped below at eps (the paper adds eps; with a negligible eps the two agree)."""
    heavyball_utils = pytest.importorskip("heavyball.utils")
    heavyball_utils.compile_mode = None
    gen = torch.Generator().manual_seed(0)
    m, v = torch.zeros(3, 4, dtype=torch.float64), torch.zeros(3, 4, dtype=torch.float64)
    hm, hv = m.clone(), v.clone()
    for t in range(1, 4):
        g = torch.randn(3, 4, generator=gen, dtype=torch.float64)
        m.lerp_(g, 1 - B1)
        v.mul_(B2).addcmul_(g, g, value=1 - B2)
        want = heavyball_utils.adam_(hm, hv, [g.clone()], B1, B2, t, 1e-30)[0]
        torch.testing.assert_close(adam_direction(m, v, t, (B1, B2), 0.0, False), want, rtol=1e-12, atol=0)


def test_state_round_trip_continues_exactly_and_is_checked():
    net, batches = make_net(), [data(seed) for seed in range(5)]
    whole, _ = run_soap(net, batches, frequency=2, damping=1e-2, damping_mode="trace")
    half, opt = run_soap(net, batches[:3], frequency=2, damping=1e-2, damping_mode="trace")
    saved = copy.deepcopy(opt.state_dict())
    resumed = copy.deepcopy(half)
    opt2 = ThorSOAP(resumed, resumed.parameters(), LR, momentum=B1, weight_decay=WD, split_dim=None, soap_beta2=B2,
                    frequency=2, damping=1e-2, damping_mode="trace")
    opt2.load_state_dict(saved)
    for x, y in batches[3:]:
        opt2.zero_grad()
        F.cross_entropy(resumed(x), y).backward()
        opt2.step()
    for p, q in zip(resumed.parameters(), whole.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0)
    bad = copy.deepcopy(saved)
    bad["state"][0]["exp_avg"] = torch.zeros(5)
    with pytest.raises(CheckpointError, match="exp_avg has shape"):
        opt2.load_state_dict(bad)
    with pytest.raises(CheckpointError, match="no THOR curvature"):
        opt2.load_state_dict({k: v for k, v in saved.items() if k != "thor"})


def test_registered_and_differs_from_its_parent():
    """thor_soap against the SOAP-like variant it replaces, thor_ekfac[inverse_root=2] (an Adam root of EKFAC's
    moment, no first moment, no bias correction): on one fixed batch, after 3 updates, the weights differ."""
    net, batches = make_net().float(), [data(s) for s in range(3)]
    moved = {}
    for name, options in (("thor_soap", ThorOptions(damping=1e-3, damping_mode="trace", frequency=2)),
                          ("thor_ekfac", ThorOptions(damping=1e-3, damping_mode="trace", frequency=2, inverse_root=2))):
        model = copy.deepcopy(net)
        opt = build_optimizer(name, model, OptimizerArgs(lr=LR, options=options))
        for x, y in batches:
            opt.zero_grad()
            F.cross_entropy(model(x.float()), y).backward()
            opt.step()
        moved[name] = model[0].weight.detach() - net[0].weight.detach()
    diff = (moved["thor_soap"] - moved["thor_ekfac"]).norm() / moved["thor_ekfac"].norm()
    assert diff > 0.1, float(diff)


def test_options_that_mean_nothing_here_are_refused():
    for bad in (dict(damping_mode="pi"), dict(ekfac_decay=0.9), dict(graft="grad")):
        with pytest.raises(ConfigError, match="thor_soap takes THOR.s eigenbases"):
            ThorSOAP(make_net(), make_net().parameters(), LR, **bad)
