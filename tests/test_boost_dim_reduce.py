"""dim_reduce: PCA basis against numpy's SVD, P-BFGS steps against a float64 hand computation, state,
checkpoint loading."""

import copy

import numpy as np
import pytest
import torch
from torch import nn

from torchboost.boost import DimReduce, build_dim_reduce, build_pca_basis
from torchboost.boost.options import DimReduceOptions
from torchboost.errors import CheckpointError, ConfigError


def _projector(rows: np.ndarray) -> np.ndarray:
    return rows.T @ rows


def test_pca_basis_spans_numpy_svd_subspace():
    rng = np.random.default_rng(0)
    traj = np.cumsum(rng.normal(size=(12, 40)), axis=0)  # a random-walk "trajectory"
    basis = build_pca_basis([torch.tensor(w, dtype=torch.float32) for w in traj], 5).double().numpy()
    centred = traj - traj.mean(axis=0)
    ref = np.linalg.svd(centred, full_matrices=False)[2][:5]
    np.testing.assert_allclose(basis @ basis.T, np.eye(5), atol=1e-5)
    np.testing.assert_allclose(_projector(basis), _projector(ref), atol=1e-5)


def test_pca_from_checkpoint_files(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    names = [n for n, _ in model.named_parameters()]
    flats = []
    for i in range(6):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p))
        state = {k: v.clone() for k, v in model.state_dict().items()}
        # the lead's checkpoint format for some files, a plain state dict for others
        torch.save({"model": state, "epoch": i} if i % 2 else state, tmp_path / f"run-{i}_1.pt")
        flats.append(torch.cat([state[n].reshape(-1) for n in names]))
    opts = DimReduceOptions(n_components=3, weight_load_dir=str(tmp_path), pca_mat_path=str(tmp_path / "P.npy"))
    opt = build_dim_reduce(model, opts)
    ref = build_pca_basis(flats, 3)
    torch.testing.assert_close(opt.pca_mat, ref)
    assert (tmp_path / "P.npy").is_file()  # cached; the next build loads it
    torch.testing.assert_close(build_dim_reduce(model, opts).pca_mat, ref)


def test_pca_refusals(tmp_path):
    with pytest.raises(ConfigError, match="n_components \\+ 1"):
        build_pca_basis([torch.zeros(4)] * 3, 3)
    torch.save({"model": {"other.weight": torch.zeros(2)}}, tmp_path / "a.ckpt")
    with pytest.raises(CheckpointError, match="lacks"):
        build_pca_basis([tmp_path / "a.ckpt"] * 3, 1, names=["fc.weight"])
    (tmp_path / "b.ckpt").write_bytes(b"not a torch file")
    with pytest.raises(CheckpointError, match="not a torch file"):
        build_pca_basis([tmp_path / "b.ckpt"] * 3, 1, names=["fc.weight"])
    with pytest.raises(CheckpointError, match="basis has shape"):
        DimReduce([nn.Parameter(torch.zeros(5))], torch.zeros(2, 4))


class Quadratic(nn.Module):
    """loss(w) = 0.5 (w - c)^T A (w - c), float64."""

    def __init__(self, a: np.ndarray, c: np.ndarray, w0: np.ndarray) -> None:
        super().__init__()
        self.a, self.c = torch.tensor(a), torch.tensor(c)
        self.w = nn.Parameter(torch.tensor(w0))

    def forward(self) -> torch.Tensor:
        r = self.w - self.c
        return 0.5 * r @ self.a @ r


def _hand_pbfgs(a, c, w, p, steps, rho=0.55, gamma=0.9, alpha=0.001, sigma=0.4):
    """The DLDR P-BFGS update, written out in numpy float64."""
    loss = lambda v: 0.5 * (v - c) @ a @ (v - c)  # noqa: E731
    k = p.shape[0]
    b, s, g_prev, mom = np.eye(k), None, None, np.zeros_like(w)
    ts, bs = [], []
    for _ in range(steps):
        g = a @ (w - c)
        gk = p @ g
        if s is not None:
            y = gk - g_prev
            if y @ s > 1e-20:
                r = 1.0 / (y @ s)
                b = (np.eye(k) - r * np.outer(s, y)) @ b @ (np.eye(k) - r * np.outer(y, s)) + r * np.outer(s, s)
        d = -b @ gk
        t = 0.0  # no accepted length: stay, and restart BFGS from the identity
        for m in range(3):
            if loss(w + rho ** m * p.T @ d) < loss(w) + sigma * rho ** m * gk @ d:
                t = rho ** m
                break
        if t == 0.0:
            b = np.eye(k)
        mom = gamma * mom + (g - p.T @ gk)
        w = w - alpha * mom + t * p.T @ d
        s, g_prev = t * d, gk
        ts.append(t)
        bs.append(b)
    return w, ts, bs


