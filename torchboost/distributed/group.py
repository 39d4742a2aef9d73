"""Data-parallel plumbing over torch.distributed: init from the torchrun environment, rank helpers,
reductions, per-rank log files, error translation and a clean shutdown.

Every helper also works in a single process (no process group): reductions return their input, the
barrier is a no-op, rank 0 of 1 is main. DDP wrapping is in `ddp.py`, the in-process launcher in
`launch.py`, the Adasum reduction in `adasum.py`; the package re-exports all of them.

Launching (torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR/PORT; `env.py` checks them,
`join.py` forms the job within a short join timeout before the process group exists):
    one machine:   torchrun --nproc_per_node=4 -m torchboost train ...
    two machines:  on each, with NODE_RANK 0 on the machine at 10.0.0.1 and 1 on the other:
                   torchrun --nnodes=2 --node_rank=$NODE_RANK --nproc_per_node=8 \
                       --master_addr=10.0.0.1 --master_port=29500 -m torchboost train ...
    elastic:       torchrun --nnodes=2 --nproc_per_node=8 --rdzv-backend=c10d \
                       --rdzv-endpoint=10.0.0.1:29500 --rdzv-id=job42 --max-restarts=3 -m torchboost train ...
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import hashlib
import logging
import socket
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from torchboost.distributed.env import TorchrunEnv, read_env
from torchboost.distributed.join import cpp_logs_held, first_line, join, open_store
from torchboost.errors import DistributedError
from torchboost.fileio import check_inside, make_dirs

log = logging.getLogger("torchboost.distributed")

# Substrings of the RuntimeErrors gloo/NCCL raise when a peer dies or a collective times out; torch
# raises them as plain RuntimeError (not DistError), so they are recognised by message.
_BACKEND_MARKERS = ("gloo", "nccl", "connection closed", "timed out", "processgroup", "c10d")
MAX_TIMEOUT_S = 7 * 24 * 3600  # a week: longer is a typo, and datetime.timedelta overflows past ~1e14 s


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits in the job. `backend` is None when there is no process group."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    device: torch.device = torch.device("cpu")
    is_main: bool = True
    backend: str | None = None
    group_rank: int = 0  # torchrun's node index

    @property
    def distributed(self) -> bool:
        return self.backend is not None


_INFO = DistInfo()


def check_timeout(name: str, seconds: float) -> None:
    """A timeout c10d can hold: from a millisecond (its unit; 0 would mean no timeout at all) to a week."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 1e-3 <= seconds <= MAX_TIMEOUT_S:
        raise DistributedError(f"{name}={seconds!r} is not a number of seconds from 0.001 to {MAX_TIMEOUT_S} (a week)",
                               f"give {name} in seconds, e.g. 300")


def _joined_store(env: TorchrunEnv, timeout_s: float, join_timeout_s: float, job: Mapping[str, object]) -> dist.Store:
    """The store every rank joined through (`join.join`), its operations now bounded by the training timeout.
    Its keys carry torchrun's restart count: a restarted worker group reuses the agent's store, where the first
    group's keys (each rank's address) still sit, and without the prefix the new ranks read the dead ones'
    addresses and gloo's connect fails, so the restarted group never forms (tests/test_elastic.py)."""
    store = dist.PrefixStore(f"torchboost/attempt_{env.restart_count}", open_store(env, join_timeout_s))
    try:
        join(store, env, job, join_timeout_s)
    except DistributedError:
        raise
    except Exception as e:  # the store's host went away mid-join: torch raises DistNetworkError/DistStoreError
        raise DistributedError(f"rank {env.rank} lost the job's store while joining: {first_line(e)}",
                               "rank 0 hosts it: see its output for the first error") from None
    store.set_timeout(datetime.timedelta(seconds=timeout_s))  # later store use (NCCL's setup) is training time
    return store


