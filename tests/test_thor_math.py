"""THOR's preconditioned gradient against an independent float64 dense reference.

The reference re-runs the network functionally, takes output gradients from autograd (retain_grad),
builds conv patches with explicit numpy loops, and inverts dense (optionally explicitly block-diagonal)
damped factors with numpy — none of THOR's code paths.
"""

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from thor_nets import im2col
from torchboost.optim.thor import THOR
from torchboost.optim.thor.inverse import damped_inverse, damped_inverses

LAM = 0.05
pytestmark = pytest.mark.filterwarnings("ignore:Using padding='same'")


def reference_directions(model: nn.Sequential, x: torch.Tensor, y: torch.Tensor, lam: float,
                         block: int | None) -> dict[str, np.ndarray]:
    """float64 (G + sqrt(lam/T) I)^-1 grad (A + sqrt(lam/T) I)^-1 / T per Conv/Linear weight, per group."""
    net = copy.deepcopy(model).double()
    h, inputs, outputs = x.double(), {}, {}
    for name, m in net.named_children():
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            inputs[name] = h.detach().numpy()
            h = m(h)
            h.retain_grad()
            outputs[name] = h
        else:  # out of place, so the retained conv output keeps its own gradient
            h = torch.relu(h) if isinstance(m, nn.ReLU) else m(h)
    F.cross_entropy(h, y).backward()
    n = x.shape[0]
    out = {}
    for name, o in outputs.items():
        m = getattr(net, name)
        d = (o.grad * n).numpy()  # per-sample gradients of the mean loss
        if isinstance(m, nn.Conv2d):
            a_rows, t = im2col(inputs[name], m), d.shape[2] * d.shape[3]
            d_rows, groups = d.transpose(0, 2, 3, 1).reshape(-1, d.shape[1]), m.groups
        else:
            a_rows, d_rows, t, groups = inputs[name], d, 1, 1
        grad = m.weight.grad.numpy().reshape(m.weight.shape[0], -1)
        ka, kg = a_rows.shape[1] // groups, d_rows.shape[1] // groups
        res = []
        for j in range(groups):
            a = a_rows[:, j * ka:(j + 1) * ka]
            dd = d_rows[:, j * kg:(j + 1) * kg]
            A, G = a.T @ a / len(a), dd.T @ dd / len(dd)
            if block is not None:  # keep only the diagonal blocks: an explicit block-diagonal factor
                A, G = (M * np.kron(np.eye(-(-len(M) // block)), np.ones((block, block)))[:len(M), :len(M)]
                        for M in (A, G))
            damp = np.sqrt(lam / t)
            Ai = np.linalg.inv(A + damp * np.eye(len(A)))
            Gi = np.linalg.inv(G + damp * np.eye(len(G)))
            res.append(Gi @ grad[j * kg:(j + 1) * kg] @ Ai / t)
        out[name] = np.concatenate(res).reshape(m.weight.shape)
    return out


def thor_directions(model: nn.Module, x: torch.Tensor, y: torch.Tensor, **kw) -> dict[str, torch.Tensor]:
    """One THOR step with lr 1, no momentum/decay: the weight change is the preconditioned gradient."""
    net = copy.deepcopy(model)
    before = {k: v.detach().clone() for k, v in net.state_dict().items()}
    opt = THOR(net, lr=1.0, damping=LAM, momentum=0.0, **kw)
    F.cross_entropy(net(x), y).backward()
    opt.step()
    return {k: before[k] - v for k, v in net.state_dict().items()}


def make_net(padding_mode: str = "zeros", groups: int = 1) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 6, 3, stride=1, padding=1, padding_mode=padding_mode), nn.ReLU(inplace=True),
        nn.Conv2d(6, 8, 3, stride=2, padding=2, dilation=2, groups=groups), nn.Tanh(),
        nn.Conv2d(8, 6, 2, padding="same"), nn.ReLU(),
        nn.Flatten(), nn.Linear(6 * 4 * 4, 5))


def rel_err(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.mark.parametrize("split_dim", [None, 4, 5])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_refresh_step_matches_dense_reference(split_dim, dtype):
    net = make_net().to(dtype)
    x, y = torch.randn(6, 3, 8, 8, dtype=dtype), torch.randint(0, 5, (6,))
    ref = reference_directions(net, x, y, LAM, split_dim)
    got = thor_directions(net, x, y, split_dim=split_dim)
    tol = 1e-10 if dtype == torch.float64 else 5e-6  # fp32 measures ~1e-7
    for name in ("0", "2", "4", "7"):
        assert rel_err(got[f"{name}.weight"], ref[name]) < tol, name
    # biases get the plain gradient
    net2 = copy.deepcopy(net)
    F.cross_entropy(net2(x), y).backward()
    torch.testing.assert_close(got["7.bias"], net2[7].bias.grad)


@pytest.mark.parametrize("padding_mode,groups", [("reflect", 1), ("zeros", 2), ("circular", 2)])
def test_padding_modes_and_grouped_conv_blocks(padding_mode, groups):
    net = make_net(padding_mode, groups).double()
    x, y = torch.randn(4, 3, 8, 8, dtype=torch.float64), torch.randint(0, 5, (4,))
    for split_dim in (None, 3):
        ref = reference_directions(net, x, y, LAM, split_dim)
        got = thor_directions(net, x, y, split_dim=split_dim)
        for name in ("0", "2", "4", "7"):
            assert rel_err(got[f"{name}.weight"], ref[name]) < 1e-10, (name, split_dim)


def test_single_sample_linear_kfac_is_exact_fisher_and_natural_gradient():
    torch.manual_seed(1)
    lin = nn.Linear(5, 3, bias=False).double()
    x, y = torch.randn(1, 5, dtype=torch.float64), torch.tensor([2])
    net = copy.deepcopy(lin)
    opt = THOR(net, lr=1.0, damping=LAM, momentum=0.0, split_dim=None)
    F.cross_entropy(net(x), y).backward()
    grad = net.weight.grad.clone()
    w0 = net.weight.detach().clone()
    opt.step()
    layer = opt.layers[""]
    A, G = layer.A[0, 0].numpy(), layer.G[0, 0].numpy()  # split_dim=None: one block
    v = grad.numpy().reshape(-1)  # row-major vec(dW) pairs with kron(G, A)
    np.testing.assert_allclose(np.kron(G, A), np.outer(v, v), rtol=1e-12, atol=1e-14)
    s = np.sqrt(LAM)
    nat = np.linalg.solve(np.kron(G + s * np.eye(3), A + s * np.eye(5)), v)
    np.testing.assert_allclose((w0 - net.weight.detach()).numpy().reshape(-1), nat, rtol=1e-10, atol=1e-12)


def test_cholesky_failure_retries_with_larger_damping():
    # eigenvalues 1 and -5e-4 (a factor made indefinite by rounding): damping 1e-6 fails, 1e-5 fails,
    # 1e-4 fails, 1e-3 succeeds -> 3 retries, result = inverse with damping 1e-3, not NaN
    f = torch.diag(torch.tensor([1.0, -5e-4], dtype=torch.float64))[None, None]
    inv, retries = damped_inverse(f, 2, 1e-6, 1.0)
    assert retries == 3
    np.testing.assert_allclose(inv[0, 0].numpy(), np.linalg.inv(f[0, 0].numpy() + 1e-3 * np.eye(2)), rtol=1e-12)
    with pytest.raises(torch.linalg.LinAlgError):
        damped_inverse(f, 2, 1e-6, 1.0, max_retries=2)


def test_thor_counts_damping_retries_and_keeps_previous_inverse_on_failure():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 3))
    opt = THOR(net, lr=0.1, damping=1e-8, momentum=0.0, frequency=1)
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    F.cross_entropy(net(x), y).backward()
    opt.step()
    first = opt.layers["0"].A_inv.clone()
    capture = opt.layers["0"].capture
    real = capture.consume

    def indefinite():  # pretend rounding made A indefinite beyond what the retries can fix
        a, g, t = real()
        return a - 10 * torch.eye(4), g, t

    capture.consume = indefinite
    opt.zero_grad()
    F.cross_entropy(net(x), y).backward()
    opt.step()
    assert opt.counters["inverse_failures"] == 1
    assert torch.equal(opt.layers["0"].A_inv, first)
    assert all(torch.isfinite(p).all() for p in net.parameters())


