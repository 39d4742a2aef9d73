"""Eigenvalue-corrected THOR (`optim/thor/eigen.py`) against an independent float64 dense implementation.

The reference forms the full block-diagonal A and G (scipy's block_diag of the kept diagonal blocks), their
full eigendecompositions, the Kronecker eigenbasis (np.kron), the rotated gradient as a vector, the running
second moment over several updates with different gradients, and the preconditioned gradient; none of
eigen.py's block layout, padding or batched matmuls.
"""

import copy
import io
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy.linalg import block_diag
from torch import nn

from thor_nets import batch, linear_stats, mlp, train_step
from torchboost.errors import CheckpointError, ConfigError
from torchboost.optim.registry import OptimizerArgs, build_optimizer
from torchboost.optim.thor import THOR, ThorOptions, ThorPreconditioner
from torchboost.optim.thor.args import EKFAC_DECAY
from torchboost.optim.thor.eigen import EigenState, block_eigh, rotate, unrotate
from torchboost.optim.thor.inverse import block_shape, block_size, damped_inverse, precondition

DAMPING, BETA, SCALE = 0.05, 0.8, 3.0


def random_factor(rng: np.random.Generator, n: int) -> np.ndarray:
    """A generic SPD factor, as a capture builds one: the mean outer product of 3n random columns."""
    x = rng.standard_normal((n, 3 * n)) * rng.uniform(0.2, 2.0, (n, 1))
    return x @ x.T / x.shape[1]


def kept_blocks(m: np.ndarray, b: int) -> list[np.ndarray]:
    """The diagonal b x b blocks THOR keeps of m (the last one smaller when b does not divide n)."""
    return [m[i:i + b, i:i + b] for i in range(0, len(m), b)]


def to_block_tensor(dense: list[np.ndarray], b: int) -> torch.Tensor:
    """(groups, n_blocks, b, b) zero-padded block stack of each group's dense factor (the capture's layout)."""
    n = len(dense[0])
    out = torch.zeros(block_shape(len(dense), n, b), dtype=torch.float64)
    for j, m in enumerate(dense):
        for k, blk in enumerate(kept_blocks(m, b)):
            out[j, k, :len(blk), :len(blk)] = torch.from_numpy(blk)
    return out


def layer_case(kind: str, split_dim: int | None, a_block: int | None = None):
    """(groups, n_in, n_out, T, a block, g block, weight shape) of a Linear or a grouped Conv2d; `a_block`
    overrides A's block size (1: A kept as its diagonal)."""
    if kind == "linear":
        w, groups, t = nn.Linear(20, 7).weight, 1, 1.0
    else:  # 4 -> 24 channels in 2 groups, 3x3: each group 18 inputs, 12 outputs; T = 9 positions
        w, groups, t = nn.Conv2d(4, 24, 3, groups=2).weight, 2, 9.0
    n_in, n_out = w[0].numel(), w.shape[0] // groups
    a_block = block_size(n_in, split_dim) if a_block is None else a_block
    return groups, n_in, n_out, t, a_block, block_size(n_out, split_dim), w.shape


def dense_ekfac(a_bd, g_bd, t, grads, damping, beta, scale, root: int = 1):
    """Preconditioned gradients of successive updates, one group, as vectors over the full Kronecker
    eigenbasis (row-major vec: vec(Q_G^T W Q_A) = kron(Q_G, Q_A)^T vec(W)), divided by (s + damping)^(1/root)
    (root 2: Adam's root of the second moment)."""
    la, qa = np.linalg.eigh(a_bd)
    lg, qg = np.linalg.eigh(g_bd)
    q = np.kron(qg, qa)
    s = t * np.kron(np.clip(lg, 0, None), np.clip(la, 0, None))
    out = []
    for k, w in enumerate(grads):
        r = q.T @ w.reshape(-1)
        if k:
            s = beta * s + (1 - beta) * scale * r ** 2
        out.append((q @ (r / (s + damping) ** (1 / root))).reshape(w.shape))
    return out


def case_data(kind, split_dim, a_block=None, steps=4, seed=0):
    rng = np.random.default_rng(seed)
    groups, n_in, n_out, t, ba, bg, wshape = layer_case(kind, split_dim, a_block)
    a = [random_factor(rng, n_in) for _ in range(groups)]
    g = [random_factor(rng, n_out) for _ in range(groups)]
    grads = [rng.standard_normal(wshape) for _ in range(steps)]
    return groups, n_in, n_out, t, ba, bg, a, g, grads


