"""torchboost.distributed: DDP equivalence with one big batch, fusion buckets, faults, clean torchrun-style exit."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from ranks import finish, job_env
from torch import nn

from torchboost.distributed import (DistInfo, all_reduce_sum, any_rank, fusion_bucket_caps_mb, guard, init_distributed,
                             launch, shutdown, wrap_ddp)
from torchboost.distributed.launch import free_port
from torchboost.errors import ConfigError, DistributedError

B, STEPS = 6, 5


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(2 * B, 8, generator=g), torch.randint(0, 4, (2 * B,), generator=g)


def _train(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    for _ in range(STEPS):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()


def _ddp_worker() -> dict:
    info = init_distributed(timeout_s=60)
    x, y = _batch()
    ddp = wrap_ddp(_net(), info)
    _train(ddp, x[info.rank * B:(info.rank + 1) * B], y[info.rank * B:(info.rank + 1) * B])
    out = {"weights": [p.detach().clone() for p in ddp.parameters()],
           "any": [any_rank(info.rank == 1), any_rank(False)]}

    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    deep = nn.Sequential(*[nn.Linear(16, 16) for _ in range(6)])  # 12 parameters
    index = {id(p): i for i, p in enumerate(deep.parameters())}
    fused = wrap_ddp(deep, info, fusion_config=[3, 9])
    buckets: list[list[int]] = []

    def record(state, bucket):  # no annotations: DDP checks them, and `from __future__` makes them strings
        buckets.append(sorted(index[id(p)] for p in bucket.parameters()))
        return allreduce_hook(None, bucket)

    fused.register_comm_hook(None, record)
    for _ in range(3):  # DDP rebuilds its buckets after the first iteration
        buckets.clear()
        fused(torch.randn(4, 16)).sum().backward()
    out["buckets"] = sorted(buckets)
    return out


@pytest.mark.dist
def test_two_ranks_ddp_equal_one_process_double_batch_and_fusion_buckets() -> None:
    results = launch(_ddp_worker, 2, timeout_s=120)
    reference = _net()
    _train(reference, *_batch())
    for res in results:
        for got, want in zip(res["weights"], reference.parameters()):
            torch.testing.assert_close(got, want.detach(), rtol=1e-5, atol=1e-6)
    assert [r["any"] for r in results] == [[True, False], [True, False]]
    # MindSpore's [3, 9] = index groups [0,3) [3,9) [9,12), reproduced exactly by the per-bucket caps
    assert results[0]["buckets"] == [[0, 1, 2], [3, 4, 5, 6, 7, 8], [9, 10, 11]]


def test_fusion_caps_are_group_bytes_in_ddp_order_and_validated() -> None:
    model = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2))  # params: 12, 3, 6, 2 floats
    assert fusion_bucket_caps_mb(model, [1, 3]) == [n * 4 / 2**20 for n in (2, 9, 12)]
    for bad in ([0, 2], [2, 2], [3, 1], [4]):
        with pytest.raises(ConfigError):
            fusion_bucket_caps_mb(model, bad)


def test_single_process_and_sync_bn_refusal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RANK", raising=False)
    assert init_distributed() == DistInfo()  # not under torchrun: one process, no process group
    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2))
    assert wrap_ddp(model, DistInfo(), sync_bn=True) is model  # one process: nothing to wrap
    gloo = DistInfo(rank=0, world_size=2, backend="gloo")
    with pytest.raises(DistributedError, match="sync_bn needs CUDA"):
        wrap_ddp(model, gloo, sync_bn=True)
    assert torch.equal(all_reduce_sum(torch.ones(3)), torch.ones(3))
    collected = []
    monkeypatch.setattr("gc.collect", lambda *a: collected.append(a))
    shutdown()  # no process group: nothing to collect for (0.8 s of every single-process train)
    assert collected == []


def test_guard_translates_backend_errors_only() -> None:
    with pytest.raises(DistributedError, match="rank 0 lost its peers during backward"):
        with guard("backward"):
            raise RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:6162")
    with pytest.raises(ValueError):  # user errors pass through untouched
        with guard("backward"):
            raise ValueError("shape mismatch")


def _fault_worker(mode: str) -> float:
    info = init_distributed(timeout_s=2)
    all_reduce_sum(torch.ones(2))  # both ranks alive: works
    if info.rank == 1:
        if mode == "kill":
            os._exit(1)
        time.sleep(60)  # hang: killed by launch once rank 0 has failed
    start = time.monotonic()
    try:
        all_reduce_sum(torch.ones(2))
    except DistributedError as e:
        raise DistributedError(f"after {time.monotonic() - start:.1f} s: {e.what}") from None
    return 0.0


@pytest.mark.dist
@pytest.mark.parametrize("mode", ["kill", "hang"])
@pytest.mark.slow
def test_dead_or_hung_rank_ends_the_job_with_a_clear_error(mode: str) -> None:
    with pytest.raises(DistributedError) as err:  # launch's own 60 s limit guards against a hang of the test
        launch(_fault_worker, 2, mode, timeout_s=60)
    msg = str(err.value)
    # the event, not its timing: rank 0 (alive) names the collective its peer never joined
    assert "rank 0: torchboost.errors.DistributedError: after" in msg
    assert "rank 0 lost its peers during all_reduce" in msg
    if mode == "hang":  # the stopped rank said where it hung before it was killed
        line = next(n for n, text in enumerate(Path(__file__).read_text().splitlines(), 1) if "time.sleep(60)" in text)
        assert "ranks [1] were stopped" in msg and f"rank 1 was in _fault_worker (test_dist.py:{line})" in msg, msg


SCRIPT = textwrap.dedent("""
    import logging, sys, torch
    from torch import nn
    from torchboost import distributed as dist
    info = dist.init_distributed(timeout_s=30)
    dist.open_worklog(sys.argv[1], info.rank)
    logging.getLogger("torchboost.test").info("hello from %d of %d", info.rank, info.world_size)
    model = dist.wrap_ddp(nn.Linear(4, 2), info, bucket_cap_mb=1)
    model(torch.randn(3, 4)).sum().backward()  # leaves DDP's reducer holding gloo work
    grads = [p.grad for p in model.parameters()]  # references a careless exit would keep alive
    seed = dist.broadcast_object(1234 + info.rank)
    total = dist.all_reduce_mean(torch.tensor([float(info.rank)]))
    print(f"rank={info.rank} world={info.world_size} local_world={info.local_world_size} main={info.is_main} "
          f"seed={seed} mean={total.item()}")
    del model, grads
    dist.shutdown()
