"""Adasum on 2, 3 and 4 gloo ranks against an independent float64 reference of the recursive formula."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from torchboost.boost.adasum import AdasumHook
from torchboost.distributed import adasum_combine, adasum_reduce, hierarchical_groups
from torchboost.distributed import init_distributed, launch

pytestmark = pytest.mark.dist

# an empty tensor, a scalar-like one, one longer than the float64 cast chunk (65,536), and a tiny one
SHAPES = [(3, 4), (5,), (0,), (1,), (2, 3, 2), (70001,), (4,)]


def _inputs(rank: int, seed: int = 0) -> list[torch.Tensor]:
    """Rank-specific float64 deltas; the last tensor is tiny (‖·‖² < 1e-8 -> coefficient 1)."""
    g = torch.Generator().manual_seed(1000 * seed + rank)
    out = [torch.randn(s, generator=g, dtype=torch.float64) for s in SHAPES]
    out[-1] *= 1e-5
    return out


# ---- independent reference (numpy float64, whole tensors, no halving) ----
def _ref_pair(a: list[np.ndarray], b: list[np.ndarray]) -> list[np.ndarray]:
    out = []
    for x, y in zip(a, b):
        dot, nx, ny = float((x * y).sum()), float((x * x).sum()), float((y * y).sum())
        cx = 1.0 if nx < 1e-8 else 1.0 - dot / (2 * nx)
        cy = 1.0 if ny < 1e-8 else 1.0 - dot / (2 * ny)
        out.append(cx * x + cy * y)
    return out


def _ref_adasum(per_rank: list[list[np.ndarray]]) -> list[np.ndarray]:
    """Extra ranks r >= P fold into r - P by Adasum, then Adasum(first half, second half) recursively."""
    n = len(per_rank)
    p = 1 << (n.bit_length() - 1)
    folded = [_ref_pair(per_rank[i], per_rank[i + p]) if i + p < n else per_rank[i] for i in range(p)]

    def rec(v: list) -> list[np.ndarray]:
        return v[0] if len(v) == 1 else _ref_pair(rec(v[: len(v) // 2]), rec(v[len(v) // 2:]))

    return rec(folded)


def _np(ts: list[torch.Tensor]) -> list[np.ndarray]:
    return [t.double().numpy() for t in ts]


# ---- the multi-process part: one launch per world size runs every case ----
def _hook_run(rank: int, world: int) -> dict:
    torch.manual_seed(rank)  # different initial weights per rank: the hook must broadcast rank 0's
    model = nn.Sequential(nn.Linear(6, 5), nn.BatchNorm1d(5), nn.ReLU(), nn.Linear(5, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    hook = AdasumHook(model)
    out: dict = {"w0": [p.detach().clone() for p in model.parameters()]}
    for step in range(3):
        x = torch.randn(8, 6, generator=torch.Generator().manual_seed(100 * step + rank))
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), torch.arange(8) % 3).backward()
        if step == 2 and rank == world - 1:
            model[0].weight.grad[0, 0] = float("inf")  # one rank's update goes non-finite
        before = [p.detach().clone() for p in model.parameters()]
        local_bufs = [b.clone() for b in model[1].buffers() if b.is_floating_point()]
        hook.before_optimizer(model)
        opt.step()
        out[f"delta{step}"] = [p.detach() - b for p, b in zip(model.parameters(), before)]
        hook.after_optimizer(model)
        out[f"before{step}"] = before
        out[f"after{step}"] = [p.detach().clone() for p in model.parameters()]
        out[f"local_bufs{step}"] = local_bufs
        out[f"bufs{step}"] = [b.clone() for b in model[1].buffers() if b.is_floating_point()]
    out["skipped"] = hook.skipped_steps
    torch.manual_seed(10 + rank)  # the boost builder's form, AdasumHook(): rank 0's weights at the first update
    lazy = nn.Linear(3, 2)
    lazy_hook, lazy_opt = AdasumHook(), torch.optim.SGD(lazy.parameters(), lr=0.1)
    lazy(torch.randn(4, 3)).sum().backward()
    lazy_hook.before_optimizer(lazy)
    lazy_opt.step()
    lazy_hook.after_optimizer(lazy)
    out["lazy"] = [p.detach().clone() for p in lazy.parameters()]
    return out


def _worker(world: int) -> dict:
    info = init_distributed(timeout_s=60)
    r = info.rank
    x = _inputs(r)
    res: dict = {"f64": adasum_reduce(x), "f32": adasum_reduce([t.float() for t in x]),
                 "bf16": adasum_reduce([t.bfloat16() for t in x]),
                 "tiny": adasum_reduce([torch.tensor([float(r + 1)], dtype=torch.float64)])}
    onehot = torch.zeros(world, 3, dtype=torch.float64)
    onehot[r] = torch.tensor([1.0, -2.0, 0.5]) * (r + 1)
    res["ortho"] = adasum_reduce([onehot])
    v = torch.tensor([0.3, -1.0, 2.0, 0.7], dtype=torch.float64)
    res["parallel"] = adasum_reduce([v * (r + 1)])
    bad = [t.clone() for t in x]
    if r == world - 1:
        bad[1][2] = float("nan")
    res["bad_out"], res["bad_finite"] = adasum_combine(bad)
    if world == 4:
        node, cross = hierarchical_groups(local_world_size=2)
        res["hier"], _ = adasum_combine(x, cross, node_group=node)
    res["hook"] = _hook_run(r, world)
    return res


@pytest.fixture(scope="module", params=[2, 3, 4], ids=lambda w: f"{w}ranks")
def run(request: pytest.FixtureRequest) -> tuple[int, list[dict]]:
    world = request.param
    return world, launch(_worker, world, world, timeout_s=180)


def _assert_same_everywhere(outs: list[list[torch.Tensor]]) -> None:
    for other in outs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(outs[0], other))


@pytest.mark.slow
def test_matches_float64_reference(run: tuple[int, list[dict]]) -> None:
    world, res = run
    # float32 buffers: one rounding per level of terms up to ~5 in size, so ~1e-6 absolute near cancellation
    for key, cast, rtol, atol in [("f64", torch.float64, 1e-12, 1e-14), ("f32", torch.float32, 2e-6, 1e-6),
                                  ("bf16", torch.bfloat16, 1e-2, 1e-2)]:
        ref = _ref_adasum([_np([t.to(cast) for t in _inputs(r)]) for r in range(world)])
        _assert_same_everywhere([o[key] for o in res])
        for got, want in zip(res[0][key], ref):
            assert got.dtype == cast
            np.testing.assert_allclose(got.double().numpy(), want, rtol=rtol, atol=atol)
    tiny_ref = _ref_adasum([[np.array([r + 1.0])] for r in range(world)])
    np.testing.assert_allclose(res[0]["tiny"][0].numpy(), tiny_ref[0], rtol=1e-12)


def test_orthogonal_sum_and_parallel_average(run: tuple[int, list[dict]]) -> None:
    world, res = run
    ortho_sum = sum(np.eye(world)[r][:, None] * np.array([1.0, -2.0, 0.5]) * (r + 1) for r in range(world))
    np.testing.assert_allclose(res[0]["ortho"][0].numpy(), ortho_sum, rtol=1e-12)
    v = np.array([0.3, -1.0, 2.0, 0.7])
    # A(a·v, b·v) = (a+b)/2 · v: a power-of-two count gives the plain mean; 3 ranks give the
    # definition's weighting ((1+3)/2 + 2) / 2 (rank 2 folds into rank 0 first).
    scale = {2: 1.5, 4: 2.5, 3: 2.0}[world]
    np.testing.assert_allclose(res[0]["parallel"][0].numpy(), scale * v, rtol=1e-12)
    _assert_same_everywhere([o["ortho"] for o in res])


def test_non_finite_seen_by_every_rank(run: tuple[int, list[dict]]) -> None:
    _, res = run
    assert all(o["bad_finite"] is False for o in res)


@pytest.mark.parametrize("run", [4], indirect=True, ids=["4ranks"])  # as 2 nodes × 2 ranks
def test_hierarchical_averages_nodes_then_adasum(run: tuple[int, list[dict]]) -> None:
    _, res = run
    ins = [_np([t.float() for t in _inputs(r)]) for r in range(4)]
    nodes = [[(a + b) / 2 for a, b in zip(ins[0], ins[1])], [(a + b) / 2 for a, b in zip(ins[2], ins[3])]]
    _assert_same_everywhere([o["hier"] for o in res])
    for got, want in zip(res[0]["hier"], _ref_adasum(nodes)):
        np.testing.assert_allclose(got.double().numpy(), want, rtol=2e-6, atol=1e-6)


def test_hook_applies_adasum_of_updates(run: tuple[int, list[dict]]) -> None:
    world, res = run
    hooks = [o["hook"] for o in res]
    for h in hooks[1:]:  # rank 0's initial weights were broadcast
        assert all(torch.equal(a, b) for a, b in zip(h["w0"], hooks[0]["w0"]))
    for step in range(2):
        _assert_same_everywhere([h[f"after{step}"] for h in hooks])
        combined = _ref_adasum([_np(h[f"delta{step}"]) for h in hooks])
        for w_old, got, d in zip(hooks[0][f"before{step}"], hooks[0][f"after{step}"], combined):
            np.testing.assert_allclose(got.double().numpy(), w_old.double().numpy() + d, rtol=1e-5, atol=1e-6)
        mean_bufs = [np.mean([h[f"local_bufs{step}"][i].numpy() for h in hooks], axis=0) for i in range(2)]
        for got, want in zip(hooks[0][f"bufs{step}"], mean_bufs):
            np.testing.assert_allclose(got.numpy(), want, rtol=1e-6, atol=1e-7)
    _assert_same_everywhere([h["lazy"] for h in hooks])
    for h in hooks:  # step 2 had an inf on the last rank: undone everywhere and counted
        assert h["skipped"] == 1
        assert all(torch.equal(a, b) for a, b in zip(h["after2"], h["before2"]))