def _problem():
    rng = np.random.default_rng(1)
    q = np.linalg.qr(rng.normal(size=(6, 6)))[0]
    a = q @ np.diag([6.0, 4.0, 2.5, 1.0, 0.5, 0.2]) @ q.T  # curvature > 2 somewhere: t = 1 overshoots
    p = np.linalg.qr(rng.normal(size=(6, 3)))[0].T  # 3 x 6, orthonormal rows
    return a, rng.normal(size=6), rng.normal(size=6), p


def _run(model, opt, steps):
    for _ in range(steps):
        opt.zero_grad()
        model().backward()
        opt.step(lambda: model().detach())


def test_pbfgs_steps_match_float64_hand_computation():
    a, c, w0, p = _problem()
    model = Quadratic(a, c, w0)
    opt = DimReduce(model.parameters(), torch.tensor(p))
    w_ref, ts, bs = _hand_pbfgs(a, c, w0, p, steps=4)
    assert min(ts) < 1.0  # the backtracking path was exercised
    _run(model, opt, 4)
    np.testing.assert_allclose(model.w.detach().numpy(), w_ref, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(opt.bfgs["B"].numpy(), bs[-1], rtol=1e-10, atol=1e-12)
    assert not np.allclose(bs[-1], np.eye(3))  # B was updated


def test_state_dict_resume_is_exact():
    a, c, w0, p = _problem()
    model = Quadratic(a, c, w0)
    opt = DimReduce(model.parameters(), torch.tensor(p))
    _run(model, opt, 2)
    saved_w, saved_state = model.w.detach().clone(), copy.deepcopy(opt.state_dict())  # as torch.save would
    _run(model, opt, 2)
    resumed = Quadratic(a, c, w0)
    with torch.no_grad():
        resumed.w.copy_(saved_w)
    opt2 = DimReduce(resumed.parameters(), torch.tensor(p))
    opt2.load_state_dict(saved_state)
    _run(resumed, opt2, 2)
    torch.testing.assert_close(resumed.w, model.w, rtol=0, atol=0)


def test_line_search_forwards_leave_bn_statistics_alone():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3), nn.Linear(3, 2))
    n = sum(p.numel() for p in model.parameters())
    basis = torch.linalg.qr(torch.randn(n, 2))[0].T
    opt = DimReduce(model.parameters(), basis, buffers=list(model.buffers()))
    x, y = torch.randn(8, 4), torch.randint(0, 2, (8,))
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    stats = [b.clone() for b in model.buffers()]  # after the training forward
    opt.step(lambda: nn.functional.cross_entropy(model(x), y))
    for b, s in zip(model.buffers(), stats):
        assert torch.equal(b, s)


def test_bfgs_update_satisfies_secant_equation():
    # The inverse-Hessian update must map the gradient change onto the step taken: B_new y = s, with s
    # and y from an independent float64 computation (the step the hand reference took, the projected
    # gradients of the exact quadratic at the two points), never read back from the optimizer.
    a, c, w0, p = _problem()
    w1, ts, _ = _hand_pbfgs(a, c, w0, p, steps=1)
    g0, g1 = p @ (a @ (w0 - c)), p @ (a @ (w1 - c))
    s_ref = ts[0] * -(g0)  # first step: B = I, d = -g_k
    y_ref = g1 - g0
    assert y_ref @ s_ref > 1e-20
    model = Quadratic(a, c, w0)
    opt = DimReduce(model.parameters(), torch.tensor(p))
    _run(model, opt, 2)  # the second step's B update uses (s, y) of the first step
    b = opt.bfgs["B"].numpy()
    np.testing.assert_allclose(b @ y_ref, s_ref, rtol=1e-9, atol=1e-12)