def blockwise(a, g, ba, bg, n_in, n_out, t, groups, grads, damping, beta, scale):
    state = EigenState.from_factors(to_block_tensor(a, ba), to_block_tensor(g, bg), t, n_in, n_out)
    out = []
    for w in grads:
        wt = torch.from_numpy(w).reshape(groups, n_out, n_in)
        out.append(state.precondition(wt, damping, beta, scale).reshape(w.shape).numpy())
    return out


CASES = [("linear", 6, None), ("linear", None, None), ("linear", 4, None), ("conv", 8, None), ("conv", None, None),
         ("conv", 5, None), ("conv", 8, 1)]  # split_dim 6/4/8/5: padded blocks; A in blocks of 1: its diagonal


@pytest.mark.parametrize("kind,split_dim,a_block", CASES)
def test_matches_dense_kronecker_eigenbasis(kind, split_dim, a_block):
    groups, n_in, n_out, t, ba, bg, a, g, grads = case_data(kind, split_dim, a_block)
    if split_dim is not None and a_block is None:
        assert n_in % ba or n_out % bg  # the padding case is exercised
    got = blockwise(a, g, ba, bg, n_in, n_out, t, groups, grads, DAMPING, BETA, SCALE)
    for j in range(groups):
        a_bd = block_diag(*kept_blocks(a[j], ba))
        g_bd = block_diag(*kept_blocks(g[j], bg))
        rows = slice(j * n_out, (j + 1) * n_out)
        want = dense_ekfac(a_bd, g_bd, t, [w.reshape(-1, n_in)[rows] for w in grads], DAMPING, BETA, SCALE)
        for k, (gk, wk) in enumerate(zip(got, want)):
            np.testing.assert_allclose(gk.reshape(-1, n_in)[rows], wk, rtol=1e-9, atol=1e-10, err_msg=f"update {k}")


