"""THOR beyond MindSpore: running-average factors, separate factor/inverse intervals, the paper's
trace-based refresh with a growing interval, and exact resume from a state dict."""

import copy
import io

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from torchboost.errors import CheckpointError
from torchboost.optim.thor import THOR
from thor_nets import batch, mlp, train_step

LAM = 0.1


def factors(net: nn.Sequential, x, y) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Independent K-FAC factors of each Linear of a copy of `net` (A = x'x/n, G = n^2 g'g/n)."""
    net = copy.deepcopy(net)
    h, acts, outs = x, {}, {}
    for i, m in enumerate(net):
        if isinstance(m, nn.Linear):
            acts[str(i)] = h.detach().numpy()
            h = m(h)
            h.retain_grad()
            outs[str(i)] = h
        else:
            h = m(h)
    F.cross_entropy(h, y).backward()
    n = len(x)
    return {k: (acts[k].T @ acts[k] / n, (o.grad * n).numpy().T @ (o.grad * n).numpy() / n) for k, o in outs.items()}


def test_factor_decay_with_separate_factor_and_inverse_intervals():
    net = mlp()
    decay = 0.7
    opt = THOR(net, lr=0.05, damping=LAM, factor_interval=1, inv_interval=3, factor_decay=decay, split_dim=None)
    avg, inverses = {}, []
    for k in range(4):
        fresh = factors(net, *batch(k))
        avg = fresh if not avg else {n: tuple(decay * o + (1 - decay) * f for o, f in zip(avg[n], fresh[n]))
                                     for n in fresh}
        train_step(net, opt, *batch(k))
        for n, (A, G) in avg.items():
            np.testing.assert_allclose(opt.layers[n].A[0, 0].numpy(), A, rtol=1e-10, atol=1e-13)
            np.testing.assert_allclose(opt.layers[n].G[0, 0].numpy(), G, rtol=1e-10, atol=1e-13)
        inverses.append(opt.layers["0"].A_inv)
        if k in (0, 3):  # inverse steps: inverse of the running average
            A = avg["0"][0]
            np.testing.assert_allclose(opt.layers["0"].A_inv[0, 0].numpy(),
                                       np.linalg.inv(A + np.sqrt(LAM) * np.eye(6)), rtol=1e-9)
    assert inverses[0] is inverses[1] is inverses[2] and inverses[3] is not inverses[2]


def test_trace_based_refresh_skips_layers_whose_trace_barely_moved():
    net = mlp()
    thr = 0.05
    opt = THOR(net, lr=0.05, damping=LAM, frequency=1, trace_threshold=thr)
    ref_trace, expected_skips = {}, {"0": 0, "2": 0}
    for k in range(8):
        fresh = factors(net, *batch(k % 2, n=10 + k))
        train_step(net, opt, *batch(k % 2, n=10 + k))
        for n, (A, G) in fresh.items():
            t = np.trace(A) * np.trace(G)
            if n in ref_trace and abs(t - ref_trace[n]) <= thr * abs(ref_trace[n]):
                expected_skips[n] += 1
            else:
                ref_trace[n] = t
    assert 0 < sum(expected_skips.values()) < 16  # the data makes both outcomes happen
    assert {n: opt.layers[n].skipped for n in expected_skips} == expected_skips
    assert opt.counters["skipped_refreshes"] == sum(expected_skips.values())
    assert opt.counters["refreshes"] == 16 - sum(expected_skips.values())


def test_growing_interval_after_skips_and_no_capture_in_between():
    net = mlp()
    opt = THOR(net, lr=0.05, damping=LAM, frequency=1, trace_threshold=1e9, interval_growth=2, max_interval_mult=4)
    first = opt.layers["0"].A_inv
    captured = []
    for k in range(12):
        captured.append(opt.layers["0"].capture.enabled)
        train_step(net, opt, *batch(k))
        if k == 0:
            first = opt.layers["0"].A_inv
    # refresh at 0, skips at 1 (interval -> 2), 3 (-> 4), 7 (capped at 4), 11
    assert [k for k, c in enumerate(captured) if c] == [0, 1, 3, 7, 11]
    assert opt.layers["0"].skipped == 4 and opt.counters["skipped_refreshes"] == 8
    assert opt.layers["0"].A_inv is first


@pytest.mark.parametrize("split_dim,method", [(None, "cholesky"), (3, "eigen")])
def test_state_dict_resume_is_exact(split_dim, method):
    def make():
        torch.manual_seed(0)
        net = nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(inplace=True),
                            nn.Flatten(), nn.Linear(4 * 25, 3))
        lr = np.linspace(0.2, 0.05, 7).astype(np.float32)
        opt = THOR(net, lr=lr, damping=lambda k: 0.2 * 0.9 ** k, weight_decay=1e-3, frequency=2,
                   factor_decay=0.5, factor_interval=1, trace_threshold=0.01, interval_growth=2,
                   split_dim=split_dim, inverse_method=method)
        return net, opt

    def data(k):
        g = torch.Generator().manual_seed(k)
        return torch.randn(6, 2, 5, 5, generator=g), torch.randint(0, 3, (6,), generator=g)

    full_net, full_opt = make()
    for k in range(7):
        train_step(full_net, full_opt, *data(k))

    net, opt = make()
    for k in range(3):
        train_step(net, opt, *data(k))
    buf = io.BytesIO()
    torch.save({"model": net.state_dict(), "opt": opt.state_dict()}, buf)
    buf.seek(0)
    ckpt = torch.load(buf, weights_only=True)
    net2, opt2 = make()
    net2.load_state_dict(ckpt["model"])
    opt2.load_state_dict(ckpt["opt"])
    assert opt2.update_index == 3 and opt2.counters == opt.counters
    for k in range(3, 7):
        train_step(net2, opt2, *data(k))
    for p, q in zip(net2.state_dict().values(), full_net.state_dict().values()):
        assert torch.equal(p, q)
    assert opt2.counters == full_opt.counters


def test_loading_state_saved_with_another_split_dim_is_refused():
    net = mlp()
    opt = THOR(net, lr=0.05, damping=LAM, split_dim=3)
    train_step(net, opt, *batch(0))
    other = THOR(mlp(), lr=0.05, damping=LAM, split_dim=None)
    with pytest.raises(CheckpointError, match="split_dim"):
        other.load_state_dict(opt.state_dict())
