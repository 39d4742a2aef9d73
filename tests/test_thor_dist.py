"""THOR under torch.distributed (2 gloo processes on 127.0.0.1): factors averaged across ranks before
inversion, inversions split between ranks; the result equals one process on the concatenated batch."""

import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from torchboost.distributed.launch import free_port
from torchboost.optim.thor import THOR

STEPS, BATCH = 3, 8
OPTS = dict(lr=0.1, damping=0.05, weight_decay=1e-3, frequency=2, split_dim=4, split_indices=[1])


def make_net() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(2, 6, 3, padding=1), nn.ReLU(), nn.Conv2d(6, 6, 3, stride=2, groups=2),
                         nn.Tanh(), nn.Flatten(), nn.Linear(6 * 16, 5), nn.ReLU(), nn.Linear(5, 3)).double()


def data(k: int):
    g = torch.Generator().manual_seed(k)
    return torch.randn(BATCH, 2, 9, 9, generator=g, dtype=torch.float64), torch.randint(0, 3, (BATCH,), generator=g)


def train(opt: THOR, model: nn.Module, shard: slice = slice(None)) -> None:
    """STEPS updates of `opt` on `model`, each on `shard` of that update's batch."""
    for k in range(STEPS):
        x, y = data(k)
        opt.zero_grad()
        F.cross_entropy(model(x[shard]), y[shard]).backward()
        opt.step()


def rank_net(rank: int, world: int, port: int) -> tuple[nn.Module, DistributedDataParallel, slice]:
    """This rank's process group, the test's net, its DDP wrapper and the rank's share of each batch."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    net = make_net()
    return net, DistributedDataParallel(net), slice(rank * BATCH // world, (rank + 1) * BATCH // world)


def finish_rank(out: str, rank: int, result: dict) -> None:
    torch.save(result, Path(out) / f"{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


def spawn_ranks(worker, out: Path, world: int = 2) -> list[dict]:
    """Run `worker(rank, world, port, out)` in `world` spawned processes (killed if they hang); their results."""
    ctx = mp.start_processes(worker, args=(world, free_port(), str(out)), nprocs=world, join=False,
                             start_method="spawn")
    deadline = time.monotonic() + 120
    try:
        while not ctx.join(timeout=1):
            assert time.monotonic() < deadline, "distributed THOR workers hung"
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
    return [torch.load(out / f"{r}.pt", weights_only=True) for r in range(world)]


def _worker(rank: int, world: int, port: int, out: str) -> None:
    net, ddp, shard = rank_net(rank, world, port)
    opt = THOR(ddp, **OPTS)
    train(opt, ddp, shard)
    layers = {name.removeprefix("module."): (l.A, l.G, l.A_inv) for name, l in opt.layers.items()}
    finish_rank(out, rank, {"params": net.state_dict(), "layers": layers, "counters": opt.counters})




@pytest.mark.dist
@pytest.mark.slow
def test_two_ranks_equal_one_process_on_the_concatenated_batch(tmp_path):
    ranks = spawn_ranks(_worker, tmp_path)
    net = make_net()
    opt = THOR(net, **OPTS)
    train(opt, net)
    for r in ranks:
        for name, p in net.state_dict().items():
            torch.testing.assert_close(r["params"][name], p, rtol=1e-9, atol=1e-12)
        for name, layer in opt.layers.items():
            for got, ref in zip(r["layers"][name], (layer.A, layer.G, layer.A_inv)):
                torch.testing.assert_close(got, ref, rtol=1e-9, atol=1e-12)
    # every inversion was computed once, on one rank, and both ranks took a share
    local = [r["counters"]["local_inversions"] for r in ranks]
    assert sum(local) == opt.counters["local_inversions"] == 4 * 2 and min(local) > 0