@pytest.mark.parametrize("kind,split_dim", [("linear", 6), ("linear", None), ("conv", 8), ("conv", None)])
def test_beta_one_is_tikhonov_damped_kronecker(kind, split_dim):
    """beta = 1: every update is (T * G (x) A + damping * I)^-1 vec(W), solved densely (no eigenbasis)."""
    groups, n_in, n_out, t, ba, bg, a, g, grads = case_data(kind, split_dim, seed=1)
    got = blockwise(a, g, ba, bg, n_in, n_out, t, groups, grads, DAMPING, 1.0, SCALE)
    for j in range(groups):
        a_bd = block_diag(*kept_blocks(a[j], ba))
        g_bd = block_diag(*kept_blocks(g[j], bg))
        fisher = t * np.kron(g_bd, a_bd) + DAMPING * np.eye(n_in * n_out)
        rows = slice(j * n_out, (j + 1) * n_out)
        for gk, w in zip(got, grads):
            want = np.linalg.solve(fisher, w.reshape(-1, n_in)[rows].reshape(-1)).reshape(n_out, n_in)
            np.testing.assert_allclose(gk.reshape(-1, n_in)[rows], want, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("kind,split_dim", [("linear", 6), ("conv", 8), ("conv", None)])
def test_thor_is_the_cross_term_more(kind, split_dim):
    """THOR's (1/T)(G + dI)^-1 W (A + dI)^-1, d = sqrt(damping/T), is the eigenbasis form with denominators
    T lg la + sqrt(damping T)(lg + la) + damping: checked against THOR's own inverse code and densely."""
    groups, n_in, n_out, t, ba, bg, a, g, grads = case_data(kind, split_dim, seed=2)
    a_blocks, g_blocks = to_block_tensor(a, ba), to_block_tensor(g, bg)
    state = EigenState.from_factors(a_blocks, g_blocks, t, n_in, n_out)
    la, _ = block_eigh(a_blocks, n_in)
    lg, _ = block_eigh(g_blocks, n_out)
    state.s += math.sqrt(DAMPING * t) * (lg[:, :, None] + la[:, None, :])
    w = torch.from_numpy(grads[0]).reshape(groups, n_out, n_in)
    got = state.precondition(w, DAMPING, 1.0)
    d, sc = math.sqrt(DAMPING / t), math.sqrt(1 / t)
    a_inv, _ = damped_inverse(a_blocks, n_in, d, sc)
    g_inv, _ = damped_inverse(g_blocks, n_out, d, sc)
    torch.testing.assert_close(got, precondition(w, g_inv, a_inv), rtol=1e-9, atol=1e-10)
    for j in range(groups):
        a_bd = block_diag(*kept_blocks(a[j], ba)) + d * np.eye(n_in)
        g_bd = block_diag(*kept_blocks(g[j], bg)) + d * np.eye(n_out)
        want = np.linalg.solve(g_bd, np.linalg.solve(a_bd, w[j].numpy().T).T) / t
        np.testing.assert_allclose(got[j].numpy(), want, rtol=1e-9, atol=1e-10)


def test_padding_gets_identity_and_rotation_is_orthogonal():
    """The padded block's eigenbasis is the real part's own with identity on the padding, even where a real
    eigenvalue equals the padding's 1 (an identity factor), so nothing leaks out of or into the padding."""
    blocks = torch.zeros(1, 2, 4, 4, dtype=torch.float64)
    blocks[0, 0] = torch.eye(4, dtype=torch.float64)
    blocks[0, 1, :1, :1] = 1.0  # n = 5 in blocks of 4: 3 padding rows, real eigenvalue 1
    evals, q = block_eigh(blocks, 5)
    assert evals.shape == (1, 5)
    torch.testing.assert_close(q[0, 1, 1:, 1:], torch.eye(3, dtype=torch.float64))
    torch.testing.assert_close(q[0, 1, :1, 1:], torch.zeros(1, 3, dtype=torch.float64))
    rng = np.random.default_rng(3)
    _, n_in, n_out, t, ba, bg, a, g, _ = case_data("linear", 6)
    state = EigenState.from_factors(to_block_tensor(a, ba), to_block_tensor(g, bg), t, n_in, n_out)
    w = torch.from_numpy(rng.standard_normal((1, n_out, n_in)))
    r = rotate(w, state.Q_G, state.Q_A)
    torch.testing.assert_close(r.norm(), w.norm())
    torch.testing.assert_close(unrotate(r, state.Q_G, state.Q_A), w)


def test_first_update_after_refresh_uses_fresh_moment():
    """The first update after a refresh leaves s as the Kronecker eigenvalues; the next one folds W'^2 in."""
    groups, n_in, n_out, t, ba, bg, a, g, grads = case_data("linear", 6)
    state = EigenState.from_factors(to_block_tensor(a, ba), to_block_tensor(g, bg), t, n_in, n_out)
    s0 = state.s.clone()
    w = [torch.from_numpy(x).reshape(1, n_out, n_in) for x in grads]
    state.precondition(w[0], DAMPING, BETA, SCALE)
    assert torch.equal(state.s, s0) and not state.fresh
    state.precondition(w[1], DAMPING, BETA, SCALE)
    r = rotate(w[1], state.Q_G, state.Q_A)
    torch.testing.assert_close(state.s, BETA * s0 + (1 - BETA) * SCALE * r ** 2)


def test_state_round_trip_and_shape_check():
    groups, n_in, n_out, t, ba, bg, a, g, grads = case_data("conv", 8)
    state = EigenState.from_factors(to_block_tensor(a, ba), to_block_tensor(g, bg), t, n_in, n_out)
    w = [torch.from_numpy(x).reshape(groups, n_out, n_in) for x in grads]
    state.precondition(w[0], DAMPING, BETA, SCALE)
    saved = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in state.state().items()}
    shapes = dict(Q_A=block_shape(groups, n_in, ba), Q_G=block_shape(groups, n_out, bg),
                  s=torch.Size((groups, n_out, n_in)))
    loaded = EigenState.load(saved, shapes, torch.device("cpu"), torch.float64, "layer 'c'")
    assert torch.equal(loaded.precondition(w[1], DAMPING, BETA, SCALE), state.precondition(w[1], DAMPING, BETA, SCALE))
    bad = dict(shapes, Q_A=block_shape(groups, n_in, 6))
    with pytest.raises(CheckpointError, match="Q_A has shape"):
        EigenState.load(saved, bad, torch.device("cpu"), torch.float64, "layer 'c'")
    with pytest.raises(CheckpointError, match="keys"):
        EigenState.load({"Q_A": saved["Q_A"]}, shapes, torch.device("cpu"), torch.float64, "layer 'c'")


