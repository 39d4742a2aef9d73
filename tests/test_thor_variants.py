"""THOR's racer options (`ThorOptions`: damping_mode, inverse_root, project_radial, and thor_muon with ekfac_decay
and inverse_root 2, a SOAP-Muon) against float64 dense references, and their defaults against the update THOR
computed before them.

The references take dense factors from `thor_nets.dense_factors` (explicit im2col loops, autograd's output
gradients), damp and raise them to their powers with numpy/scipy on whole matrices (or the explicit
block-diagonal matrix THOR keeps), and never call THOR's code. The network: a Conv2d 2 -> 3, 3x3 on 3x4 images
(T = 2 positions per sample), optionally a BatchNorm2d, tanh, and a Linear 6 -> 4.
"""

import copy
import math

import numpy as np
import pytest
import scipy.linalg
import torch
import torch.nn.functional as F
from torch import nn
from torch.optim import _muon

from test_thor_ekfac import dense_ekfac
from thor_nets import dense_factors
from torchboost.errors import ConfigError
from torchboost.optim.registry import OptimizerArgs, build_optimizer
from torchboost.optim.thor import THOR, ThorOptions, check_thor_options, thor_muon
from torchboost.optim.thor.eigen import rotate, unrotate
from torchboost.optim.thor.inverse import precondition

LAM, BETA = 0.05, 0.8
WEIGHTS = ("0", "4")  # the conv and the linear layer (index 3 without the BatchNorm: see `make_net`)


def make_net(bn: bool = False) -> nn.Sequential:
    """Conv 2 -> 3 (k3) [-> BatchNorm] -> tanh -> flatten -> Linear 6 -> 4, float64; the Linear is child "4"
    either way (an Identity stands in for the BatchNorm), so both nets share names."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(2, 3, 3), nn.BatchNorm2d(3) if bn else nn.Identity(), nn.Tanh(), nn.Flatten(),
                         nn.Linear(6, 4)).double()


def data(seed: int, n: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """n >= 9 samples: the conv's 18-wide A (2 positions each) is full rank, so its eigenbasis is unique."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 2, 3, 4, generator=g, dtype=torch.float64), torch.randint(0, 4, (n,), generator=g)


