"""Sharded loading and distributed evaluation on 3 gloo ranks (101 samples: shards of 34/34/33)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from torchboost.data import TensorImageDataset, build_loader
from torchboost.distributed import init_distributed, launch
from torchboost.train.model import Model

pytestmark = pytest.mark.dist

N, WORLD, BATCH = 101, 3, 8


def _dataset() -> TensorImageDataset:
    g = torch.Generator().manual_seed(3)
    images = torch.randint(0, 256, (N, 1, 8, 8), dtype=torch.uint8, generator=g)
    return TensorImageDataset(images, torch.randint(0, 10, (N,), generator=g), [str(c) for c in range(10)],
                              (0.5,), (0.25,))


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 10))


def _worker() -> dict:
    info = init_distributed(timeout_s=60)
    ds = _dataset()
    kw = dict(seed=5, rank=info.rank, world_size=info.world_size)
    train, evaluation = build_loader(ds, BATCH, True, **kw), build_loader(ds, BATCH, False, **kw)
    out: dict = {}
    for epoch in (0, 1):
        train.sampler.set_epoch(epoch)
        out[f"train{epoch}"] = [int(i) for i in train.sampler]
        out[f"batches{epoch}"] = sum(1 for _ in train)
    out["eval"] = [int(i) for i in evaluation.sampler]
    out["metrics"] = Model(_net(), nn.CrossEntropyLoss(), device="cpu").eval(evaluation)
    return out


@pytest.fixture(scope="module")
def ranks() -> list[dict]:
    return launch(_worker, WORLD, timeout_s=120)


def test_train_shards_are_disjoint_equal_and_reshuffled(ranks: list[dict]) -> None:
    for epoch in (0, 1):
        shards = [r[f"train{epoch}"] for r in ranks]
        assert all(len(s) == N // WORLD for s in shards)  # drop_last: every rank takes the same steps
        assert len(set().union(*map(set, shards))) == WORLD * (N // WORLD)
        assert all(r[f"batches{epoch}"] == (N // WORLD) // BATCH for r in ranks)
    assert ranks[0]["train0"] != ranks[0]["train1"]  # a new permutation each epoch


def test_eval_shards_cover_every_sample_once(ranks: list[dict]) -> None:
    seen = sorted(i for r in ranks for i in r["eval"])
    assert seen == list(range(N))  # no padding, no duplicates, uneven shard lengths allowed


def test_distributed_eval_equals_single_process(ranks: list[dict]) -> None:
    single = Model(_net(), nn.CrossEntropyLoss(), device="cpu").eval(build_loader(_dataset(), BATCH, False))
    assert single["samples"] == N
    for r in ranks:
        got = r["metrics"]
        assert got["samples"] == N
        for key in ("top_1_accuracy", "top_5_accuracy", "loss"):
            assert got[key] == pytest.approx(single[key], rel=1e-6)