@pytest.mark.parametrize("kind,split_dim", [("linear", 6), ("conv", 5)])
def test_bases_from_another_rank_give_the_same_state(kind, split_dim):
    """`from_bases` (eigenvalues as the bases' Rayleigh quotients: what every rank computes under
    torch.distributed) equals `from_factors` (eigh's own eigenvalues)."""
    groups, n_in, n_out, t, ba, bg, a, g, _ = case_data(kind, split_dim)
    a_blocks, g_blocks = to_block_tensor(a, ba), to_block_tensor(g, bg)
    ref = EigenState.from_factors(a_blocks, g_blocks, t, n_in, n_out)
    got = EigenState.from_bases(ref.Q_A, ref.Q_G, a_blocks, g_blocks, t, n_in, n_out)
    torch.testing.assert_close(got.s, ref.s, rtol=1e-12, atol=1e-12)


# ---- integration: the preconditioner, THOR, the registry, checkpoints ------------------------------------------
def test_preconditioner_matches_dense_ekfac_through_the_hooks():
    """ThorPreconditioner(ekfac_decay=...) on a float64 MLP: one refresh at update 0 (factors from the hooks), then
    three updates on other batches, each compared with the dense EKFAC of the factors written out in numpy (the
    moment of the mean-loss gradient scaled by the batch's N samples: `_moment_scale`)."""
    net, n, lam, beta = mlp(), 10, 0.1, 0.8
    pre = ThorPreconditioner(net, damping=lam, frequency=100, split_dim=None, ekfac_decay=beta)
    ref = {}
    for k in range(4):
        x, y = batch(k, n)
        stats = linear_stats(net, x, y)
        net.zero_grad()
        F.cross_entropy(net(x), y).backward()
        pre.step()
        for i, a, g, w, _ in stats:
            if k == 0:
                la, qa = np.linalg.eigh(a)
                lg, qg = np.linalg.eigh(g)
                ref[i] = [np.kron(qg, qa), np.kron(np.clip(lg, 0, None), np.clip(la, 0, None))]
            q, s = ref[i]
            r = q.T @ w.reshape(-1)
            if k:
                s = ref[i][1] = beta * s + (1 - beta) * n * r ** 2
            want = (q @ (r / (s + lam))).reshape(w.shape)
            np.testing.assert_allclose(net[i].weight.grad.numpy(), want, rtol=1e-9, atol=1e-12, err_msg=f"update {k}")
    assert pre.counters["refreshes"] == 2 and all(l.A_inv is None for l in pre.layers.values())


def test_moment_scale_counts_micro_batches_and_loss_scale():
    """c = N / loss_scale^2 with N the samples of every forward with gradients since the last update."""
    net = mlp()
    pre = ThorPreconditioner(net, damping=0.1, frequency=1, split_dim=None, ekfac_decay=0.9, loss_scale=4.0,
                             accumulation_steps=2)
    with torch.no_grad():
        net(batch(9, 50)[0])  # an evaluation: not counted
    for k in range(2):
        net(batch(k, 10)[0])
    assert pre._moment_scale() == 20 / 16 and pre._samples == 0  # reset at each update


def test_no_sample_count_is_one_line():
    net = mlp()
    pre = ThorPreconditioner(net, damping=0.1, frequency=1, split_dim=None, ekfac_decay=0.9)
    x, y = batch(0)
    F.cross_entropy(net(input=x), y).backward()  # keyword input: the forward pre-hook sees no tensor
    with pytest.raises(ConfigError, match="sample count"):
        pre.step()


def _thor_run(opt, net, steps, start=0):
    for k in range(start, start + steps):
        train_step(net, opt, *batch(k))


@pytest.mark.parametrize("graft", ["none", "sgd_step"])
def test_resume_gives_the_identical_next_update(graft):
    kw = dict(lr=0.1, damping=0.1, momentum=0.9, weight_decay=1e-3, frequency=2, split_dim=4, ekfac_decay=0.9,
              graft=graft)
    net = mlp()
    opt = THOR(net, **kw)
    _thor_run(opt, net, 3)
    buf = io.BytesIO()
    torch.save(opt.state_dict(), buf)  # as a checkpoint file holds it
    buf.seek(0)
    saved = torch.load(buf, weights_only=True)
    assert any("eigen" in l for l in saved["thor"]["layers"].values()) and saved["thor"]["ekfac"]
    twin = copy.deepcopy(net)
    again = THOR(twin, **kw)
    again.load_state_dict(saved)
    _thor_run(opt, net, 2, start=3)  # update 3 plain-moment, update 4 a refresh
    _thor_run(again, twin, 2, start=3)
    for p, q in zip(net.parameters(), twin.parameters()):
        assert torch.equal(p, q)


