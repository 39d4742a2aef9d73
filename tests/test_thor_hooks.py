"""THOR's hooks on real-world module graphs: in-place ReLU, a module called twice, modules never called or
called late, bf16 autocast, GradScaler (unscaled factors, overflow skip), fixed loss scale, accumulation."""

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from torchboost.optim.thor import THOR

LAM = 0.1


def convnet(inplace: bool = True) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(inplace=inplace),
                         nn.Conv2d(4, 4, 3, stride=2), nn.ReLU(inplace=inplace), nn.Flatten(), nn.Linear(16, 3))


def data(seed: int, n: int = 8, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 2, 5, 5, generator=g).to(dtype), torch.randint(0, 3, (n,), generator=g)


def run(net, opt, x, y, loss_mult: float = 1.0):
    opt.zero_grad()
    (F.cross_entropy(net(x), y) * loss_mult).backward()
    opt.step()


def test_inplace_relu_gives_the_same_updates_as_out_of_place():
    a, b = convnet(inplace=True), convnet(inplace=False)
    oa = THOR(a, lr=0.1, damping=LAM, frequency=2, split_dim=8)
    ob = THOR(b, lr=0.1, damping=LAM, frequency=2, split_dim=8)
    for k in range(3):
        run(a, oa, *data(k))
        run(b, ob, *data(k))
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.equal(pa, pb)
    assert oa.counters["refreshes"] == 3 * 2