def test_inversions_batched_across_factors_equal_each_alone_and_a_failure_stays_its_own():
    # factors of two block sizes and different dampings/scales, padded and not; one indefinite beyond the retries
    g = torch.Generator().manual_seed(3)

    def spd(*shape):
        x = torch.randn(*shape[:-1], 2 * shape[-1], generator=g, dtype=torch.float64)
        return x @ x.transpose(-1, -2) / shape[-1]

    factors = [(spd(1, 2, 4, 4), 7, 1e-3, 0.5), (spd(2, 1, 4, 4), 4, 1e-1, 1.0), (spd(1, 3, 6, 6), 16, 1e-2, 2.0)]
    bad = torch.diag(torch.tensor([1.0, -5.0, 1.0, 1.0], dtype=torch.float64))[None, None]
    together = damped_inverses([*factors, (bad, 4, 1e-6, 1.0)])
    assert together[-1] is None  # the indefinite one fails alone
    for (blocks, n, d, s), got in zip(factors, together):
        inv, retries = got
        alone, _ = damped_inverse(blocks, n, d, s)
        assert torch.equal(inv, alone) and retries == 0
        dense = blocks.clone()  # float64 reference: scale * (block + d I)^-1, padding as identity
        nb, b = blocks.shape[1], blocks.shape[2]
        pad = nb * b - n
        if pad:
            dense[:, -1, b - pad:, b - pad:] += torch.eye(pad, dtype=torch.float64)
        want = s * torch.linalg.inv(dense + d * torch.eye(b, dtype=torch.float64))
        torch.testing.assert_close(inv, want, rtol=1e-10, atol=1e-12)