def kept(m: np.ndarray, block: int | None) -> np.ndarray:
    """The block-diagonal matrix THOR keeps of m (split_dim `block`; None: all of m)."""
    if block is None:
        return m
    mask = np.kron(np.eye(-(-len(m) // block)), np.ones((block, block)))[:len(m), :len(m)]
    return m * mask


def inverse_root(m: np.ndarray, root: int) -> np.ndarray:
    """m^(-1/root) of an SPD matrix: numpy's inverse, or scipy's (Schur) square root inverted."""
    return np.linalg.inv(m if root == 1 else np.real(scipy.linalg.sqrtm(m)))


def reference_update(A, G, t, grad, mode="absolute", root=1, block=None) -> np.ndarray:
    """THOR's preconditioned gradient by the formulas of ThorOptions' help: damping per `mode` (absolute
    sqrt(lam/T) each; trace lam x the factor's mean eigenvalue; pi: sqrt(lam/T) x pi on A, / pi on G), the
    damped kept factors to the power -1/root, T^(-1/(2 root)) on each."""
    A, G = kept(A, block), kept(G, block)
    mean_a, mean_g = np.trace(A) / len(A), np.trace(G) / len(G)
    d = math.sqrt(LAM / t)
    d_a, d_g = {"absolute": (d, d), "trace": (LAM * mean_a, LAM * mean_g),
                "pi": (d * math.sqrt(mean_a / mean_g), d / math.sqrt(mean_a / mean_g))}[mode]
    scale = t ** (-1.0 / (2 * root))
    return scale ** 2 * inverse_root(G + d_g * np.eye(len(G)), root) @ grad @ inverse_root(A + d_a * np.eye(len(A)),
                                                                                            root)


def thor_grads(net: nn.Module, x, y, **options) -> tuple[nn.Module, THOR, dict[str, torch.Tensor]]:
    """One THOR update (lr 1, no momentum or decay) of a copy of `net`: (the copy, THOR, each weight's plain
    gradient); each `.grad` is left holding the preconditioned gradient the update applied."""
    net = copy.deepcopy(net)
    opt = THOR(net, lr=1.0, damping=LAM, momentum=0.0, **options)
    F.cross_entropy(net(x), y).backward()
    plain = {name: net.get_submodule(name).weight.grad.clone() for name in WEIGHTS}
    opt.step()
    return net, opt, plain


def weight_grad(net: nn.Module, name: str) -> np.ndarray:
    w = net.get_submodule(name).weight
    return w.grad.numpy().reshape(len(w), -1)


@pytest.mark.parametrize("split_dim", [None, 4])
@pytest.mark.parametrize("root", [1, 2])
@pytest.mark.parametrize("mode", ["absolute", "trace", "pi"])
def test_damping_mode_and_inverse_root_match_the_dense_reference(mode, root, split_dim):
    """(a) trace and pi damping, (b) A^-1/2 G^-1/2, and each with the other: whole factors (split_dim None), and
    blocks of 4 with padded last blocks (the conv's 18-wide A, the linear's 6-wide A)."""
    net, (x, y) = make_net(), data(0)
    ref = dense_factors(net, x, y)
    got, _, _ = thor_grads(net, x, y, damping_mode=mode, inverse_root=root, split_dim=split_dim)
    for name in WEIGHTS:
        A, G, t, grad = ref[name]
        np.testing.assert_allclose(weight_grad(got, name), reference_update(A, G, t, grad, mode, root, split_dim),
                                   rtol=1e-10, atol=1e-14)


def test_a_trace_damped_update_does_not_depend_on_the_factors_scale():
    """Scale-free: a loss scaled by c (G by c^2, the gradient by c) changes the trace-damped update by 1/c only."""
    net, (x, y) = make_net(), data(0)
    one, _, _ = thor_grads(net, x, y, damping_mode="trace")
    scaled = copy.deepcopy(net)
    opt = THOR(scaled, lr=1.0, damping=LAM, momentum=0.0, damping_mode="trace", loss_scale=1.0)
    (8.0 * F.cross_entropy(scaled(x), y)).backward()  # an undeclared loss scale of 8: G 64x, the gradient 8x
    opt.step()
    for name in WEIGHTS:
        np.testing.assert_allclose(weight_grad(scaled, name), weight_grad(one, name) / 8.0, rtol=1e-10)


def update_before(layer, grad: torch.Tensor, damping: float) -> torch.Tensor:
    """THOR's preconditioned gradient as the code before these options computed it, op for op: sqrt(lam/T) on
    each factor as one float, identity on the padding, torch's Cholesky and its inverse, times sqrt(1/T)."""
    def inverse(blocks: torch.Tensor, n: int) -> torch.Tensor:
        g, nb, b, _ = blocks.shape
        blocks = blocks.clone()
        idx = torch.arange(n - (nb - 1) * b, b)
        blocks[:, -1, idx, idx] += 1.0
        flat = blocks.reshape(-1, b, b)
        damp = torch.full((len(flat),), math.sqrt(damping / layer.T), dtype=torch.float64).to(flat.dtype)
        chol, info = torch.linalg.cholesky_ex(flat + damp.reshape(-1, 1, 1) * torch.eye(b, dtype=flat.dtype))
        assert not info.any()
        return (torch.cholesky_inverse(chol) * math.sqrt(1.0 / layer.T)).reshape(g, nb, b, b)

    n_in, n_out = layer.sizes
    w = grad.reshape(layer.groups, -1, n_in)
    return precondition(w, inverse(layer.G, n_out), inverse(layer.A, n_in)).reshape(grad.shape)


@pytest.mark.parametrize("split_dim", [None, 4])
@pytest.mark.parametrize("explicit", [False, True])
def test_default_options_give_the_update_before_them_bit_for_bit(explicit, split_dim):
    """Unset or set to their defaults, the new options leave THOR's update and EKFAC's as they were: the same
    bits as the old op sequence (a BatchNorm-fed conv included: project_radial off does not touch it)."""
    defaults = dict(damping_mode="absolute", inverse_root=1, project_radial=False) if explicit else {}
    net, (x, y) = make_net(bn=True), data(0)
    got, opt, plain = thor_grads(net, x, y, split_dim=split_dim, **defaults)
    for name in WEIGHTS:
        layer = opt.layers[name]
        assert torch.equal(got.get_submodule(name).weight.grad, update_before(layer, plain[name], LAM)), name
    got, opt, plain = thor_grads(net, x, y, split_dim=split_dim, ekfac_decay=BETA, **defaults)
    for name in WEIGHTS:  # EKFAC's first update: Q_G (W' / (s + damping)) Q_A^T with the fresh s
        e, layer = opt.layers[name].eigen, opt.layers[name]
        w = plain[name].reshape(layer.groups, -1, layer.sizes[0])
        before = unrotate(rotate(w, e.Q_G, e.Q_A) / (e.s + LAM), e.Q_G, e.Q_A).reshape(plain[name].shape)
        assert torch.equal(got.get_submodule(name).weight.grad, before), name


def test_soap_muon_is_muon_on_ekfacs_adam_rooted_direction():
    """(c) thor_muon + ekfac_decay + inverse_root 2: each update's preconditioned gradient is EKFAC's direction
    divided by the root of its second moment (two updates: the fresh moment, then one that took the gradient),
    and the Muon layer's first step is Muon's Newton-Schulz orthogonalisation of the reference direction (torch's
    function: it iterates in bf16, so the reference direction must round to the same bf16 values)."""
    net, lr, n = make_net(), 0.1, 16
    opt = thor_muon(net, lr, damping=LAM, ekfac_decay=BETA, inverse_root=2, frequency=100, split_dim=None,
                    momentum=0.0, nesterov=False, input_layer="muon")  # the conv to Muon; the head to AdamW
    factors, grads = None, {name: [] for name in WEIGHTS}
    for k in range(2):
        x, y = data(k, n)
        stats = dense_factors(net, x, y)
        factors = factors or stats  # the refresh's factors (update 0) stay: frequency 100
        conv = net[0].weight.detach().clone()
        opt.zero_grad()
        F.cross_entropy(net(x), y).backward()
        opt.step()
        want = {}
        for name in WEIGHTS:
            A, G, t, _ = factors[name]
            grads[name].append(stats[name][3])
            want[name] = dense_ekfac(A, G, t, grads[name], LAM, BETA, n, root=2)[-1]  # moment scale N / loss_scale^2
            np.testing.assert_allclose(weight_grad(net, name), want[name], rtol=1e-10, atol=1e-14)
        if k == 0:  # momentum 0 and no Nesterov: Muon's buffer is the gradient itself
            coefficients = (_muon.DEFAULT_A, _muon.DEFAULT_B, _muon.DEFAULT_C)
            ortho = _muon._zeropower_via_newtonschulz(torch.from_numpy(want["0"]), coefficients,
                                                      _muon.DEFAULT_NS_STEPS, _muon.EPS)
            rows, cols = want["0"].shape
            expected = conv.view(rows, cols).add(ortho, alpha=-lr * math.sqrt(max(1.0, rows / cols)))
            torch.testing.assert_close(net[0].weight.detach().view(rows, cols), expected, rtol=1e-10, atol=0)


def test_project_radial_removes_each_bn_fed_filters_radial_part():
    """(d) the BatchNorm-fed conv's preconditioned gradient projected per output filter onto the tangent space
    of its weight, u - (<u, w>/|w|^2) w (AdamP/SGDP's projection, without SGDP's cosine test); the Linear (not
    BatchNorm-fed) keeps THOR's update; a net without the BatchNorm is not projected at all."""
    net, (x, y) = make_net(bn=True), data(0)
    ref = dense_factors(net, x, y)
    got, _, _ = thor_grads(net, x, y, project_radial=True)
    A, G, t, grad = ref["0"]
    u, w = reference_update(A, G, t, grad), net[0].weight.detach().numpy().reshape(3, -1)
    tangent = u - ((u * w).sum(1) / (w * w).sum(1))[:, None] * w
    np.testing.assert_allclose(weight_grad(got, "0"), tangent, rtol=1e-10, atol=1e-14)
    assert np.abs((weight_grad(got, "0") * w).sum(1)).max() < 1e-12 * np.abs(u).max() * np.abs(w).max()
    A, G, t, grad = ref["4"]
    np.testing.assert_allclose(weight_grad(got, "4"), reference_update(A, G, t, grad), rtol=1e-10, atol=1e-14)
    plain = make_net()
    on, _, _ = thor_grads(plain, x, y, project_radial=True)
    off, _, _ = thor_grads(plain, x, y)
    for name in WEIGHTS:
        assert torch.equal(on.get_submodule(name).weight.grad, off.get_submodule(name).weight.grad)


def test_the_options_are_checked_and_refused_where_they_mean_nothing():
    for bad, message in ((dict(damping_mode="relative"), "not one of absolute, trace, pi"),
                         (dict(inverse_root=3), "not one of 1, 2"), (dict(inverse_root=True), "must be int"),
                         (dict(project_radial="yes"), "must be bool"),
                         (dict(ekfac_decay=0.9, damping_mode="pi"), "damps the eigenvalues")):
        with pytest.raises(ConfigError, match=message):
            check_thor_options(bad)
    with pytest.raises(ConfigError, match="damps the eigenvalues"):  # thor_ekfac sets ekfac_decay itself
        build_optimizer("thor_ekfac", make_net(), OptimizerArgs(lr=0.1, options=ThorOptions(damping_mode="pi")))
    check_thor_options(dict(ekfac_decay=0.9, inverse_root=2, project_radial=True))
    check_thor_options(dict(ekfac_decay=0.9, damping_mode="trace"))  # EKFAC's relative epsilon


def test_each_option_is_a_racer_variant():
    """`thor[damping_mode=pi,...]` and the SOAP-Muon `thor_muon[ekfac_decay=...,inverse_root=2]` parse as
    variants, set in optim.thor, and build."""
    from torchboost.recipe import load_resolved
    from torchboost.race.lanes import variant_racer

    cfg, _, _ = load_resolved("mnist-lenet-thor")
    for spec, want in (("thor[damping_mode=pi,inverse_root=2,project_radial=true]", ("pi", 2, True, None)),
                       ("thor[damping_mode=trace]", ("trace", 1, False, None)),
                       ("thor_muon[ekfac_decay=0.95,inverse_root=2]", ("absolute", 2, False, 0.95))):
        racer = variant_racer(spec, cfg, (0.1,))
        o = racer.build(make_net(bn=True).float(), 0.1, 10, 2).preconditioner.options
        assert racer.name == spec
        assert (o.damping_mode, o.inverse_root, o.project_radial, o.ekfac_decay) == want
    assert cfg.optim.options["thor"].damping_mode == "absolute"  # the race's own config is untouched