class Twice(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin, self.head, self.unused = nn.Linear(5, 5), nn.Linear(5, 3), nn.Linear(3, 3)

    def forward(self, x):
        return self.head(torch.tanh(self.lin(torch.tanh(self.lin(x)))))


def test_module_called_twice_accumulates_both_calls_and_unused_module_is_left_alone():
    net = Twice().double()
    x, y = torch.randn(6, 5, dtype=torch.float64), torch.randint(0, 3, (6,))
    # reference: both calls' inputs and output gradients pooled, T = 2 positions per sample
    ref = copy.deepcopy(net)
    o1 = ref.lin(x)
    o1.retain_grad()
    h = torch.tanh(o1)
    o2 = ref.lin(h)
    o2.retain_grad()
    F.cross_entropy(ref.head(torch.tanh(o2)), y).backward()
    a = torch.cat([x, h]).detach().numpy()
    d = (torch.cat([o1.grad, o2.grad]) * 6).numpy()
    A, G, T = a.T @ a / 12, d.T @ d / 12, 2.0
    s = np.sqrt(LAM / T)
    expected = np.linalg.inv(G + s * np.eye(5)) @ ref.lin.weight.grad.numpy() @ np.linalg.inv(A + s * np.eye(5)) / T

    unused_before = net.unused.weight.detach().clone()
    w0 = net.lin.weight.detach().clone()
    opt = THOR(net, lr=1.0, damping=LAM, momentum=0.0)
    run(net, opt, x, y)
    np.testing.assert_allclose((w0 - net.lin.weight.detach()).numpy(), expected, rtol=1e-10, atol=1e-13)
    assert opt.layers["lin"].T == 2.0
    assert torch.equal(net.unused.weight, unused_before) and net.unused.weight.grad is None
    assert opt.layers["unused"].A is None and opt.layers["unused"].A_inv is None


class LateBranch(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.trunk, self.branch = nn.Linear(4, 3), nn.Linear(4, 3)
        self.use_branch = False

    def forward(self, x):
        return self.trunk(x) + (self.branch(x) if self.use_branch else 0)


def test_layer_first_run_after_a_refresh_step_gets_curvature_at_its_first_run():
    net = LateBranch()
    opt = THOR(net, lr=0.1, damping=LAM, frequency=100)
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    run(net, opt, x, y)
    assert opt.layers["trunk"].refreshes == 1 and opt.layers["branch"].refreshes == 0
    net.use_branch = True
    run(net, opt, x, y)  # the branch's refresh was postponed to its first run, not to step 100
    assert opt.layers["branch"].refreshes == 1 and opt.layers["trunk"].refreshes == 1


def test_bf16_autocast_keeps_fp32_factors_close_to_fp32_run():
    ref_net, amp_net = convnet(), convnet()
    ref_opt = THOR(ref_net, lr=0.1, damping=LAM)
    amp_opt = THOR(amp_net, lr=0.1, damping=LAM)
    x, y = data(0)
    run(ref_net, ref_opt, x, y)
    amp_opt.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = F.cross_entropy(amp_net(x), y)
    loss.backward()
    amp_opt.step()
    for name in ("0", "3", "6"):
        ra, la = ref_opt.layers[name], amp_opt.layers[name]
        for f_ref, f_amp in ((ra.A, la.A), (ra.G, la.G), (ra.A_inv, la.A_inv)):
            assert f_amp.dtype == torch.float32 and torch.isfinite(f_amp).all()
            assert (f_amp - f_ref).norm() / f_ref.norm() < 0.05
    assert all(torch.isfinite(p).all() for p in amp_net.parameters())


def test_grad_scaler_unscales_factors_and_overflow_skips_the_step():
    ref_net, net = convnet(), convnet()
    ref_opt = THOR(ref_net, lr=0.1, damping=LAM, frequency=1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 12)
    opt = THOR(net, lr=0.1, damping=LAM, frequency=1, grad_scaler=scaler)

    def scaled_step(x, y, poison: bool = False):
        opt.zero_grad()
        loss = F.cross_entropy(net(x), y) * (float("inf") if poison else 1.0)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()

    x, y = data(0)
    run(ref_net, ref_opt, x, y)
    scaled_step(x, y)
    for name in ("0", "3", "6"):
        torch.testing.assert_close(opt.layers[name].G, ref_opt.layers[name].G, rtol=1e-5, atol=1e-7)
    for p, q in zip(net.parameters(), ref_net.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-7)

    before = [p.detach().clone() for p in net.parameters()]
    inv_before = opt.layers["0"].A_inv
    scaled_step(*data(1), poison=True)  # inf loss: GradScaler skips opt.step()
    assert opt.update_index == 1 and scaler.get_scale() == 2.0 ** 11
    assert all(torch.equal(p, b) for p, b in zip(net.parameters(), before))
    scaled_step(*data(2))  # the poisoned statistics are dropped, curvature kept, refresh retried
    assert opt.counters["capture_failures"] == 3 and opt.layers["0"].A_inv is inv_before
    assert all(torch.isfinite(p).all() for p in net.parameters())
    scaled_step(*data(3))
    assert opt.layers["0"].refreshes == 2 and opt.update_index == 3


def test_fixed_loss_scale_and_gradient_accumulation_are_undone():
    ref_net, ls_net, acc_net = convnet(), convnet(), convnet()
    ref_opt = THOR(ref_net, lr=0.1, damping=LAM)
    ls_opt = THOR(ls_net, lr=0.1, damping=LAM, loss_scale=128.0)
    acc_opt = THOR(acc_net, lr=0.1, damping=LAM, accumulation_steps=2)
    x, y = data(0, n=8)
    run(ref_net, ref_opt, x, y)
    run(ls_net, ls_opt, x, y, loss_mult=128.0)
    acc_net.eval()  # BN batch statistics would differ between one batch and two halves
    ref_net2 = convnet().eval()
    ref2_opt = THOR(ref_net2, lr=0.1, damping=LAM)
    run(ref_net2, ref2_opt, x, y)
    for half in (slice(0, 4), slice(4, 8)):
        (F.cross_entropy(acc_net(x[half]), y[half]) / 2).backward()
    acc_opt.step()
    for p, q in zip(ls_net.parameters(), ref_net.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-7)
    for p, q in zip(acc_net.parameters(), ref_net2.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("groups", [1, 3])
def test_deepcopied_model_does_not_feed_the_optimizer(groups):
    net = nn.Sequential(nn.Conv2d(3, 6, 3, groups=groups), nn.Flatten(), nn.Linear(6 * 9, 2))
    opt = THOR(net, lr=0.1, damping=LAM)
    twin = copy.deepcopy(net)  # e.g. an EMA copy: runs with gradients must not reach opt's statistics
    F.cross_entropy(twin(torch.randn(4, 3, 5, 5)), torch.randint(0, 2, (4,))).backward()
    assert opt.layers["0"].capture.a_sum is None


def test_scaled_half_gram_matches_float64_on_features_of_any_scale():
    """The CUDA factor products (fp16 inputs scaled per feature, fp32 accumulation; emulated here) against a
    float64 Gram: every entry within fp16 rounding of its correlation scale, and each block stays PSD, also
    for features 1e-7 and 1e4 in size that unscaled fp16 would flush to zero or overflow."""
    from torchboost.optim.thor.factors import gram, scaled_half_gram

    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 24, 5000, generator=g) * torch.logspace(-7, 4, 24)[None, :, None]
    x[1, 5] = 0.0  # a dead feature (all-zero rows after padding look the same)
    ref = torch.bmm(x.double(), x.double().transpose(1, 2))
    got = scaled_half_gram(x)
    assert got.dtype == torch.float32
    d = ref.diagonal(dim1=1, dim2=2).clamp_min(1e-300).sqrt()
    err = (got.double() - ref).abs() / (d[:, :, None] * d[:, None, :])
    assert err.max() < 1e-4  # fp16 rounding averaged over 5,000 rows (bf16 inputs: 2e-4, unscaled fp16: 3e-2)
    assert (got[1, 5] == 0).all()
    eig = torch.linalg.eigvalsh(got.double() / (d[:, :, None] * d[:, None, :]).clamp_min(1e-300))
    assert eig.min() > -1e-3
    assert torch.equal(gram(x), torch.bmm(x, x.transpose(1, 2)))  # on the CPU: the plain fp32 product


@pytest.mark.parametrize("groups,n,b", [(1, 144, 128), (1, 9, 9), (2, 20, 8), (3, 16, 8), (1, 5, 8)])
def test_outer_blocks_are_the_diagonal_blocks_of_the_float64_gram(groups, n, b):
    """Every block (a last partial one zero-padded) against slices of the dense float64 Gram matrix."""
    from torchboost.optim.thor.factors import outer_blocks

    cols = torch.randn(groups * n, 300, generator=torch.Generator().manual_seed(n), dtype=torch.float64)
    got = outer_blocks(cols, groups, b)
    nb = -(-n // b)
    assert got.shape == (groups, nb, b, b)
    for g in range(groups):
        x = cols[g * n:(g + 1) * n]
        dense = x @ x.T
        for k in range(nb):
            lo, hi = k * b, min(n, (k + 1) * b)
            want = torch.zeros(b, b, dtype=torch.float64)
            want[: hi - lo, : hi - lo] = dense[lo:hi, lo:hi]
            torch.testing.assert_close(got[g, k], want, rtol=1e-12, atol=1e-12)