""")


@pytest.mark.dist
@pytest.mark.slow
def test_torchrun_style_processes_log_per_rank_and_exit_cleanly(tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    port = free_port()
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "2",
           "LOCAL_WORLD_SIZE": "2", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    procs = [subprocess.Popen([sys.executable, str(script), str(tmp_path / "logs")],
                              env=job_env({**env, "RANK": str(r), "LOCAL_RANK": str(r)}),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(2)]
    outs = finish(procs, 120)
    for r, (p, (out, err)) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, err
        assert "terminate called" not in err
        assert f"rank={r} world=2 local_world=2 main={r == 0} seed=1234 mean=0.5" in out
        assert f"hello from {r} of 2" in (tmp_path / "logs" / f"worklog.{r}").read_text()


def test_fork_from_a_threaded_process_is_refused_before_any_child_starts() -> None:
    """A child forked while another thread holds a lock waits on it forever: launch says so instead."""
    import threading

    stop = threading.Event()
    busy = threading.Thread(target=stop.wait)
    busy.start()
    try:
        with pytest.raises(DistributedError, match="threads: a forked child can wait forever"):
            launch(_ddp_worker, 2, start_method="fork")
    finally:
        stop.set()
        busy.join()


def _progress_bar_worker() -> str:
    from tqdm import tqdm

    for _ in tqdm(range(2), disable=True):  # tqdm.__new__ takes tqdm's lock, disabled or not
        pass
    return "made a progress bar"


@pytest.mark.dist
def test_a_launch_while_another_thread_holds_tqdms_lock_completes() -> None:
    """The stall seen once on a loaded machine: tqdm's monitor thread (alive in any process that has shown a progress
    bar, pytest's included) takes tqdm's lock every 10 s; a rank forked while it held it waited for that lock forever,
    at its first progress bar, until launch's timeout (120-180 s in the suite). Reproduced with start_method="fork"
    and the thread check bypassed: both ranks stopped "in acquire (std.py:102)". The forkserver's children inherit
    no lock of the caller's."""
    import threading

    from tqdm import tqdm

    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with tqdm.get_lock():
            held.set()
            release.wait()

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait()
    try:
        assert launch(_progress_bar_worker, 2, timeout_s=120) == ["made a progress bar"] * 2
    finally:
        release.set()
        holder.join()