def test_state_of_the_other_kind_or_split_is_refused():
    net = mlp()
    thor = THOR(net, lr=0.1, damping=0.1, frequency=2, split_dim=4)
    ekfac = THOR(copy.deepcopy(net), lr=0.1, damping=0.1, frequency=2, split_dim=4, ekfac_decay=0.9)
    _thor_run(thor, net, 1)
    with pytest.raises(CheckpointError, match="THOR's inverses and this optimizer uses EKFAC"):
        ekfac.load_state_dict(copy.deepcopy(thor.state_dict()))
    net2 = mlp()
    src = THOR(net2, lr=0.1, damping=0.1, frequency=2, split_dim=4, ekfac_decay=0.9)
    _thor_run(src, net2, 1)
    with pytest.raises(CheckpointError, match="EKFAC and this optimizer uses THOR's inverses"):
        thor.load_state_dict(copy.deepcopy(src.state_dict()))
    other = THOR(mlp(), lr=0.1, damping=0.1, frequency=2, split_dim=3, ekfac_decay=0.9)
    with pytest.raises(CheckpointError, match="has shape"):
        other.load_state_dict(copy.deepcopy(src.state_dict()))


def test_graft_grad_keeps_the_ekfac_direction_with_the_plain_norm():
    nets = [mlp(), mlp()]
    pres = [ThorPreconditioner(n, damping=0.1, frequency=2, split_dim=4, ekfac_decay=0.9, graft=g)
            for n, g in zip(nets, ("none", "grad"))]
    for k in range(3):
        x, y = batch(k)
        plain = []
        for net, pre in zip(nets, pres):
            net.zero_grad()
            F.cross_entropy(net(x), y).backward()
            plain.append([m.weight.grad.clone() for m in (net[0], net[2])])
            pre.step()
        for m0, m1, g in zip((nets[0][0], nets[0][2]), (nets[1][0], nets[1][2]), plain[1]):
            d = m0.weight.grad
            torch.testing.assert_close(m1.weight.grad, d * (g.norm() / d.norm()), rtol=1e-12, atol=1e-15)


def test_registry_entry_turns_ekfac_on():
    opt = build_optimizer("thor_ekfac", mlp(), OptimizerArgs(lr=0.1))
    assert opt.options.ekfac_decay == EKFAC_DECAY and opt.param_groups[0]["momentum"] == 0.9
    mine = build_optimizer("thor_ekfac", mlp(), OptimizerArgs(lr=0.1, options=ThorOptions(ekfac_decay=0.5)))
    assert mine.options.ekfac_decay == 0.5
    assert build_optimizer("thor", mlp(), OptimizerArgs(lr=0.1)).options.ekfac_decay is None
    with pytest.raises(ConfigError, match="ekfac_decay"):
        ThorPreconditioner(mlp(), ekfac_decay=1.5)


# ---- torch.distributed: every rank computes the same eigenvalues from the owner's eigenbases ----------------
def _dist_worker(rank: int, world: int, port: int, out: str) -> None:
    from test_thor_dist import OPTS, finish_rank, rank_net, train  # the THOR test's problem, with EKFAC on

    net, ddp, shard = rank_net(rank, world, port)
    opt = THOR(ddp, **OPTS, ekfac_decay=0.9)
    train(opt, ddp, shard)
    finish_rank(out, rank, {"params": net.state_dict(), "counters": opt.counters,
                            "s": {name.removeprefix("module."): l.eigen.s for name, l in opt.layers.items()}})


@pytest.mark.dist
@pytest.mark.slow
def test_two_ranks_equal_one_process_on_the_concatenated_batch(tmp_path):
    from test_thor_dist import OPTS, make_net, spawn_ranks, train

    ranks = spawn_ranks(_dist_worker, tmp_path)
    net = make_net()
    opt = THOR(net, **OPTS, ekfac_decay=0.9)
    train(opt, net)
    for r in ranks:
        for name, p in net.state_dict().items():
            torch.testing.assert_close(r["params"][name], p, rtol=1e-9, atol=1e-12)
        for name, layer in opt.layers.items():
            torch.testing.assert_close(r["s"][name], layer.eigen.s, rtol=1e-9, atol=1e-12)
    local = [r["counters"]["local_inversions"] for r in ranks]
    assert sum(local) == opt.counters["local_inversions"] and min(local) > 0