def init_distributed(backend: str | None = None, timeout_s: float = 300, *, join_timeout_s: float = 60,
                     job: Mapping[str, object] | None = None) -> DistInfo:
    """Join the job described by the torchrun environment, or run as one process outside torchrun.

    The environment is checked first (`env.read_env`): a bad value is one DistributedError before anything
    connects. Then every rank must arrive within `join_timeout_s` holding the same `job` (e.g. the config and
    the checkpoint it resumes from, see `join.join`), or every rank raises the same DistributedError; only then
    does the process group form. backend None picks nccl when CUDA is available, else gloo. `timeout_s` bounds
    every collective after that: a rank that dies or hangs makes the others fail with DistributedError after at
    most that long. Calling it again returns the same DistInfo.
    """
    global _INFO
    if dist.is_available() and dist.is_initialized():
        return _INFO
    env = read_env()
    check_timeout("timeout_s", timeout_s)
    check_timeout("join_timeout_s", join_timeout_s)
    cuda = torch.cuda.is_available()
    if env is None:
        _INFO = DistInfo(device=torch.device("cuda", 0) if cuda else torch.device("cpu"))
        return _INFO
    backend = backend or ("nccl" if cuda else "gloo")
    if backend == "nccl" and not cuda:
        raise DistributedError("backend nccl needs CUDA, which this machine lacks",
                               "use backend gloo (or leave it unset) on CPU")
    if cuda and env.local_rank >= torch.cuda.device_count():
        raise DistributedError(f"LOCAL_RANK={env.local_rank} but this machine has {torch.cuda.device_count()} GPU(s)",
                               "start at most one process per GPU (--nproc-per-node)")
    device = torch.device("cuda", env.local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    with cpp_logs_held():
        store = _joined_store(env, timeout_s, join_timeout_s, job or {})
        try:
            dist.init_process_group(backend, rank=env.rank, world_size=env.world_size, store=store,
                                    timeout=datetime.timedelta(seconds=timeout_s),
                                    device_id=device if backend == "nccl" else None)
        except Exception as e:  # rendezvous failures come as several torch exception types
            raise DistributedError(f"rank {env.rank} could not join the {env.world_size}-process job: {first_line(e)}",
                                   "check MASTER_ADDR/MASTER_PORT and that every rank was started") from e
    _INFO = DistInfo(env.rank, env.world_size, env.local_rank, env.local_world_size, device, env.rank == 0, backend,
                     env.group_rank)
    log.info("rank %d/%d (local %d/%d) joined with %s on %s",
             env.rank, env.world_size, env.local_rank, env.local_world_size, backend, device)
    return _INFO


def info() -> DistInfo:
    """The DistInfo of the last `init_distributed` (single-process defaults before it)."""
    return _INFO


def is_main() -> bool:
    return get_rank() == 0


def get_rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def get_world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _active() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _is_backend_error(e: BaseException) -> bool:
    if isinstance(e, getattr(dist, "DistError", ())):
        return True
    return isinstance(e, RuntimeError) and any(m in str(e).lower() for m in _BACKEND_MARKERS)


@contextlib.contextmanager
def guard(what: str = "a collective operation") -> Iterator[None]:
    """Turn the errors gloo/NCCL raise when a peer dies or hangs into one clear DistributedError.

    Wrap the training loop with it (DDP's all-reduces run inside backward); the helpers here use it.
    """
    try:
        yield
    except Exception as e:
        if not _is_backend_error(e):
            raise
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise DistributedError(
            f"rank {get_rank()} lost its peers during {what} (a rank died, hung or timed out): {first}",
            "see the other ranks' worklog.<rank> for the cause; rerun with --resume to continue "
            "from the last checkpoint") from e


def _comm_tensor(tensor: torch.Tensor) -> torch.Tensor:
    # NCCL reduces only CUDA tensors; metric counters often live on the CPU.
    if dist.get_backend() == "nccl" and tensor.device.type != "cuda":
        return tensor.to(_INFO.device)
    return tensor


def barrier() -> None:
    if _active():
        with guard("barrier"):
            dist.barrier()


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """Sum `tensor` over all ranks, in place; returns it (unchanged in a single process)."""
    if _active():
        with guard("all_reduce"):
            comm = _comm_tensor(tensor)
            dist.all_reduce(comm)
            if comm is not tensor:
                tensor.copy_(comm)
    return tensor


def all_reduce_mean(tensor: torch.Tensor) -> torch.Tensor:
    """Average a floating `tensor` over all ranks, in place; returns it."""
    return all_reduce_sum(tensor).div_(get_world_size())


def any_rank(flag: bool) -> bool:
    """True on every rank when `flag` is True on at least one: e.g. a loss-scale overflow, which every
    rank must skip together when gradients are not averaged first (Adasum: per-rank gradients)."""
    if not _active():
        return flag
    return all_reduce_sum(torch.tensor([float(flag)])).item() > 0


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """Rank `src`'s picklable `obj` on every rank (for small trusted values: configs, paths, seeds)."""
    if not _active():
        return obj
    box = [obj]
    with guard("broadcast_object"):
        dist.broadcast_object_list(box, src=src, device=_INFO.device if dist.get_backend() == "nccl" else None)
    return box[0]


def agree(values: dict[str, object], what: str = "config") -> None:
    """Check that every rank holds the same `values` (e.g. the flattened resolved config); raise
    DistributedError on EVERY rank, naming the keys that differ, when they do not. A no-op in one process.

    Ranks exchange a sha256 of each value's repr (small whatever the values), so all of them see the same
    gathered digests and fail together: no rank goes on alone into a collective the others never join.
    """
    if not _active():
        return
    mine = {k: hashlib.sha256(repr(v).encode()).hexdigest() for k, v in values.items()}
    gathered: list[Any] = [None] * get_world_size()
    with guard(f"the {what} check"):
        dist.all_gather_object(gathered, mine)
    keys = dict.fromkeys(k for digests in gathered for k in digests)  # first-seen order, same on every rank
    differ = [k for k in keys if len({d.get(k) for d in gathered}) > 1]
    if differ:
        ranks = sorted({r for r, d in enumerate(gathered) if any(d.get(k) != gathered[0].get(k) for k in differ)})
        raise DistributedError(f"ranks disagree on {', '.join(differ)} (ranks {ranks} differ from rank 0)",
                               f"start every rank with the same {what}: the same command line, config and files")


@torch.no_grad()
def broadcast_module(module: nn.Module, src: int = 0) -> None:
    """Copy rank `src`'s parameters and buffers to every rank (DDP does this itself; Adasum needs it)."""
    if not _active():
        return
    with guard("broadcast_module"):
        for t in [*module.parameters(), *module.buffers()]:
            dist.broadcast(t.data, src=src)


def open_worklog(log_dir: str | Path, rank: int) -> logging.FileHandler:
    """Send the `torchboost` logger of this rank to `log_dir/worklog.<rank>`; returns the handler.

    Each rank writes its own file so a crash on one rank leaves its trace there (remove the handler
    from logging.getLogger("torchboost") and close it when done).
    """
    path = make_dirs(log_dir)
    handler = logging.FileHandler(check_inside(path / f"worklog.{rank}"), encoding="utf-8")
    node = f"{socket.gethostname()} node{_INFO.group_rank}"  # torchrun's node index, checked (it goes in a format)
    handler.setFormatter(logging.Formatter(f"%(asctime)s {node} rank{rank} %(levelname)s %(name)s: %(message)s"))
    logger = logging.getLogger("torchboost")
    logger.addHandler(handler)
    if logger.level == logging.NOTSET or logger.level > logging.INFO:
        logger.setLevel(logging.INFO)
    return handler


def shutdown(timeout_s: float = 60) -> None:
    """Leave the job cleanly: gc, a bounded barrier, destroy the process group (none of it without a group).

    Drop references to the DDP model and optimizer first: gloo aborts the process at exit
    ("terminate called without an active exception") when its process group dies while DDP's
    reducer still holds work on it. A barrier that fails (dead peer) is logged, not raised, so an
    error path can still call this. The collection only where there is a group: it takes ~0.8 s in a process
    that imported torch and matplotlib, a second of every single-process `train` on a small data set.
    """
    global _INFO
    if dist.is_available() and dist.is_initialized():
        gc.collect()
        try:
            work = dist.barrier(async_op=True)
            work.wait(timeout=datetime.timedelta(seconds=timeout_s))
        except Exception as e:  # a dead peer must not turn a clean exit into a crash
            log.warning("shutdown barrier failed on rank %d: %s", get_rank(), str(e).splitlines()[0])
        dist.destroy_process_group()
    _INFO = DistInfo()
